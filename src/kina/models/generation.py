"""The generation loop every model shares, and the small checks the models use.

In:  NumPy dtypes and sizes as users give them; logits.
Out: `kina_dtype`, `count` (checked arguments); `causal_mask`; `count_nan` and `greedy`
     (isnan and argmax, fast over F16 and BF16 too); `Generation`; and `Generator`, the
     generation loop (greedy, or any `choose`) over any model with `prefill`, `step`,
     `recompute` and `new_cache`.

Guarantees: a bad argument is a TypeError or ValueError naming the parameter. This
module is imported by every model and imports none of them, so the models form no
cycle. Nothing here imports `mlir` or `lark`.
"""
from __future__ import annotations

import numbers
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .. import runtime

class _ModelDtypes(Mapping):
    """NumPy dtype -> Kina name of the dtypes a model computes in: F16, BF16 (ml_dtypes.bfloat16),
    F32, F64. Looking one up imports nothing (`runtime.arrays.kina_name`); only listing the keys
    imports ml_dtypes, whose extension takes 0.5-1.3 s to load, which a model in F32 never needs."""

    NAMES = ("F16", "BF16", "F32", "F64")

    def __getitem__(self, dt) -> str:
        name = runtime.arrays.kina_name(dt)
        if name not in self.NAMES:
            raise KeyError(dt)
        return name

    def __iter__(self):
        return iter([runtime.numpy_dtype(name) for name in self.NAMES])

    def __len__(self) -> int:
        return len(self.NAMES)

    def values(self):
        return self.NAMES


KINA_DTYPES = _ModelDtypes()


def kina_dtype(dtype, name: str = "dtype") -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name}: expected a NumPy floating dtype, got {dtype!r}") from None
    if dt not in KINA_DTYPES:
        raise TypeError(f"{name}: expected float16, bfloat16 (ml_dtypes), float32 or float64, got {dt}")
    return dt


def count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def shape_str(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def causal_mask(n_past: int, n_new: int, dtype=np.float32, window: int | None = None) -> np.ndarray:
    """The additive mask [1, 1, n_new, n_past + n_new]: query i sees keys 0 .. n_past + i, and with
    a sliding `window` only the last `window` of them (key j when j > n_past + i - window, as
    transformers' sliding-window mask)."""
    n_past, n_new = count("n_past", n_past, 0), count("n_new", n_new, 1)
    cols = np.arange(n_past + n_new)
    rows = np.arange(n_new)[:, None] + n_past
    seen = cols <= rows
    if window is not None:
        seen &= cols > rows - count("window", window, 1)
    return np.where(seen, 0.0, -np.inf).astype(kina_dtype(dtype))[None, None]


# A 16-bit float's bits as an int16: +inf's (larger magnitudes are NaN). NumPy's isnan and argmax
# loop over F16 one value at a time, converting each: over SmolLM's 49152 logits 35 and 225 us
# (2.5% of its F16 step on two threads), against 4.6 and 3.0 over F32; BF16's (ml_dtypes) 23
# and 27 us. On the bits, as int16s, the same answers take about 5 and 11 us.
_INF_BITS = {"F16": 0x7C00, "BF16": 0x7F80}


def _inf_bits(dt: np.dtype) -> int | None:
    """+inf's bits if `dt` is F16 or BF16 (found without importing ml_dtypes), else None."""
    return _INF_BITS.get(runtime.arrays.kina_name(dt)) if dt.itemsize == 2 else None


def count_nan(logits: np.ndarray) -> int:
    """np.count_nonzero(np.isnan(logits)), from the bits for F16 and BF16."""
    logits = np.asarray(logits)
    inf = _inf_bits(logits.dtype)
    if inf is None:
        return int(np.count_nonzero(np.isnan(logits)))
    return int(np.count_nonzero((logits.view(np.int16) & 0x7FFF) > inf))


def greedy(logits: np.ndarray) -> int:
    """int(np.argmax(logits)), the first of the largest, for logits without NaN. F16 and BF16
    are compared by their bits: sign and magnitude, as an int16 whose magnitude bits are
    reversed where the sign is set, orders them as their values, but for -0 < +0."""
    logits = np.asarray(logits)
    if _inf_bits(logits.dtype) is None:
        return int(np.argmax(logits))
    bits = logits.view(np.int16)
    i = int(np.argmax(bits ^ ((bits >> 15) & 0x7FFF)))
    if bits.flat[i] & 0x7FFF == 0:  # the largest is a zero: -0 == +0, so the first of either
        i = int(np.flatnonzero((bits & 0x7FFF) == 0)[0])
    return i


@dataclass
class Generation:
    """What `TinyDecoder.trace` returns: the tokens, the logits that chose them, the time of each step."""

    tokens: list[int]
    logits: np.ndarray  # [n_new, vocab_size]
    step_seconds: list[float] = field(default_factory=list)


class Generator:
    """Greedy generation over a model's `prefill`, `step` and `recompute`.

    A subclass has `vocab_size`, `max_seq_len` and `dtype`, and defines
    `new_cache()`, `prefill(tokens, cache)`, `step(token, cache)` (each returning the
    logits after its last token) and `recompute(tokens)`.
    """

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

    # -- generation -----------------------------------------------------------
    def stream(self, prompt_tokens: Sequence[int], n_new: int, use_cache: bool = True,
               choose: Callable[[np.ndarray], int] | None = None) -> Iterator[tuple[int, np.ndarray, float]]:
        """Generate up to n_new tokens after `prompt_tokens`, yielding (token, the logits
        that chose it, seconds of the step) as each is chosen; the first step is the
        prefill. `choose(logits)` picks the token (default: argmax, greedy). The caller
        may stop early (at an end-of-sequence token) by leaving the loop."""
        prompt = self._tokens("prompt_tokens", prompt_tokens)
        n_new = count("n_new", n_new, 0)
        if not prompt:
            raise ValueError("prompt_tokens: expected at least one token to continue from")
        needed = len(prompt) + n_new - 1  # the last generated token is never fed back
        if n_new and needed > self.max_seq_len:
            raise ValueError(f"n_new: {len(prompt)} prompt tokens + {n_new} new need {needed} positions, "
                             f"more than max_seq_len = {self.max_seq_len}")
        return self._stream(prompt, n_new, use_cache, choose)

    def _stream(self, prompt, n_new, use_cache, choose):
        tokens = list(prompt)
        caches = self.new_cache() if use_cache else None
        for i in range(n_new):
            t0 = time.perf_counter()
            if not use_cache:
                logits = self.recompute(tokens)
            elif i == 0:
                logits = self.prefill(prompt, caches)
            else:
                logits = self.step(tokens[-1], caches)
            nan = count_nan(logits)
            if nan:  # argmax would pick the NaN: a token that looks real from a broken model
                raise FloatingPointError(f"generation step {i} (position {len(tokens) - 1}): {nan} of "
                                         f"{logits.size} logits are NaN; the weights or the inputs hold "
                                         "NaN or overflow (try a wider dtype)")
            token = greedy(logits) if choose is None else int(choose(logits))
            seconds = time.perf_counter() - t0
            tokens.append(token)
            yield token, logits, seconds

    def trace(self, prompt_tokens: Sequence[int], n_new: int, use_cache: bool = True,
              on_step: Callable[[int, int, float], None] | None = None) -> Generation:
        """Greedy generation, keeping each step's logits and time; `on_step(i, token, seconds)` after each."""
        tokens, rows, seconds = [], [], []
        for i, (token, logits, s) in enumerate(self.stream(prompt_tokens, n_new, use_cache)):
            tokens.append(token)
            rows.append(logits)
            seconds.append(s)
            if on_step is not None:
                on_step(i, token, s)
        logits = np.stack(rows) if rows else np.zeros((0, self.vocab_size), self.dtype)
        return Generation(tokens, logits, seconds)

    def generate(self, prompt_tokens: Sequence[int], n_new: int, use_cache: bool = True) -> list[int]:
        """The n_new greedy (argmax) token ids that follow `prompt_tokens`."""
        return self.trace(prompt_tokens, n_new, use_cache).tokens


