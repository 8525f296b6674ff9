"""The GGUF keys that llama.cpp spells alike for every architecture, read once for all families.

In:  `Fields` over a GGUF file's metadata with the architecture's prefix ("llama.", "gemma3.").
Out: `attention(f)`: (width, heads, KV heads, head width); `rope(f, theta)`: the `Rope` of
     `rope.freq_base` (default `theta`, or required when None) and `rope.scaling.*`;
     `vocab_size(f)`: `vocab_size`, else the length of the token list.

Guarantees: a key Kina does not implement (a value length other than the key length, partial
rotary, a scaling other than none or linear) is refused naming it, as is a head count the KV
heads do not divide, or no vocabulary size at all.
"""
from __future__ import annotations

from ..config import Rope


def attention(f) -> tuple[int, int, int, int]:
    """(embedding_length, attention.head_count, head_count_kv, key_length), checked."""
    d = f.integer("embedding_length", required=True)
    heads = f.integer("attention.head_count", required=True)
    kv_heads = f.integer("attention.head_count_kv") or heads
    if heads % kv_heads:
        f.refuse("attention.head_count_kv", f"attention.head_count = {heads} is not a multiple of it")
    head_dim = f.integer("attention.key_length") or d // heads
    if f.integer("attention.value_length", head_dim) != head_dim:
        f.refuse("attention.value_length", f"expected the key length, {head_dim}")
    if f.integer("rope.dimension_count", head_dim) != head_dim:
        f.refuse("rope.dimension_count", f"partial rotary embedding is not supported (head width {head_dim})")
    return d, heads, kv_heads, head_dim


def rope(f, theta: float | None) -> Rope:
    """`rope.freq_base` (`theta` when absent; required when `theta` is None), scaled as
    `rope.scaling.type` says (none, or linear by `rope.scaling.factor`)."""
    scaling = f.text("rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        f.refuse("rope.scaling.type", "only none and linear are supported")
    base = f.number("rope.freq_base", required=True) if theta is None else f.number("rope.freq_base", theta)
    return Rope.of(base, {"rope_type": "linear", "factor": f.number("rope.scaling.factor", required=True)}
                   if scaling == "linear" else None)


def vocab_size(f) -> int:
    """`vocab_size`, or the number of `tokenizer.ggml.tokens` when the file leaves it out."""
    vocab = f.integer("vocab_size") or len(f.values.get("tokenizer.ggml.tokens") or ()) or None
    if vocab is None:
        f.refuse("vocab_size", "missing, and the file has no tokenizer.ggml.tokens to count")
    return vocab
