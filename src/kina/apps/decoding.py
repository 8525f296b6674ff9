"""Text in, text out: a checkpoint's model and tokenizer, and one generation in small steps.

In:  a checkpoint (kina.models.checkpoints: a Hugging Face folder or a GGUF file) and how to run
     it (dtype, weight_dtype, fma, threads, the context `max_seq_len`); then a prompt (text or
     ids, or a conversation through the chat template) and the settings of one generation
     (max_new_tokens, a `Sampler`, stop strings).
Out: `Pretrained(path)`: the `Decoder`, its tokenizer (`text`) and chat template (`template`);
     `Slot`: a KV cache and the ids it holds; `Reply`: one generation, advanced one unit of
     work at a time (a prefill chunk, or one token); `Completion`: what it made and why it stopped;
     `Pretrained.generate(prompt, ...)`, the whole loop at once.

Guarantees:
  - The context is the model's (`config.context_length`) unless `max_seq_len` says less: the
    decoder's positions, and every cache, are sized from it (a cache's buffers are zero pages
    until touched), never from max_new_tokens. A prompt that does not fit is a `ContextError`
    before any model work; a generation that fills the context stops with finish reason "context".
  - A reply on a `Slot` prefills only what the slot does not already hold: the longest common
    prefix of the slot's ids and the prompt is kept (`DecoderCache.truncate` drops the rest), so
    a chat turn or a client resending its history prefills only its new tokens. Prefill runs in
    chunks of `PREFILL_CHUNK` tokens, so a caller can show progress, interleave other replies or
    stop between two; after every unit of work `len(slot.ids) == slot.cache.n_filled`.
  - Generation stops at an end-of-sequence id ("eos": kept as the last id, not in the text), at
    max_new_tokens ("length"), when the text contains a stop string ("stop": the text is cut
    before it), when the context is full ("context"), or when the caller stops it ("interrupted").
    Streamed text is never taken back: a character still in the middle of its bytes, and the
    characters that could begin a stop string, are held until they are sure.
  - Greedy unless the `Sampler` has a temperature; the same seed gives the same tokens.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..models import checkpoints
from ..models.checkpoints import CheckpointError
from ..models.generation import count_nan, greedy
from ..models.sampling import Sampler
from .template import ChatTemplate, TemplateError

PREFILL_CHUNK = 256  # prompt tokens per prefill call: progress, and other replies, between two
FINISH_REASONS = ("eos", "length", "stop", "context", "interrupted")
# Whether a GGUF file's block-quantized matrices are dequantized to F32 when no weight_dtype is given.
# False: they stay blocks, which the kernels read natively (SmolLM2 Q4_1, warm, on a loaded machine:
# weights ready in 0.7 s rather than 2.6-3.4 s, decode 32 rather than 75 ms a token).
DEQUANTIZE_GGUF = False
OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "interrupted": "stop"}


class ContextError(ValueError):
    """A prompt longer than the context leaves room for."""


@dataclass
class Completion:
    prompt_ids: list[int]
    ids: list[int]  # generated only (an EOS that stopped it is the last)
    text: str       # the generated text, special tokens skipped, cut before a stop string
    finish_reason: str = "length"  # one of FINISH_REASONS
    prefill_seconds: float = 0.0   # the prompt's new tokens, up to the first token chosen
    decode_seconds: list[float] = field(default_factory=list)  # one per token after the first
    reused: int = 0  # prompt tokens whose keys and values the slot already held

    def to_json(self) -> dict:
        ms = 1e3 * float(np.mean(self.decode_seconds)) if self.decode_seconds else 0.0
        return {"prompt_ids": self.prompt_ids, "ids": self.ids, "text": self.text,
                "finish_reason": self.finish_reason, "prefill_ms": round(1e3 * self.prefill_seconds, 3),
                "decode_ms_per_token": round(ms, 3), "tokens_per_s": round(1e3 / ms, 2) if ms else 0.0}


class Slot:
    """A `DecoderCache` and the token ids whose keys and values it holds, in order."""

    def __init__(self, model):
        self.cache = model.new_cache()
        self.ids: list[int] = []

    def reuse(self, prompt: Sequence[int]) -> int:
        """Keep the longest common prefix of what is held and `prompt`, but never all of `prompt`
        (its last token must run, to give the logits after it), and only as far as the cache can
        go back to (a sliding-window layer keeps only its window: `DecoderCache.restorable`);
        forget the rest. The kept count."""
        n = self.cache.restorable(common_prefix(self.ids, prompt[:len(prompt) - 1]))
        self.cache.truncate(n)
        del self.ids[n:]
        return n

    def reset(self) -> None:
        self.reuse([0])


class Reply:
    """One generation after `prompt` on `slot`, advanced by `advance()`, one unit of model work
    (a prefill chunk or one token) per call, until `done`; then `completion` says what it made.

        reply = model.reply(ids, Sampler(), max_new_tokens=32)
        while not reply.done:
            print(reply.advance(), end="")    # the text that is now sure
    """

    def __init__(self, model: "Pretrained", prompt: Sequence[int], slot: Slot | None = None, *,
                 max_new_tokens: int | None = None, sampler: Sampler = Sampler(), stop: Sequence[str] = (),
                 chunk: int = PREFILL_CHUNK):
        self.model, self.decoder, self.text_of = model, model.model, model.text
        self.slot = slot or Slot(self.decoder)
        self.prompt = list(prompt)
        model.check_fits(self.prompt)
        self.max_new = self.decoder.max_seq_len if max_new_tokens is None else max_new_tokens
        self.choose = sampler.chooser()
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.eos = set(self.text_of.eos_ids) if self.text_of else set()
        self.chunk = chunk
        self.out = Completion(self.prompt, [], "", reused=self.slot.reuse(self.prompt))
        self.to_prefill = self.prompt[self.out.reused:]
        self.prefilled = 0  # of to_prefill
        self.shown = 0  # characters of out.text handed out
        self.done = False
        self._started = time.perf_counter()

    @property
    def completion(self) -> Completion:
        return self.out

    def advance(self) -> str:
        """One unit of work; the text it made sure of ("" if none)."""
        if self.done:
            return ""
        t0 = time.perf_counter()
        if self.prefilled < len(self.to_prefill):
            part = self.to_prefill[self.prefilled:self.prefilled + self.chunk]
            logits = self.decoder.prefill(part, self.slot.cache)
            self.slot.ids.extend(part)
            self.prefilled += len(part)
            if self.prefilled < len(self.to_prefill):
                return ""
        else:
            token = self.out.ids[-1]
            logits = self.decoder.step(token, self.slot.cache)
            self.slot.ids.append(token)
        nan = count_nan(logits)
        if nan:  # argmax would pick the NaN: a token that looks real from a broken model
            raise FloatingPointError(f"position {self.slot.cache.n_filled - 1}: {nan} of {logits.size} logits "
                                     "are NaN; the weights or the inputs hold NaN or overflow (try a wider dtype)")
        token = self.choose(logits)
        self.out.ids.append(token)
        if len(self.out.ids) == 1:
            self.out.prefill_seconds = time.perf_counter() - self._started
        else:
            self.out.decode_seconds.append(time.perf_counter() - t0)
        return self._after(token)

    def _after(self, token: int) -> str:
        """The text made sure by `token`, and whether generation ends with it."""
        if token in self.eos:
            return self.finish("eos")
        piece, stopped = self._text()
        if stopped:
            return piece + self.finish("stop")
        if len(self.out.ids) >= self.max_new:
            return piece + self.finish("length")
        if self.slot.cache.n_filled >= self.decoder.max_seq_len:  # no position left to run the token in
            return piece + self.finish("context")
        return piece

    def _text(self, final: bool = False) -> tuple[str, bool]:
        if self.text_of is None:
            return "", False
        ids = [t for t in self.out.ids if t not in self.eos]
        self.out.text, stopped = cut(self.text_of.decode(ids), self.stop)
        # Held back: a character still in the middle of its bytes (it decodes as U+FFFD), and the
        # last characters that could begin a stop string.
        ready = len(self.out.text) if stopped or final else len(self.out.text) - self.hold
        if ready <= self.shown or (not final and self.out.text[:ready].endswith("\ufffd")):
            return "", stopped
        piece, self.shown = self.out.text[self.shown:ready], ready
        return piece, stopped

    def finish(self, reason: str) -> str:
        """End the generation with `reason` (the caller's: "interrupted"); the text held back until now."""
        if self.done:
            return ""
        self.done = True
        self.out.finish_reason = reason
        if self.prefilled < len(self.to_prefill):  # stopped inside the prompt: the slot keeps what ran
            return ""
        return self._text(final=True)[0]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many ids `a` and `b` share from the start."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cut(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """`text` cut before the first stop string in it, and whether there was one."""
    at = min((text.find(s) for s in stop if s and s in text), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


class Pretrained:
    """A checkpoint's Decoder and, when it has them, its tokenizer and chat template.

        m = Pretrained("path/to/folder")               # or a .gguf file; weights as float32
        m.generate("Once upon a time", max_new_tokens=32).text
        m.generate([1, 415, 2936], temperature=0.8, top_p=0.9, seed=0).ids
        m.generate(m.chat_ids([{"role": "user", "content": "Hi!"}])).text

    The model is built for `max_seq_len` positions: the model's context unless this is less.
    `chat_template` (Jinja source) replaces the model's own.
    """

    def __init__(self, path: str | os.PathLike, dtype=None, max_seq_len: int | None = None,
                 allow_nonfinite: bool = False, fma: bool = True, weight_dtype=None, threads: int | None = None,
                 chat_template: str | None = None, defer: bool = False):
        self.path = Path(path)
        t0 = time.perf_counter()
        _, self.config = checkpoints.describe(self.path)  # a bad checkpoint fails here, before anything is read
        self.context = self.config.context_length
        if max_seq_len is not None and max_seq_len > self.context:
            raise ContextError(f"max_seq_len: expected at most the model's context, {self.context}, got {max_seq_len}")
        self.max_seq_len = max_seq_len or self.context
        # why there is no tokenizer, when there is none: a tokenizer Kina cannot build leaves
        # the model usable with token ids
        self.no_text = "the model has no tokenizer" if self.path.is_file() else \
            "the model has no tokenizer (tokenizer.json: no such file)"
        try:
            self.text = checkpoints.load_text(self.path)
        except CheckpointError as e:
            self.text, self.no_text = None, str(e).removeprefix(f"{self.path}: ")
        self.template = self._template(chat_template)
        if weight_dtype is None and self.path.is_file() and DEQUANTIZE_GGUF:
            weight_dtype = np.float32
        self.model = None
        self._options = dict(dtype=dtype, allow_nonfinite=allow_nonfinite, fma=fma, weight_dtype=weight_dtype,
                             threads=threads)
        self.load_seconds = time.perf_counter() - t0
        if not defer:
            self.load_model()

    def load_model(self) -> None:
        """Read the weights and build the Decoder (compiling its kernel, or taking it from the cache)."""
        t0 = time.perf_counter()
        self.model = checkpoints.load(self.path, max_seq_len=self.max_seq_len, **self._options)
        self.load_seconds += time.perf_counter() - t0

    @property
    def name(self) -> str:
        """The model's name: its folder's or file's, without a .gguf suffix."""
        return self.path.stem if self.path.suffix.lower() == ".gguf" else self.path.name

    def _template(self, source: str | None) -> ChatTemplate | None:
        where = "the given chat template" if source else f"{self.path}: the chat template"
        source = source or (self.text.chat_template if self.text else None)
        if source is None:
            return None
        bos, eos = (self.text.bos_token, self.text.eos_token) if self.text else (None, None)
        return ChatTemplate(source, bos_token=bos, eos_token=eos, where=where)

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.text is None:
                raise CheckpointError(f"{self.path}: {self.no_text}: pass the prompt as token ids")
            return self.text.encode(prompt)
        return self.model._tokens("prompt", prompt)

    def chat_ids(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        """The conversation rendered by the chat template and encoded (special tokens as written)."""
        if self.template is None:
            raise TemplateError(no_template(self.path))
        if self.text is None:
            raise CheckpointError(f"{self.path}: {self.no_text} to encode its chat template with")
        # as transformers' apply_chat_template: no BOS added (a template that wants one writes it)
        return self.text.encode(self.template.render(messages, add_generation_prompt), add_special=False)

    def check_fits(self, ids: Sequence[int]) -> None:
        """A ContextError unless `ids` leave at least one position to answer in."""
        n = self.max_seq_len
        if not ids:
            raise ValueError("prompt: expected at least one token")
        if len(ids) >= n:
            raise ContextError(f"the prompt is {len(ids)} tokens, and the context holds {n} (the answer needs at least "
                               f"one more; the model's context is {self.context}, --ctx-size sets less)")

    def reply(self, prompt: Sequence[int], sampler: Sampler = Sampler(), slot: Slot | None = None,
              **settings) -> Reply:
        return Reply(self, prompt, slot, sampler=sampler, **settings)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop: Sequence[str] = (),
                 on_text: Callable[[str], None] | None = None,
                 on_token: Callable[[int, float], None] | None = None, slot: Slot | None = None) -> Completion:
        """Continue `prompt` (text or ids); `on_text(piece)` gets the text as it grows,
        `on_token(id, seconds)` each token."""
        reply = self.reply(self.encode(prompt), Sampler(temperature, top_k, top_p, seed), slot,
                           max_new_tokens=max_new_tokens, stop=stop)
        while not reply.done:
            n = len(reply.out.ids)
            piece = reply.advance()
            if on_token is not None and len(reply.out.ids) > n:
                out = reply.out
                on_token(out.ids[-1], out.prefill_seconds if len(out.ids) == 1 else out.decode_seconds[-1])
            if piece and on_text is not None:
                on_text(piece)
        return reply.completion


def no_template(path) -> str:
    return (f"{path}: the model has no chat template (a base model, not an instruct one?): continue a prompt "
            "with `kina generate`, or give a template with --chat-template FILE")
