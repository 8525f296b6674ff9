"""Text to token ids and back: a `tokenizers.Tokenizer` with the model's special ids.

In:  a Hugging Face folder's tokenizer.json (with tokenizer_config.json, generation_config.json
     and config.json for the special ids), or a `tokenizers.Tokenizer` that a checkpoint
     reader built (a GGUF file's vocabulary: kina.models.checkpoints.gguf).
Out: `Text`, which encodes (adding BOS when the model wants it) and decodes (special tokens
     skipped), with `bos_id`, `eos_ids` and the chat template, if the model has one.

Guarantees: a missing or damaged file is a `CheckpointError` naming it; the `tokenizers`
package is imported only when a tokenizer is read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

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
