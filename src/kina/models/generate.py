"""Text in, text out: a Hugging Face model folder run by Kina, and the `kina generate` command.

In:  a model folder (see kina.models.checkpoints), a prompt as text or token ids, and the
     generation settings (max_new_tokens, a `Sampler`'s temperature/top_k/top_p/seed,
     stop strings). On the command line:

         kina generate MODEL_DIR --prompt "Once upon a time" --max-new-tokens 64
              [--temperature T --top-k K --top-p P --seed S] [--dtype BF16] [--weight-dtype F16]
              [--threads N] [--stop STRING ...] [--json] [--prompt-ids 1,2,3]

Out: `Pretrained(folder).generate(prompt, ...)` -> `Completion` (the prompt's ids, the
     generated ids, their text, the prefill and per-token decode times); the command
     streams the text to stdout as it decodes, with a progress line on stderr, and
     ends with the prefill time and the decode speed; `--json` prints one object
     {"prompt_ids", "ids" (generated only), "text", "prefill_ms",
     "decode_ms_per_token", "tokens_per_s"} instead.

Guarantees: generation stops after max_new_tokens, at an EOS id (kept as the last
id, not in the text) or when the text contains a stop string (the text is cut
before it). Greedy unless a temperature is given; the same seed gives the same
tokens. A user error (a bad folder, flag or prompt) is one line on stderr and exit
status 1 (2 for a usage error, as argparse has it), 130 when interrupted; never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import checkpoints
from .checkpoints import CheckpointError
from .tokenizer import Text
from .sampling import Sampler


@dataclass
class Completion:
    prompt_ids: list[int]
    ids: list[int]  # generated only (an EOS that stopped it is the last)
    text: str       # the generated text, special tokens skipped, cut before a stop string
    prefill_seconds: float = 0.0
    decode_seconds: list[float] = field(default_factory=list)  # one per token after the first

    def to_json(self) -> dict:
        ms = 1e3 * float(np.mean(self.decode_seconds)) if self.decode_seconds else 0.0
        return {"prompt_ids": self.prompt_ids, "ids": self.ids, "text": self.text,
                "prefill_ms": round(1e3 * self.prefill_seconds, 3), "decode_ms_per_token": round(ms, 3),
                "tokens_per_s": round(1e3 / ms, 2) if ms else 0.0}


class Pretrained:
    """A checkpoint's Decoder and, when it has one, its tokenizer.

        m = Pretrained("path/to/folder")               # weights as float32
        m.generate("Once upon a time", max_new_tokens=32).text
        m.generate([1, 415, 2936], temperature=0.8, top_p=0.9, seed=0).ids

    The model is loaded for `max_seq_len` positions (default: the config's
    max_position_embeddings, at most kina.models.decoder.DEFAULT_MAX_SEQ_LEN).
    """

    def __init__(self, folder: str | os.PathLike, dtype=None, max_seq_len: int | None = None,
                 allow_nonfinite: bool = False, fma: bool = False, weight_dtype=None):
        self.folder = Path(folder)
        self.model = checkpoints.load(self.folder, dtype=dtype, max_seq_len=max_seq_len,
                                      allow_nonfinite=allow_nonfinite, fma=fma, weight_dtype=weight_dtype)
        self.text: Text | None = checkpoints.load_text(self.folder)

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.text is None:
                raise CheckpointError(f"{self.folder / 'tokenizer.json'}: no such file: pass the prompt as token ids")
            return self.text.encode(prompt)
        return self.model._tokens("prompt", prompt)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop: Sequence[str] = (),
                 on_text: Callable[[str], None] | None = None,
                 on_token: Callable[[int, float], None] | None = None) -> Completion:
        """Continue `prompt` (text or ids); `on_text(piece)` gets the text as it grows,
        `on_token(id, seconds)` each token."""
        ids = self.encode(prompt)
        sampler = Sampler(temperature, top_k, top_p, seed)
        eos = set(self.text.eos_ids) if self.text else set()
        out = Completion(ids, [], "")
        shown = 0  # characters passed to on_text
        hold = max((len(s) for s in stop), default=1) - 1
        for token, _, seconds in self.model.stream(ids, max_new_tokens, choose=sampler.chooser()):
            out.ids.append(token)
            if len(out.ids) == 1:
                out.prefill_seconds = seconds
            else:
                out.decode_seconds.append(seconds)
            if on_token is not None:
                on_token(token, seconds)
            if token in eos:
                break
            if self.text is None:
                continue
            out.text, stopped = self._cut(self.text.decode(out.ids), stop)
            # Held back: a character still in the middle of its bytes (it decodes as U+FFFD),
            # and the last characters that could begin a stop string.
            ready = len(out.text) - hold if not stopped else len(out.text)
            if on_text is not None and ready > shown and not out.text[:ready].endswith("\ufffd"):
                on_text(out.text[shown:ready])
                shown = ready
            if stopped:
                break
        if self.text is not None:
            out.text, _ = self._cut(self.text.decode([t for t in out.ids if t not in eos]), stop)
            if on_text is not None and len(out.text) > shown:
                on_text(out.text[shown:])
        return out

    @staticmethod
    def _cut(text: str, stop: Sequence[str]) -> tuple[str, bool]:
        """`text` cut before the first stop string in it, and whether there was one."""
        cut = min((text.find(s) for s in stop if s and s in text), default=-1)
        return (text[:cut], True) if cut >= 0 else (text, False)


# -- the command ---------------------------------------------------------------------------

_DTYPES = ("F32", "BF16", "F16", "F64")


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one token id")
    return ids


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`kina generate: error: ...`), as every other error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kina", description="Run models with Kina.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="continue a prompt with a Hugging Face Llama/Mistral/Qwen2 folder",
                       description="Continue a prompt with a Hugging Face model folder (config.json, "
                                   "model.safetensors, tokenizer.json), token for token as transformers.")
    g.add_argument("model_dir", metavar="MODEL_DIR")
    what = g.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="the prompt text (needs tokenizer.json)")
    what.add_argument("--prompt-ids", type=_ids, help="the prompt as token ids: 1,2,3")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    g.add_argument("--top-k", type=int, default=0, help="keep the K most likely tokens (0: all)")
    g.add_argument("--top-p", type=float, default=1.0, help="keep the most likely tokens up to probability P")
    g.add_argument("--seed", type=int, default=None, help="the sampling seed (the same seed, the same tokens)")
    g.add_argument("--stop", action="append", default=[], help="stop when the text contains this (repeatable)")
    g.add_argument("--dtype", choices=_DTYPES, default="F32", help="compute in this dtype (default F32)")
    g.add_argument("--weight-dtype", choices=("F16", "BF16"), default=None,
                   help="hold the weight matrices in this dtype, against F32 activations (--dtype F32): half "
                        "the bytes per token, each weight widened exactly")
    g.add_argument("--threads", type=int, default=None,
                   help="KINA_NUM_THREADS: the threads each decode layer step and the head run on "
                        "(the threads pass; default the cores)")
    g.add_argument("--fma", action="store_true",
                   help="fused multiply-adds in the matmuls: a faster prefill, other bits than the default's")
    g.add_argument("--allow-nonfinite", action="store_true",
                   help="load weights that hold NaN or infinity (refused by default, naming the tensor)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _generate(args)
    except (CheckpointError, ValueError, TypeError, OSError, FloatingPointError) as e:
        print(f"kina generate: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kina generate: interrupted", file=sys.stderr)
        return 130


def _generate(args) -> int:
    from .. import knobs, runtime
    if args.threads is not None:
        knobs.set("KINA_NUM_THREADS", str(args.threads), "--threads")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens: expected an int >= 1, got {args.max_new_tokens}")
    Sampler(args.temperature, args.top_k, args.top_p, args.seed)  # the flags, checked before the load
    folder = Path(args.model_dir)
    checkpoints.describe(folder)  # a bad folder fails here, before the tokenizer or the weights are read
    text = checkpoints.load_text(folder)
    if args.prompt is not None and text is None:
        raise CheckpointError(f"{folder / 'tokenizer.json'}: no such file (pass token ids instead, or add the "
                              "model's tokenizer)")
    ids = text.encode(args.prompt) if args.prompt is not None else args.prompt_ids  # sizes the model's positions
    t0 = time.perf_counter()
    m = Pretrained(folder, runtime.numpy_dtype(args.dtype), max_seq_len=len(ids) + args.max_new_tokens,
                   allow_nonfinite=args.allow_nonfinite, fma=args.fma,
                   weight_dtype=args.weight_dtype and runtime.numpy_dtype(args.weight_dtype))
    loaded = time.perf_counter() - t0
    err, out = sys.stderr, sys.stdout
    n = [0]

    def on_text(piece):
        if not args.json:
            out.write(piece)
            out.flush()

    def on_token(token, seconds):
        n[0] += 1
        if not args.json and err.isatty():
            err.write(f"\r\x1b[2K[{n[0]}/{args.max_new_tokens}] {1 / seconds if seconds else 0:.1f} tok/s")
            err.flush()
        elif not args.json and n[0] % 16 == 0:
            err.write(f"[{n[0]}/{args.max_new_tokens} tokens]\n")

    done = m.generate(ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed,
                      args.stop, on_text=on_text if text else None, on_token=on_token)
    result = done.to_json()
    if args.json:
        print(json.dumps(result))
        return 0
    if text is None:
        out.write(" ".join(map(str, done.ids)))
    out.write("\n")
    if err.isatty():
        err.write("\r\x1b[2K")
    err.write(f"loaded {folder.name} ({m.model.architecture}, {args.dtype}) in {loaded:.2f} s; "
              f"prefill {len(ids)} tokens: {result['prefill_ms']:.1f} ms; decode {len(done.ids) - 1} tokens: "
              f"{result['decode_ms_per_token']:.2f} ms/token ({result['tokens_per_s']:.1f} tokens/s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
