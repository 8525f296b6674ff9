"""The decode runtime: a preallocated KV cache, prefill, and greedy generation.

In:  NumPy arrays in the Kina attention layouts (Kᵀ [B, H, Dh, n], V [B, H, n, Dh],
     queries [B, H, 1, Dh]) and, for `TinyDecoder`, token ids.
Out: `KVCache`, one attention layer's keys and values in buffers of T_max
     positions, with in-place append and attention over the filled prefix; and
     `TinyDecoder`, a seeded decoder-only model whose `generate` returns greedy
     token ids, with the cache (prefill, then one in-place step per token) or
     without it (full causal attention recomputed at every step).

Guarantees:
  - Attention runs compiled Kina (attention.kina, and the prefill in
    prefill.kina, which examples/storylm0_prefill.kina links to), compiled
    once per dtype (F16, BF16 as `ml_dtypes.bfloat16`, F32, F64). It is given only
    the filled prefix, so its cost is linear in n_filled, never in T_max, and the
    unused slots (zeros, stale data, NaN) never change a result.
  - `KVCache.attend` computes exactly what the functional StoryLM-0 decode step
    (examples/storylm0_kv_step_dyn.kina) computes, bit for bit.
  - A failed call changes nothing: `append` raises `CacheFullError` before
    writing, and `step` checks all of its arguments before it appends.
  - Every user error is a ValueError, TypeError or IndexError naming the
    parameter; `CacheFullError` is a ValueError.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ... import runtime
from ..generation import causal_mask, count, kina_dtype, shape_str
from . import kernel_program


class CacheFullError(ValueError):
    """An append that does not fit; the cache is left exactly as it was."""

    def __init__(self, n_filled: int, max_seq_len: int, requested: int):
        self.n_filled, self.max_seq_len, self.requested = n_filled, max_seq_len, requested
        super().__init__(f"KV cache is full: {n_filled} of {max_seq_len} positions are filled, so {requested} more "
                         f"do not fit ({max_seq_len - n_filled} free)")


# While Kᵀ rows are short, their stride stays within this many positions above the
# fill (the rows are moved apart when the fill passes it), up to rows of this many
# bytes: short rows nearly back to back are read one at a time, as one stream, at
# close to a contiguous read (matmul-loops), where the same rows T_max apart read
# much slower. Longer rows go 8 at a time, which does not mind the gap, so they get
# the stride T_max at once. The figures: docs/performance.md, "The Kᵀ layout".
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
    `runtime.default_threads()`), through the kernel's threaded entry, with the same bits
    as on one.
    """

    def __init__(self, batch: int, n_heads: int, head_dim: int, max_seq_len: int, dtype=np.float32,
                 threads: int | None = None):
        self.threads = runtime.default_threads() if threads is None else count("threads", threads, 1)
        self.batch = count("batch", batch, 1)
        self.n_heads = count("n_heads", n_heads, 1)
        self.head_dim = count("head_dim", head_dim, 1)
        self._max_seq_len = count("max_seq_len", max_seq_len, 1)
        self.dtype = kina_dtype(dtype)
        B, H, Dh, T = self.batch, self.n_heads, self.head_dim, self._max_seq_len
        self._kt_buffer = runtime.zeros((B, H, Dh * T), self.dtype)
        self._stride = self._stride_for(1)
        self._v = runtime.zeros((B, H, T, Dh), self.dtype)
        self._n = 0
        self._kernels = kernel_program("attention", self.dtype)
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
                                                  [runtime.empty((B, H, 1, Dh), self.dtype)], dims=("N",))

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
        n = count("n", n, 0)
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
            want = shape_str("n" if d is None else d for d in dims)
            raise ValueError(f"{where}: {name} must have shape {want}, got {shape_str(a.shape)}")

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
        # one prepared call on the cache's buffers, whose descriptors get only the fill
        # and the context's pointer patched, on `threads` threads from THREADED_MIN_BYTES.
        n = self._n
        out = np.empty((self.batch, self.n_heads, 1, self.head_dim), self.dtype)
        self._s[0, 0, 0, 0] = scale
        self._q[...] = q
        self._call.threads = self.threads if 2 * n * self._bytes_per_position >= runtime.THREADED_MIN_BYTES else 1
        self._patch(self._call, n, out)
        self._call()
        return out

    @staticmethod
    def _patch(call, n: int, out: np.ndarray) -> None:
        call.set_dim("N", n)  # K^T [B, H, Dh, N], V [B, H, N, Dh]
        call.set_data("out0", out)

    def step(self, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, scale: float) -> np.ndarray:
        """The StoryLM-0 decode step in place: append k_new and v_new, then attend with q."""
        self._query("step", q)
        s = self._scale("step", scale)
        n = self._check_kv("step", k_new, v_new)  # everything is checked before the cache changes
        if self._n + n == 0:
            raise ValueError("step: the cache is empty (n_filled = 0) and k_new/v_new add no position")
        self._write(k_new, v_new, n)
        return self._attend(q, s)


# -- prefill -------------------------------------------------------------------

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
    kernel = kernel_program("prefill", cache.dtype).prefill
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
        raise ValueError(f"causal_attention: k_t must have shape [B, H, Dh, P], got {shape_str(k_t.shape)}")
    dtype = kina_dtype(k_t.dtype)
    P = k_t.shape[3]
    if P == 0:
        raise ValueError("causal_attention: k_t holds no positions: expected P >= 1")
    s = np.full((1, 1, 1, 1), scale, dtype)
    empty_v = np.zeros((*k_t.shape[:2], 0, k_t.shape[2]), dtype)
    return kernel_program("prefill", dtype).prefill(q, k_t[..., :0], k_t, empty_v, v, causal_mask(0, P, dtype), s)[2]
