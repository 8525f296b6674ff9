"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p.

In:  a `Sampler(temperature=0.0, top_k=0, top_p=1.0, seed=None)`; then logits [V].
Out: `Sampler.chooser()`, a function logits -> token id with its own seeded
     generator, for `Decoder.stream(choose=...)`; `Sampler.probabilities(logits)`,
     the distribution it samples from.

Guarantees: temperature 0 (the default) is greedy, the argmax, as is top_k = 1.
Otherwise the logits (in float64) are divided by the temperature, cut to the top_k
largest (0: all), then to the smallest set of the most likely tokens whose
probability reaches top_p (always at least one), renormalised and sampled with
`numpy.random.default_rng(seed)`: the same seed and logits give the same tokens.
A bad setting is a ValueError naming it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import generation


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature: expected a finite number >= 0 (0: greedy), got {t!r}")
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"top_k: expected an int >= 0 (0: no cut), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1:
            raise ValueError(f"top_p: expected a number in (0, 1], got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)
                                      or self.seed < 0):
            raise ValueError(f"seed: expected an int >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The distribution [V] (float64) that sampling draws from (greedy: one-hot at the argmax)."""
        z = np.asarray(logits, np.float64).ravel()
        if self.greedy:
            out = np.zeros_like(z)
            out[np.argmax(z)] = 1.0
            return out
        z = z / self.temperature
        if 0 < self.top_k < z.size:
            cut = np.partition(z, -self.top_k)[-self.top_k]
            z = np.where(z >= cut, z, -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        if self.top_p < 1:
            order = np.argsort(-p, kind="stable")
            cumulative = np.cumsum(p[order])
            keep = order[:int(np.searchsorted(cumulative, self.top_p)) + 1]  # reach top_p, at least one
            kept = np.zeros_like(p)
            kept[keep] = p[keep]
            p = kept / kept.sum()
        return p

    def chooser(self) -> Callable[[np.ndarray], int]:
        """logits -> token id, drawing from a generator seeded once, here."""
        if self.greedy:
            return generation.greedy
        rng = np.random.default_rng(self.seed)

        def choose(logits: np.ndarray) -> int:
            p = self.probabilities(logits)
            return int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right").clip(0, p.size - 1))
        return choose
