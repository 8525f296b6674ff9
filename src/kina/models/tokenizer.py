"""Text to token ids and back: a `tokenizers.Tokenizer` with the model's special ids.

In:  a Hugging Face folder's tokenizer.json (with tokenizer_config.json, generation_config.json
     and config.json for the special ids), or a GGUF file's `tokenizer.ggml.*` keys (`from_gguf`,
     given the metadata kina.models.checkpoints.gguf reads): a "gpt2" vocabulary (byte-level BPE),
     or a "llama" one (SentencePiece) of an architecture in SENTENCEPIECE (llama: Llama 2,
     TinyLlama, Mistral v0.1; gemma, gemma2, gemma3).
Out: `Text`, which encodes (adding BOS, or EOS, when the model wants it) and decodes (special
     tokens skipped), with `bos_id`, `eos_ids` and the chat template, if the model has one.

Guarantees: a missing or damaged file is a `CheckpointError` naming it, and a GGUF tokenizer of
a kind Kina does not build one naming the key; a GGUF file's tokenizer gives the ids, and decodes
them to the text, that transformers' gives for the same file (`AutoTokenizer.from_pretrained(
folder, gguf_file=...)`); the `tokenizers` package is imported only when a tokenizer is read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import files
from .checkpoints.fields import CheckpointError


@dataclass
class Text:
    """A tokenizer (`tokenizers.Tokenizer`) and special ids: `bos_id` (prepended to an encoded
    prompt when the tokenizer's own post-processor does not add it and `add_bos` asks for it),
    `eos_ids` (generation stops at any of them), `chat_template` (Jinja source, or None for a
    model without one) and `special` (the text of each special token, by id)."""

    tokenizer: object
    bos_id: int | None
    eos_ids: tuple[int, ...]
    add_bos: bool
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    special: dict[int, str] = field(default_factory=dict)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """The ids of `text`; with `add_special`, BOS first when the model wants it. Special tokens
        written in the text (`<|im_start|>`) are those tokens, as transformers encodes a rendered
        chat template."""
        ids = self.tokenizer.encode(text, add_special_tokens=add_special).ids
        if add_special and self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)


def from_folder(folder: str | os.PathLike) -> Text:
    """The folder's tokenizer.json (read by the `tokenizers` package), special ids and chat template."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if not path.exists():
        raise CheckpointError(f"{path}: no such file (pass token ids instead, or add the model's tokenizer)")
    try:
        text = files.read_text(path, limit=1 << 30)  # a directory, a binary or a huge file
    except files.FileError as e:
        raise CheckpointError(str(e)) from None
    tokenizer = parse(text, path)
    tc = _json(folder / "tokenizer_config.json")
    gc = _json(folder / "generation_config.json")
    cc = _json(folder / "config.json")

    def token_id(value):
        if isinstance(value, dict):  # an AddedToken written out
            value = value.get("content")
        return tokenizer.token_to_id(value) if isinstance(value, str) else None

    def ids(value):
        if value is None:
            return ()
        return tuple(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int))

    bos = gc.get("bos_token_id", cc.get("bos_token_id"))
    if not isinstance(bos, int):
        bos = token_id(tc.get("bos_token"))
    eos = ids(gc.get("eos_token_id")) or ids(cc.get("eos_token_id"))
    if not eos and token_id(tc.get("eos_token")) is not None:
        eos = (token_id(tc.get("eos_token")),)
    template = tc.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        try:
            template = files.read_text(folder / "chat_template.jinja")
        except files.FileError as e:
            raise CheckpointError(str(e)) from None
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not isinstance(template, str):
        template = None
    return Text(tokenizer, bos, eos, bool(tc.get("add_bos_token", False)), template,
                bos_token=_content(tc.get("bos_token")) or _token(tokenizer, bos),
                eos_token=_content(tc.get("eos_token")) or (_token(tokenizer, eos[0]) if eos else None),
                special=_special(tokenizer))


def parse(text: str, where) -> object:
    """A `tokenizers.Tokenizer` from tokenizer.json text; a CheckpointError naming `where` if it is not one."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise CheckpointError("reading a tokenizer needs the tokenizers package (pip install tokenizers)") from None
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # the Rust side raises its own Exception type
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{where}: not a tokenizer the tokenizers package reads ({reason})") from None


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = files.read_json(path)
    except files.FileError as e:
        raise CheckpointError(str(e)) from None
    return value if isinstance(value, dict) else {}


def _content(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _token(tokenizer, i) -> str | None:
    return tokenizer.id_to_token(i) if isinstance(i, int) else None


def _special(tokenizer) -> dict[int, str]:
    try:
        return {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    except AttributeError:  # an older tokenizers
        return {}


# -- from a GGUF file's metadata -----------------------------------------------------------------

# `tokenizer.ggml.pre` -> the split a byte-level vocabulary's merges were learned on (llama.cpp's
# pre-tokenizer types, as llama-vocab.cpp lists them); others split as GPT-2 does.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GGUF_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
               "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT,
               "deepseek-r1-qwen": _QWEN2_SPLIT}
# types whose digits are split one by one before GPT-2's split (llama.cpp: smollm, starcoder, ...)
GGUF_DIGITS = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type


def from_gguf(meta: dict, where) -> Text:
    """The tokenizer a GGUF file's `tokenizer.ggml.*` keys describe, as transformers builds it from
    the same file (the `tokenizers` library's BPE), with its special ids, `add_bos_token`,
    `add_eos_token` and chat template: `model` "gpt2" (GPT-2's byte-level BPE, with the split `pre`
    names) or "llama" (SentencePiece) of an architecture in SENTENCEPIECE. A file without one, or
    of a kind Kina does not build, is a CheckpointError naming the key."""
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if model is None or tokens is None:
        raise CheckpointError(f"{where}: the file has no tokenizer (no 'tokenizer.ggml.model' or "
                              "'tokenizer.ggml.tokens'): pass the prompt as token ids")
    arch = meta.get("general.architecture")
    if model == "llama" and arch not in SENTENCEPIECE:
        raise CheckpointError(f"{where}: field 'tokenizer.ggml.model' = {model!r}: Kina builds SentencePiece "
                              f"('llama') tokenizers for {', '.join(SENTENCEPIECE)} files, not {arch!r} ones")
    if model not in ("gpt2", "llama"):
        raise CheckpointError(f"{where}: field 'tokenizer.ggml.model' = {model!r}: Kina builds 'gpt2' "
                              "(byte-level BPE) and 'llama' (SentencePiece) tokenizers from GGUF files")
    try:
        from tokenizers import AddedToken, processors
    except ImportError:
        raise CheckpointError("reading a tokenizer needs the tokenizers package (pip install tokenizers)") from None
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    if model == "gpt2":
        tokenizer, tokens = _byte_level(meta, tokens, types, where), list(tokens)
    else:
        tokenizer, tokens = SENTENCEPIECE[arch](meta, tokens, types)

    def special(key):
        i = meta.get(f"tokenizer.ggml.{key}")
        return int(i) if isinstance(i, (int, np.integer)) and 0 <= i < len(tokens) else None

    bos, eos, eot = special("bos_token_id"), special("eos_token_id"), special("eot_token_id")
    # transformers matches its named tokens whole (and skips them in decoding), whatever their type
    # (those not added already: a user-defined one stays a plain added token)
    added = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    named = [tokens[i] for i in (bos, eos, special("unknown_token_id"), special("padding_token_id")) if i is not None]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in named if t not in added])
    eos_ids = tuple(dict.fromkeys(i for i in (eos, eot) if i is not None))
    template = meta.get("tokenizer.chat_template")
    # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise (transformers too)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama")) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:  # as transformers: BOS first and EOS last whatever the text holds
        ends = [tokens[bos]] * add_bos, [tokens[eos]] * add_eos
        tokenizer.post_processor = processors.TemplateProcessing(
            single=[*ends[0], "$A", *ends[1]],
            special_tokens=[(tokens[i], i) for i, on in ((bos, add_bos), (eos, add_eos)) if on])
    return Text(tokenizer, bos, eos_ids, add_bos, template if isinstance(template, str) else None,
                bos_token=tokens[bos] if bos is not None else None, eos_token=tokens[eos] if eos is not None else None,
                special={i: t for i, (t, k) in enumerate(zip(tokens, types)) if k == CONTROL})


def _byte_level(meta: dict, tokens, types: list, where):
    """GPT-2's byte-level BPE of the file's tokens and merges, split as its `pre` says."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    if any(len(m) != 2 for m in merges):
        raise CheckpointError(f"{where}: field 'tokenizer.ggml.merges': a merge is not two tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre in GGUF_SPLITS:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(GGUF_SPLITS[pre]), "isolated"),
                                                           pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                    use_regex=False)])
    elif pre in GGUF_DIGITS:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                           pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                  for t, k in zip(tokens, types) if k == CONTROL])
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED])
    return tokenizer


def _merges(pieces, scores) -> list[tuple[str, str]]:
    """A SentencePiece vocabulary's merges, as transformers derives them (`generate_merges`): every
    split of a piece into two pieces, the piece of higher score first, then the longer left part,
    then the longer right one; ties in all three in the order of the file. A piece written twice
    keeps its first place and its last score."""
    score = dict(zip(pieces, scores))
    splits = [(p[:cut], p[cut:], -float(s)) for p, s in score.items() for cut in range(1, len(p))
              if p[:cut] in score and p[cut:] in score]
    splits.sort(key=lambda m: (m[2], -len(m[0]), -len(m[1])))
    return [(left, right) for left, right, _ in splits]


def _sentencepiece(pieces, merges, types: list, unk, user_defined):
    """A BPE over SentencePiece's pieces (spaces spelled "▁", U+2581, in the pieces): a character
    with no piece falls back to its UTF-8 bytes (the <0x..> pieces); control pieces (<s>, <bos>,
    <start_of_turn>, ...) are special tokens, matched whole, and the `user_defined` ones are plain
    added tokens, matched whole. Decoding turns "▁" back into spaces and byte pieces into text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    rank = {t: i for i, t in enumerate(pieces)}
    tokenizer = Tokenizer(models.BPE(rank, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                  for t, k in zip(pieces, types) if k == CONTROL])
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in user_defined])
    return tokenizer


def _llama(meta: dict, tokens, types: list):
    """(tokenizer, tokens) of a Llama file's SentencePiece vocabulary (Llama 2, TinyLlama,
    Mistral v0.1), as transformers builds it (`LlamaTokenizer`):
      - the merges come from the pieces' scores (`_merges`);
      - every space is "▁", and a "▁" is put before the text unless it starts with one, but not
        before text that follows an added token (`Metaspace`, prepend "first", no split);
        decoding takes one leading space off. transformers does this whatever `tokenizer.ggml.add_space_prefix` says, so
        Kina does too (llama.cpp leaves the "▁" out when the key is false);
      - the <unk> piece is not the BPE's unknown token (byte fallback covers every character)."""
    from tokenizers import decoders, pre_tokenizers
    tokens = list(tokens)
    scores = meta.get("tokenizer.ggml.scores", [0.0] * len(tokens))
    user_defined = [t for t, k in zip(tokens, types) if k == USER_DEFINED]
    tokenizer = _sentencepiece(tokens, _merges(tokens, scores), types, None, user_defined)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence([tokenizer.decoder, decoders.Strip(" ", 1, 0)])
    return tokenizer, tokens


def _gemma(meta: dict, tokens, types: list):
    """(tokenizer, tokens) of a Gemma file's SentencePiece vocabulary, as transformers builds it
    (`GemmaTokenizer`):
      - a piece of spaces alone, which the file stores as spaces ("  "), is spelled with "▁" (the
        tokens returned keep that spelling), and so is every space of the text (no "▁" put first);
      - the merges are ranked by the piece's place in the file (Gemma's scores do not follow its
        merge order; the order of its pieces does);
      - <unk> is the BPE's unknown token; user-defined pieces ("\\n", "[multimodal]") are added
        whole, but not the space runs respelled."""
    from tokenizers import normalizers
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk = spelled[int(unk)] if isinstance(unk, (int, np.integer)) and 0 <= unk < len(spelled) else None
    user_defined = [t for t, k, given in zip(spelled, types, tokens) if k == USER_DEFINED and t == given]
    tokenizer = _sentencepiece(spelled, _merges(spelled, range(0, -len(spelled), -1)), types, unk, user_defined)
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    return tokenizer, spelled


# The GGUF architectures whose SentencePiece ("llama") vocabulary Kina builds, and how: the file
# holds pieces and scores but no merges, and transformers reads them per architecture.
SENTENCEPIECE = {"llama": _llama, "gemma": _gemma, "gemma2": _gemma, "gemma3": _gemma}
