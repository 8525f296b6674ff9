"""Checkpoint readers: a model's config, weights and tokenizer, from where users keep them.

In:  a path: a Hugging Face folder (config.json, safetensors, tokenizer.json) or a GGUF file.
Out: `load(path, ...)`, the `kina.models.Decoder` it holds; `load_text(path)`, its tokenizer
     (a `kina.models.tokenizer.Text`), or None when it has none; `CheckpointError`.

    hf.py      Hugging Face folders
    gguf.py    GGUF files (quantized blocks kept)
    fields.py  reading a config's fields; CheckpointError

Guarantees: every problem with a checkpoint is a `CheckpointError` (a ValueError) naming the
file and the field or tensor, never another library's exception.
"""
from __future__ import annotations

import os
from pathlib import Path

from .fields import CheckpointError

__all__ = ["CheckpointError", "load", "load_text", "describe"]


def _reader(path: Path):
    """The reader module of the checkpoint at `path`: hf for a folder, gguf for a GGUF file."""
    if path.is_dir():
        from . import hf
        return hf
    if not path.exists():
        raise CheckpointError(f"{path}: no such model folder or file")
    from . import gguf
    if gguf.is_gguf(path):
        return gguf
    raise CheckpointError(f"{path}: not a model: expected a Hugging Face folder (with config.json) or a GGUF file")


def load(path: str | os.PathLike, **options):
    """The Decoder of the checkpoint at `path`; `options` are the reader's (dtype, max_seq_len, ...)."""
    return _reader(Path(path)).load(Path(path), **options)


def load_text(path: str | os.PathLike):
    """The checkpoint's tokenizer, or None when it has none (a folder without tokenizer.json)."""
    path = Path(path)
    reader = _reader(path)
    if reader.__name__.endswith(".gguf"):
        return reader.load_text(path)
    if not (path / "tokenizer.json").is_file():
        return None
    from ..tokenizer import from_folder
    return from_folder(path)


def describe(path: str | os.PathLike):
    """(family, DecoderConfig) without reading the weights: a bad checkpoint fails here, cheaply."""
    path = Path(path)
    reader = _reader(path)
    if reader.__name__.endswith(".gguf"):
        _, family, config = reader.read(path)
        return family, config
    family, config, _ = reader.read_config(path)
    return family, config
