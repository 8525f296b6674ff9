"""A tiny decoder-only model with seeded weights, attention in compiled Kina.

In:  sizes, a seed and a dtype; then token ids.
Out: `TinyDecoder`, whose `generate` returns greedy token ids, decoding with one
     `KVCache` per layer (prefill, then one in-place step per token) or recomputing
     full causal attention at every step.

Guarantees: the weights depend on the seed and sizes only, never on max_seq_len;
cached and recomputed generation give the same tokens. Bad sizes and token ids are
errors naming the parameter.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ... import runtime
from ..generation import Generator, count, kina_dtype
from .kvcache import CacheFullError, KVCache, causal_attention, prefill

def _rms_norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6, dtype=x.dtype)


def _positions(start: int, count: int, d_model: int, dtype) -> np.ndarray:
    """Sinusoidal position encodings [count, d_model]: no table, so nothing depends on max_seq_len."""
    pos = np.arange(start, start + count, dtype=np.float64)[:, None]
    freq = np.exp(-math.log(10000.0) * (np.arange(0, d_model, 2) / d_model))
    enc = np.zeros((count, d_model))
    enc[:, 0::2] = np.sin(pos * freq)
    enc[:, 1::2] = np.cos(pos * freq[: d_model // 2])
    return enc.astype(dtype)


class TinyDecoder(Generator):
    """A deterministic decoder-only transformer with seeded random weights.

    Per layer: RMS norm, multi-head causal self-attention (compiled Kina), a
    residual, RMS norm, a ReLU MLP, a residual. Embedding, projections, MLP and
    the output head run on the host in NumPy; the weights depend on `seed` and the
    sizes, never on `max_seq_len`, which only bounds the sequence length.
    """

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, max_seq_len: int,
                 seed: int = 0, dtype=np.float32):
        self.vocab_size = count("vocab_size", vocab_size, 1)
        self.d_model = count("d_model", d_model, 1)
        self.n_heads = count("n_heads", n_heads, 1)
        self.n_layers = count("n_layers", n_layers, 1)
        self.max_seq_len = count("max_seq_len", max_seq_len, 1)
        self.seed = count("seed", seed, 0)
        self.dtype = kina_dtype(dtype)
        if self.dtype == runtime.numpy_dtype("BF16"):  # ml_dtypes' bfloat16 matmul returns float32
            raise TypeError("dtype: TinyDecoder's host layers are NumPy matmuls, which have no bfloat16 result: "
                            "use float16, float32 or float64 (a KVCache may be bfloat16)")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: {d_model} is not a multiple of n_heads = {n_heads}")
        if self.d_model % 2:
            raise ValueError(f"d_model: must be even (sinusoidal positions come in sin/cos pairs), got {d_model}")
        self.head_dim = self.d_model // self.n_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        rng = np.random.default_rng(self.seed)
        D = self.d_model

        def w(*shape):
            return (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(self.dtype)

        self.embedding = rng.standard_normal((self.vocab_size, D)).astype(self.dtype)
        self.layers = [dict(wq=w(D, D), wk=w(D, D), wv=w(D, D), wo=w(D, D), w1=w(D, 4 * D), w2=w(4 * D, D))
                       for _ in range(self.n_layers)]
        self.head = w(D, self.vocab_size)

    def new_cache(self) -> list[KVCache]:
        """One empty KVCache per layer."""
        return [KVCache(1, self.n_heads, self.head_dim, self.max_seq_len, self.dtype) for _ in range(self.n_layers)]

    # -- the forward pass over a block of positions ----------------------------
    def _heads(self, x: np.ndarray) -> np.ndarray:
        """[T, D] -> [1, H, T, Dh]."""
        return x.reshape(x.shape[0], self.n_heads, self.head_dim).transpose(1, 0, 2)[None]

    def _forward(self, tokens: list[int], start: int, attention) -> np.ndarray:
        """Logits [vocab] after the last of `tokens`, placed at positions start, start+1, ...

        `attention(layer, q, k_t, v)` gets [1, H, T, Dh], [1, H, Dh, T], [1, H, T, Dh]
        and returns the context [1, H, T, Dh].
        """
        T = len(tokens)
        h = self.embedding[tokens] + _positions(start, T, self.d_model, self.dtype)
        for i, p in enumerate(self.layers):
            a = _rms_norm(h)
            q, k, v = self._heads(a @ p["wq"]), self._heads(a @ p["wk"]), self._heads(a @ p["wv"])
            ctx = attention(i, np.ascontiguousarray(q), np.ascontiguousarray(k.transpose(0, 1, 3, 2)),
                            np.ascontiguousarray(v))
            h = h + ctx[0].transpose(1, 0, 2).reshape(T, self.d_model) @ p["wo"]
            h = h + np.maximum(_rms_norm(h) @ p["w1"], 0) @ p["w2"]
        return (_rms_norm(h[-1:]) @ self.head)[0]

    def _check_caches(self, caches) -> None:
        if (not isinstance(caches, list) or len(caches) != self.n_layers
                or not all(isinstance(c, KVCache) for c in caches)):
            raise TypeError(f"caches: expected a list of {self.n_layers} KVCache (one per layer), from new_cache()")
        if len({c.n_filled for c in caches}) != 1:
            raise ValueError(f"caches: the layers disagree on the fill: {[c.n_filled for c in caches]}")

    def prefill(self, tokens: Sequence[int], caches: list[KVCache]) -> np.ndarray:
        """Run `tokens` through the model at once (after the caches' positions), append them; last logits."""
        tokens = self._tokens("tokens", tokens)
        self._check_caches(caches)
        if not tokens:
            raise ValueError("tokens: expected at least one token")
        start = caches[0].n_filled
        if start + len(tokens) > caches[0].max_seq_len:
            raise CacheFullError(start, caches[0].max_seq_len, len(tokens))
        return self._forward(tokens, start, lambda i, q, k, v: prefill(caches[i], q, k, v, self.scale))

    def step(self, token: int, caches: list[KVCache]) -> np.ndarray:
        """One decode step: `token` at position n_filled, through the in-place cache step; its logits."""
        (token,) = self._tokens("token", [token])
        self._check_caches(caches)
        start = caches[0].n_filled
        if start + 1 > caches[0].max_seq_len:
            raise CacheFullError(start, caches[0].max_seq_len, 1)
        return self._forward([token], start, lambda i, q, k, v: caches[i].step(q, k, v, self.scale))

    def recompute(self, tokens: Sequence[int]) -> np.ndarray:
        """The logits after `tokens`, from full causal attention over all of them (no cache kept)."""
        tokens = self._tokens("tokens", tokens)
        if not tokens:
            raise ValueError("tokens: expected at least one token")
        if len(tokens) > self.max_seq_len:
            raise ValueError(f"tokens: {len(tokens)} tokens exceed max_seq_len = {self.max_seq_len}")

        return self._forward(tokens, 0, lambda i, q, k, v: causal_attention(q, k, v, self.scale))
