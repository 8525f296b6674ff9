"""Timing that a shared, noisy machine cannot fool easily: rotated inputs, interleaved rounds.

In:  variants (a name, a run(item) to time, the input sets it rotates through and untimed
     hooks), or plain callables.
Out: the seconds of every sample (Variant.samples), or the best or the median of them.
Guarantees: in run_rounds every repeat visits every variant, in an order rotated by one
each repeat, so a slow spell of the machine falls on all of them rather than on one; the
garbage collector is off while samples are timed (and back on after, whatever happens);
each sample is preceded by one untimed call of the same variant on another input set, so
the timed calls find the cache as a loop of that variant leaves it: they pay for writing
back their own predecessor's dirty lines, never another variant's.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

SETTLE_S = 0.1  # after a multi-threaded torch/ort/llama.cpp run: let their idle workers stop spinning


@dataclass
class InputSets:
    """Independent input sets, handed out round robin by one counter that its variants share,
    so no call finds its data left in cache by the previous one."""

    sets: list
    nbytes_each: int
    _next: int = 0

    def take(self, n: int) -> list:
        out = []
        for _ in range(n):
            out.append(self.sets[self._next % len(self.sets)])
            self._next += 1
        return out


def n_sets_for(nbytes_each: int, working_set: int) -> int:
    """Enough sets of nbytes_each to cover working_set, and never fewer than two."""
    return max(2, math.ceil(working_set / nbytes_each))


def copies(a, working_set: int) -> list:
    """Copies of array `a` covering working_set (never fewer than two), each a view of one
    buffer starting on a 64-byte line (kina.runtime.empty), so that a call on one finds
    the others' bytes out of the cache."""
    import numpy as np
    from kina.runtime import empty
    per = -(-a.size * a.itemsize // 64) * 64 // a.itemsize
    n = n_sets_for(a.nbytes, working_set)
    slab = empty((n * per,), a.dtype)
    out = [slab[i * per:i * per + a.size].reshape(a.shape) for i in range(n)]
    for c in out:  # the same values in every copy (the bytes are what is timed)
        np.copyto(c, a)
    return out


@dataclass
class Variant:
    name: str
    inputs: InputSets
    run: Callable  # run(item) -> None, timed
    prepare: Callable | None = None  # prepare(item), not timed
    before: Callable | None = None  # once before each sample, not timed (e.g. thread count)
    after: Callable | None = None  # once after each sample, not timed
    ref: str = "numpy"  # the variant its ratio is taken against
    floor: str = "functional"  # which bytes it moves: "functional" or "in place" (see floor.py)
    group: str = "one-off"  # "one-off", "host loop" or "in place"
    threads: int = 1  # the threads it may use: its floor is that many threads'
    # result(item) -> (k_next, v_next, context): one untimed call for the spot check, or None
    result: Callable | None = None
    samples: list[float] = field(default_factory=list)


def written(run: Callable) -> Callable:
    """result() of a variant that writes into its set's preallocated results."""
    def result(d):
        run(d)
        return d["k_next"], d["v_next"], d["context"]
    return result


def _call(v: Variant, items: list, timed: bool) -> float:
    """Run v over items (the first untimed when `timed`): seconds per timed call."""
    for item in items:
        if v.prepare:
            v.prepare(item)
    if v.before:
        v.before()
    first, rest = (items[0], items[1:]) if timed else (None, items)
    if first is not None:
        v.run(first)
    t = time.perf_counter()
    for item in rest:
        v.run(item)
    dt = (time.perf_counter() - t) / max(1, len(rest))
    if v.after:
        v.after()
    return dt


def run_rounds(variants: list[Variant], repeats: int, inner: int) -> None:
    """One untimed pass of every variant over all its sets (code, pages, thread pools,
    allocators), then `repeats` interleaved rounds; each sample is the mean of `inner`
    consecutive calls, after one untimed call (see the module docstring)."""
    for v in variants:
        _call(v, v.inputs.take(max(inner, len(v.inputs.sets))), timed=False)
    gc.disable()
    try:
        for rep in range(repeats):
            k = rep % len(variants)
            for v in variants[k:] + variants[:k]:
                v.samples.append(_call(v, v.inputs.take(inner + 1), timed=True))
    finally:
        gc.enable()


def interleaved(runs: dict[str, Callable], repeats: int) -> dict[str, list]:
    """{name: [run() of each repeat]}: every run once untimed, then `repeats` rounds that
    call each in turn (for runs that time themselves, as a model's generation does)."""
    for run in runs.values():
        run()  # faults the pages in, warms thread pools
    out: dict[str, list] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            out[name].append(run())
    return out


def medians(rows: list[dict]) -> dict:
    """The median of each numeric field over rows of the same keys (other fields are left out)."""
    return {k: statistics.median(r[k] for r in rows) for k, v in rows[0].items() if isinstance(v, (int, float))}


def best(fn: Callable, repeats: int, after: Callable = lambda: None) -> float:
    """The fastest of `repeats` timed calls of fn (calling `after` after each, untimed):
    noise only ever adds time, so the fastest is the closest to what the code costs."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        after()
    return min(times)


def busy_wait(seconds: float) -> None:
    """Wait without sleeping: a core that sleeps here runs the next variant slower (see
    docs/performance.md, "Waiting between variants")."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def fresh_compiles():
    """Build with KINA_NO_CACHE=1: the compile cache's key does not cover every source of the
    compiler, so while the compiler is being changed a cache hit could measure an older kernel."""
    from kina import knobs
    return knobs.scoped(KINA_NO_CACHE=1)
