"""The decode runtime: a preallocated KV cache, prefill, and greedy generation.

In:  NumPy arrays in the Kina attention layouts (Kᵀ [B, H, Dh, n], V [B, H, n, Dh],
     queries [B, H, 1, Dh]) and, for `TinyDecoder`, token ids.
Out: `KVCache`, one attention layer's keys and values in buffers of T_max
     positions, with in-place append and attention over the filled prefix; and
     `TinyDecoder`, a seeded decoder-only model whose `generate` returns greedy
     token ids, with the cache (prefill, then one in-place step per token) or
     without it (full causal attention recomputed at every step).

Guarantees:
  - Attention runs compiled Kina (kernels/attention.kina, and the prefill in
    kernels/prefill.kina, which examples/storylm0_prefill.kina links to), compiled
    once per dtype (F16, BF16 as `ml_dtypes.bfloat16`, F32, F64). It is given only
    the filled prefix, so its cost is linear in n_filled, never in T_max, and the
    unused slots (zeros, stale data, NaN) never change a result.
  - `KVCache.attend` computes exactly what the functional Section 19 step
    (examples/storylm0_kv_step_dyn.kina) computes, bit for bit.
  - A failed call changes nothing: `append` raises `CacheFullError` before
    writing, and `step` checks all of its arguments before it appends.
  - Every user error is a ValueError, TypeError or IndexError naming the
    parameter; `CacheFullError` is a ValueError.
"""
from __future__ import annotations

import functools
import math
import numbers
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import runtime

KERNELS = Path(__file__).resolve().parent / "kernels"
_KINA_DTYPES = {runtime.numpy_dtype(d): d for d in ("F16", "BF16", "F32", "F64")}  # BF16: ml_dtypes.bfloat16


class CacheFullError(ValueError):
    """An append that does not fit; the cache is left exactly as it was."""

    def __init__(self, n_filled: int, max_seq_len: int, requested: int):
        self.n_filled, self.max_seq_len, self.requested = n_filled, max_seq_len, requested
        super().__init__(f"KV cache is full: {n_filled} of {max_seq_len} positions are filled, so {requested} more "
                         f"do not fit ({max_seq_len - n_filled} free)")


def _program(name: str, dtype: np.dtype):
    """kernels/<name>.kina (generic in its element type T) compiled for `dtype`."""
    from .pipeline import Options
    return _compiled(name, _KINA_DTYPES[dtype], Options())


@functools.lru_cache(maxsize=None)
def _compiled(name: str, dtype: str, options):
    import kina
    return kina.compile_file(KERNELS / f"{name}.kina", options, dtypes={"T": dtype})


def _kina_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: expected a NumPy floating dtype, got {dtype!r}") from None
    if dt not in _KINA_DTYPES:
        raise TypeError(f"dtype: expected float16, bfloat16 (ml_dtypes), float32 or float64, got {dt}")
    return dt


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def _shape_str(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


# While Kᵀ rows are short, their stride stays within this many positions above the
# fill (the rows are moved apart when the fill passes it), up to rows of this many
# bytes: short rows nearly back to back are read one at a time, as one stream, at
# close to a contiguous read (matmul-loops; measured by scripts/bench_k_layout.py:
# 96% for 2 KB rows, against 60% for the same rows T_max apart). Longer rows go 8
# at a time, which does not mind the gap, so they get the stride T_max at once.
KT_STRIDE_STEP = 64
KT_SHORT_ROW_BYTES = 16 << 10


class KVCache:
    """One attention layer's keys and values for up to `max_seq_len` positions.

    Kᵀ is stored as [B, H, Dh, stride] inside a buffer of [B, H, Dh * T_max], where
    the row stride starts at KT_STRIDE_STEP positions and grows by that step as the
    cache fills (the rows are moved apart, last first), until rows would pass
    KT_SHORT_ROW_BYTES; from there it is T_max. V is [B, H, T_max, Dh]. Both start
    zeroed; positions [0, n_filled) are valid and the rest are scratch that no
    result reads. A large attention runs on `threads` threads (default
    `runtime.default_threads()`), split by batch and heads, with the same bits as on one.
    """

    def __init__(self, batch: int, n_heads: int, head_dim: int, max_seq_len: int, dtype=np.float32,
                 threads: int | None = None):
        self.threads = runtime.default_threads() if threads is None else _count("threads", threads, 1)
        self.batch = _count("batch", batch, 1)
        self.n_heads = _count("n_heads", n_heads, 1)
        self.head_dim = _count("head_dim", head_dim, 1)
        self._max_seq_len = _count("max_seq_len", max_seq_len, 1)
        self.dtype = _kina_dtype(dtype)
        B, H, Dh, T = self.batch, self.n_heads, self.head_dim, self._max_seq_len
        self._kt_buffer = runtime.zeros((B, H, Dh * T), self.dtype)
        self._stride = self._stride_for(1)
        self._v = runtime.zeros((B, H, T, Dh), self.dtype)
        self._n = 0
        self._kernels = _program("attention", self.dtype)
        # The in-place step's kernel call, prepared on this cache's buffers (again when
        # Kᵀ's stride grows): per step only the fill (a size in two descriptors), the
        # context's pointer and the query and scale values change (q and scale are
        # copied into fixed buffers).
        self._bytes_per_position = B * H * Dh * self.dtype.itemsize
        self._q = runtime.empty((B, H, 1, Dh), self.dtype)
        self._s = runtime.empty((1, 1, 1, 1), self.dtype)
        self._prepare()

    def __repr__(self) -> str:
        return (f"KVCache(batch={self.batch}, n_heads={self.n_heads}, head_dim={self.head_dim}, "
                f"max_seq_len={self._max_seq_len}, dtype={self.dtype}) with {self._n} filled")

    # -- Kᵀ's layout ---------------------------------------------------------------
    def _stride_for(self, n: int) -> int:
        """The row stride for a fill of n: a step above n while rows are short, else T_max."""
        T = self._max_seq_len
        stride = min(T, -(-n // KT_STRIDE_STEP) * KT_STRIDE_STEP)
        return stride if stride * self.dtype.itemsize <= KT_SHORT_ROW_BYTES else T

    def _kt(self, n: int) -> np.ndarray:
        """Kᵀ's first n positions, [B, H, Dh, n], a view with the current row stride."""
        it, T, Dh = self.dtype.itemsize, self._max_seq_len, self.head_dim
        return np.lib.stride_tricks.as_strided(
            self._kt_buffer, (self.batch, self.n_heads, Dh, n),
            (self.n_heads * Dh * T * it, Dh * T * it, self._stride * it, it))

    @property
    def _k(self) -> np.ndarray:
        """Every Kᵀ slot of the current layout, [B, H, Dh, stride]."""
        return self._kt(self._stride)

    def _make_room(self, n: int) -> None:
        """Widen Kᵀ's row stride if n positions do not fit."""
        if n > self._stride:
            self._restride(self._stride_for(n))

    def _restride(self, new: int) -> None:
        """Give Kᵀ the row stride `new`, moving the filled part of every row (rows that move
        up go last first, rows that move down first first, so none overwrites another)."""
        if new == self._stride:
            return
        old, filled, flat = self._stride, self._n, self._kt_buffer
        if filled:
            rows = range(self.head_dim - 1, 0, -1) if new > old else range(1, self.head_dim)
            for d in rows:
                flat[:, :, d * new:d * new + filled] = flat[:, :, d * old:d * old + filled]
        self._stride = new
        self._prepare()

    def _prepare(self) -> None:
        B, H, Dh = self.batch, self.n_heads, self.head_dim
        self._call = self._kernels.attend.prepare([self._q, self._k, self._v, self._s],
                                                  [runtime.empty((B, H, 1, Dh), self.dtype)])
        self._split_calls: tuple[int, list] | None = None  # (threads, [(call, where), ...])

    # -- fill and capacity -------------------------------------------------------
    @property
    def n_filled(self) -> int:
        return self._n

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    @property
    def fill_ratio(self) -> float:
        return self._n / self._max_seq_len

    @property
    def bytes_per_token(self) -> int:
        """The K and V bytes one position takes."""
        return 2 * self.batch * self.n_heads * self.head_dim * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self._kt_buffer.nbytes + self._v.nbytes

    def clear(self) -> None:
        """Start a new sequence. The old data stays in the (now unused) slots and is never read."""
        self._n = 0
        self._restride(self._stride_for(1))

    def crop(self, n: int) -> None:
        """Roll back to the first `n` positions, as if nothing past them had been appended."""
        n = _count("n", n, 0)
        if n > self._n:
            raise ValueError(f"crop: n={n} is past the fill: only {self._n} positions are filled")
        self._n = n
        if n == 0:  # as clear(); otherwise the stride stays (a rollback is often followed by regrowth)
            self._restride(self._stride_for(1))

    # -- writing -------------------------------------------------------------
    def _check(self, where: str, name: str, a, dims: tuple) -> None:
        """`a` must be an ndarray of the cache's dtype with shape `dims` (None: any size)."""
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{where}: {name} must be a numpy.ndarray, got {type(a).__name__}")
        if a.dtype != self.dtype:
            raise TypeError(f"{where}: {name} must have dtype {self.dtype} (the cache's), got {a.dtype}")
        shape = a.shape
        ok = len(shape) == len(dims)
        for d, got in zip(dims, shape):
            ok = ok and (d is None or d == got)
        if not ok:
            want = _shape_str("n" if d is None else d for d in dims)
            raise ValueError(f"{where}: {name} must have shape {want}, got {_shape_str(a.shape)}")

    def _check_kv(self, where: str, k_new, v_new) -> int:
        B, H, Dh = self.batch, self.n_heads, self.head_dim
        self._check(where, "k_new", k_new, (B, H, Dh, None))
        self._check(where, "v_new", v_new, (B, H, None, Dh))
        n = k_new.shape[3]
        if v_new.shape[2] != n:
            raise ValueError(f"{where}: k_new holds {n} positions (dim 3) but v_new holds {v_new.shape[2]} (dim 2)")
        if self._n + n > self._max_seq_len:
            raise CacheFullError(self._n, self._max_seq_len, n)
        return n

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> int:
        """Write k_new [B, H, Dh, n] and v_new [B, H, n, Dh] at the fill position; return that position."""
        return self._write(k_new, v_new, self._check_kv("append", k_new, v_new))

    def _write(self, k_new: np.ndarray, v_new: np.ndarray, n: int) -> int:
        p = self._n
        self._make_room(p + n)
        self._kt(p + n)[..., p:] = k_new
        self._v[:, :, p:p + n, :] = v_new
        self._n = p + n
        return p

    # -- reading -------------------------------------------------------------
    def keys(self) -> np.ndarray:
        """A read-only view of the filled Kᵀ, [B, H, Dh, n_filled]."""
        view = self._kt(self._n)
        view.flags.writeable = False
        return view

    def values(self) -> np.ndarray:
        """A read-only view of the filled V, [B, H, n_filled, Dh]."""
        view = self._v[:, :, :self._n, :]
        view.flags.writeable = False
        return view

    def _index(self, where: str, head, pos, dim, batch) -> tuple[int, int, int, int]:
        out = []
        for name, value, bound, what in [("batch", batch, self.batch, "batch"), ("head", head, self.n_heads, "n_heads"),
                                         ("pos", pos, self._n, "n_filled"), ("dim", dim, self.head_dim, "head_dim")]:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__}")
            if not 0 <= value < bound:
                raise IndexError(f"{where}: {name} {value} is out of range: expected 0 <= {name} < {what} = {bound}")
            out.append(int(value))
        return tuple(out)

    def k_at(self, head: int, pos: int, dim: int, batch: int = 0):
        """The key component `dim` of `head` at filled position `pos`."""
        b, h, p, d = self._index("k_at", head, pos, dim, batch)
        return self._kt(self._n)[b, h, d, p]

    def v_at(self, head: int, pos: int, dim: int, batch: int = 0):
        """The value component `dim` of `head` at filled position `pos`."""
        b, h, p, d = self._index("v_at", head, pos, dim, batch)
        return self._v[b, h, p, d]

    # -- attention (compiled Kina, over the filled prefix only) ----------------
    def _query(self, where: str, q) -> None:
        self._check(where, "q", q, (self.batch, self.n_heads, 1, self.head_dim))

    def _scale(self, where: str, scale) -> float:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise TypeError(f"{where}: scale must be a real number, got {type(scale).__name__}")
        if not math.isfinite(scale):
            raise ValueError(f"{where}: scale must be finite, got {scale}")
        return scale

    def score(self, q: np.ndarray) -> np.ndarray:
        """q [B, H, 1, Dh] -> pre-softmax scores q·k [B, H, 1, n_filled]."""
        self._query("score", q)
        return self._kernels.score(q, self._kt(self._n))[0]

    def apply(self, weights: np.ndarray) -> np.ndarray:
        """weights [B, H, 1, n_filled] -> their sum of the filled values, [B, H, 1, Dh]."""
        self._check("apply", "weights", weights, (self.batch, self.n_heads, 1, self._n))
        return self._kernels.apply(weights, self._v[:, :, :self._n, :])[0]

    def attend(self, q: np.ndarray, scale: float) -> np.ndarray:
        """softmax(q·k * scale) over the filled positions, applied to V: context [B, H, 1, Dh]."""
        self._query("attend", q)
        s = self._scale("attend", scale)
        if self._n == 0:
            raise ValueError("attend: the cache is empty (n_filled = 0): append at least one position first")
        return self._attend(q, s)

    def _attend(self, q: np.ndarray, scale: float) -> np.ndarray:
        # Every argument is known good here (q checked by the caller, the rest built by
        # this cache), so the kernel is called without the runtime's per-call checks:
        # one prepared call (or one per thread) on the cache's buffers, whose
        # descriptors get only the fill and the context's pointer patched.
        n = self._n
        out = np.empty((self.batch, self.n_heads, 1, self.head_dim), self.dtype)
        self._s[0, 0, 0, 0] = scale
        self._q[...] = q
        if self.threads > 1 and 2 * n * self._bytes_per_position >= runtime.PARALLEL_MIN_BYTES:
            parts = self._parts()
            if parts:
                for call, where in parts:
                    self._patch(call, n, out[where])
                runtime.call_concurrently([call for call, _ in parts])
                return out
        self._patch(self._call, n, out)
        self._call()
        return out

    @staticmethod
    def _patch(call, n: int, out: np.ndarray) -> None:
        call.set_size(1, 3, n)  # K^T [B, H, Dh, n]
        call.set_size(2, 2, n)  # V [B, H, n, Dh]
        call.set_data(4, out)

    def _parts(self) -> list:
        """Prepared calls on the runtime's split of the cache's buffers (by batch, else by
        heads: the parts a split call would run), each with the index of the context
        it writes; made once per thread count."""
        if self._split_calls is None or self._split_calls[0] != self.threads:
            attend = self._kernels.attend
            context = np.empty((self.batch, self.n_heads, 1, self.head_dim), self.dtype)
            split = attend.split([self._q, self._k, self._v, self._s], [context], self.threads) or []
            parts = [(attend.prepare(arrays, outs), where) for arrays, outs, where in split]
            self._split_calls = (self.threads, parts)
        return self._split_calls[1]

    def step(self, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, scale: float) -> np.ndarray:
        """The Section 19 step in place: append k_new and v_new, then attend with q."""
        self._query("step", q)
        s = self._scale("step", scale)
        n = self._check_kv("step", k_new, v_new)  # everything is checked before the cache changes
        if self._n + n == 0:
            raise ValueError("step: the cache is empty (n_filled = 0) and k_new/v_new add no position")
        self._write(k_new, v_new, n)
        return self._attend(q, s)


# -- prefill -------------------------------------------------------------------

def causal_mask(n_past: int, n_new: int, dtype=np.float32) -> np.ndarray:
    """The additive mask [1, 1, n_new, n_past + n_new]: query i sees keys 0 .. n_past + i."""
    n_past, n_new = _count("n_past", n_past, 0), _count("n_new", n_new, 1)
    cols = np.arange(n_past + n_new)
    rows = np.arange(n_new)[:, None] + n_past
    return np.where(cols <= rows, 0.0, -np.inf).astype(_kina_dtype(dtype))[None, None]


def prefill(cache: KVCache, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, scale: float) -> np.ndarray:
    """Attend P new positions causally (after the cache's filled ones), then append them.

    q and v_new are [B, H, P, Dh], k_new is [B, H, Dh, P]. Returns the context
    [B, H, P, Dh]. Runs examples/storylm0_prefill.kina; the cache is unchanged on error.
    """
    n = cache._check_kv("prefill", k_new, v_new)
    if n == 0:
        raise ValueError("prefill: k_new and v_new hold no positions: expected P >= 1")
    cache._check("prefill", "q", q, (cache.batch, cache.n_heads, n, cache.head_dim))
    s = np.full((1, 1, 1, 1), cache._scale("prefill", scale), cache.dtype)
    kernel = _program("prefill", cache.dtype).prefill
    past = cache.n_filled
    k_all, v_all, context = kernel(q, cache.keys(), k_new, cache.values(), v_new, causal_mask(past, n, cache.dtype), s)
    cache.append(k_all[..., past:], v_all[:, :, past:, :])  # the program's Kᵀ and V seed the cache
    return context


def causal_attention(q: np.ndarray, k_t: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Full causal attention over P positions, no cache: q, v [B, H, P, Dh], k_t [B, H, Dh, P] -> context.

    The same program as `prefill` with an empty past; the runtime checks the shapes.
    """
    if not isinstance(k_t, np.ndarray):
        raise TypeError(f"causal_attention: k_t must be a numpy.ndarray, got {type(k_t).__name__}")
    if k_t.ndim != 4:
        raise ValueError(f"causal_attention: k_t must have shape [B, H, Dh, P], got {_shape_str(k_t.shape)}")
    dtype = _kina_dtype(k_t.dtype)
    P = k_t.shape[3]
    if P == 0:
        raise ValueError("causal_attention: k_t holds no positions: expected P >= 1")
    s = np.full((1, 1, 1, 1), scale, dtype)
    empty_v = np.zeros((*k_t.shape[:2], 0, k_t.shape[2]), dtype)
    return _program("prefill", dtype).prefill(q, k_t[..., :0], k_t, empty_v, v, causal_mask(0, P, dtype), s)[2]


# -- a tiny decoder-only model ---------------------------------------------------

@dataclass
class Generation:
    """What `TinyDecoder.trace` returns: the tokens, the logits that chose them, the time of each step."""

    tokens: list[int]
    logits: np.ndarray  # [n_new, vocab_size]
    step_seconds: list[float] = field(default_factory=list)


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


class TinyDecoder:
    """A deterministic decoder-only transformer with seeded random weights.

    Per layer: RMS norm, multi-head causal self-attention (compiled Kina), a
    residual, RMS norm, a ReLU MLP, a residual. Embedding, projections, MLP and
    the output head run on the host in NumPy; the weights depend on `seed` and the
    sizes, never on `max_seq_len`, which only bounds the sequence length.
    """

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, max_seq_len: int,
                 seed: int = 0, dtype=np.float32):
        self.vocab_size = _count("vocab_size", vocab_size, 1)
        self.d_model = _count("d_model", d_model, 1)
        self.n_heads = _count("n_heads", n_heads, 1)
        self.n_layers = _count("n_layers", n_layers, 1)
        self.max_seq_len = _count("max_seq_len", max_seq_len, 1)
        self.seed = _count("seed", seed, 0)
        self.dtype = _kina_dtype(dtype)
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

    def _tokens(self, name: str, tokens) -> list[int]:
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (Sequence, np.ndarray)):
            raise TypeError(f"{name}: expected a sequence of token ids, got {type(tokens).__name__}")
        out = []
        for i, t in enumerate(tokens):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise TypeError(f"{name}[{i}]: expected an int token id, got {type(t).__name__}")
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"{name}[{i}]: token id {t} is out of range: expected 0 <= id < vocab_size "
                                 f"= {self.vocab_size}")
            out.append(int(t))
        return out

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

    # -- generation -----------------------------------------------------------
    def trace(self, prompt_tokens: Sequence[int], n_new: int, use_cache: bool = True,
              on_step: Callable[[int, int, float], None] | None = None) -> Generation:
        """Greedy generation, keeping each step's logits and time; `on_step(i, token, seconds)` after each."""
        prompt = self._tokens("prompt_tokens", prompt_tokens)
        n_new = _count("n_new", n_new, 0)
        if not prompt:
            raise ValueError("prompt_tokens: expected at least one token to continue from")
        needed = len(prompt) + n_new - 1  # the last generated token is never fed back
        if n_new and needed > self.max_seq_len:
            raise ValueError(f"n_new: {len(prompt)} prompt tokens + {n_new} new need {needed} positions, "
                             f"more than max_seq_len = {self.max_seq_len}")
        tokens, rows, seconds = list(prompt), [], []
        caches = self.new_cache() if use_cache else None
        for i in range(n_new):
            t0 = time.perf_counter()
            if not use_cache:
                logits = self.recompute(tokens)
            elif i == 0:
                logits = self.prefill(prompt, caches)
            else:
                logits = self.step(tokens[-1], caches)
            token = int(np.argmax(logits))
            seconds.append(time.perf_counter() - t0)
            tokens.append(token)
            rows.append(logits)
            if on_step is not None:
                on_step(i, token, seconds[-1])
        logits = np.stack(rows) if rows else np.zeros((0, self.vocab_size), self.dtype)
        return Generation(tokens[len(prompt):], logits, seconds)

    def generate(self, prompt_tokens: Sequence[int], n_new: int, use_cache: bool = True) -> list[int]:
        """The n_new greedy (argmax) token ids that follow `prompt_tokens`."""
        return self.trace(prompt_tokens, n_new, use_cache).tokens


from .storylm import NumPyStoryLM, StoryCache, StoryLM  # noqa: E402  (storylm imports this module's names, last)
