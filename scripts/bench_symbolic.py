#!/usr/bin/env python3
"""Benchmark the cost of symbolic dims (issue 4): the symbolic step against the static one.

    .venv/bin/python scripts/bench_symbolic.py                      # B=1 H=8 Dh=64, S in 127 511 2047
    .venv/bin/python scripts/bench_symbolic.py --sizes 1x8x64x4095 --rounds 31

For each size it compiles the static program (examples/storylm0_kv_step_dyn.kina with
B, H, Dh and S written as integers: the same body, the same pass pipeline) and uses
the one symbolic .so of the example for every size. Both are called through
`Function.call_unchecked` with inputs bound once and results preallocated (the kernel),
and through the public call `mod.kv_step(...)` (argument checks and fresh result
arrays; information only). Static and symbolic are timed interleaved in one run
(benchlib.timing.run_rounds): every round times a batch of each, in an order rotated
each round, and the table shows the medians over rounds and the symbolic/static ratio. The target is a kernel ratio
of at most 1.15. Before timing, the two are checked to agree bit for bit.

This is a benchmark, not a test: it never fails the suite. It exits 1 only when
the results differ.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from benchlib.timing import InputSets, Variant, best, run_rounds

ROOT = Path(__file__).resolve().parent.parent
DYN = ROOT / "examples" / "storylm0_kv_step_dyn.kina"
TARGET = 1.15


def inputs(B, H, Dh, S, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    return (r(B, H, 1, Dh), r(B, H, Dh, S), r(B, H, Dh, 1), r(B, H, S, Dh), r(B, H, 1, Dh),
            np.full((1, 1, 1, 1), 1 / np.sqrt(Dh), np.float32))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1x8x64x127,1x8x64x511,1x8x64x2047", help="BxHxDhxS, comma-separated")
    p.add_argument("--rounds", type=int, default=21, help="interleaved rounds per size (the median is taken)")
    p.add_argument("--batch-ms", type=float, default=20.0, help="target length of one timed batch")
    args = p.parse_args(argv)
    import kina
    from kina import knobs
    knobs.set("KINA_NO_CACHE", "1")  # measure what the current compiler builds
    from kina.runtime import bind, result_shapes

    dyn = kina.compile_file(DYN).kv_step
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    print(f"symbolic {DYN.relative_to(ROOT)} vs the same program with static dims; "
          f"{args.rounds} interleaved rounds, medians per call")
    print(f"{'B':>2} {'H':>3} {'Dh':>4} {'S':>5} | {'static us':>10} {'symbolic us':>12} {'ratio':>6} | "
          f"{'static fn() us':>15} {'symbolic fn() us':>17} {'ratio':>6}")
    worst, status = 0.0, 0
    for B, H, Dh, S in sizes:
        static = kina.compile_file(DYN, dims=dict(B=B, H=H, Dh=Dh, S=S)).kv_step
        xs = inputs(B, H, Dh, S)
        want, got = static(*xs), dyn(*xs)
        if not all(np.array_equal(a, b) for a, b in zip(want, got)):
            print(f"  results differ at B={B} H={H} Dh={Dh} S={S}: static and symbolic must agree bit for bit")
            status = 1
        kernels = {}
        for name, fn in (("static", static), ("symbolic", dyn)):
            arrays, env = bind(fn.signature, xs)
            outs = [np.empty(s, np.float32) for s in result_shapes(fn.signature, env)]
            kernels[name] = (lambda fn=fn, arrays=arrays, outs=outs: fn.call_unchecked(arrays, outs))
        full = {"static fn": lambda: static(*xs), "symbolic fn": lambda: dyn(*xs)}
        n = max(1, int(args.batch_ms / 1000 / max(best(kernels["static"], 3), 1e-7)))
        one_set = InputSets([xs], 0)  # the same inputs every call: this compares two kernels, not the memory
        variants = [Variant(name, one_set, lambda _, call=call: call()) for name, call in {**kernels, **full}.items()]
        run_rounds(variants, args.rounds, n)
        med = {v.name: statistics.median(v.samples) * 1e6 for v in variants}
        ratio, ratio_fn = med["symbolic"] / med["static"], med["symbolic fn"] / med["static fn"]
        worst = max(worst, ratio)
        print(f"{B:>2} {H:>3} {Dh:>4} {S:>5} | {med['static']:>10.2f} {med['symbolic']:>12.2f} {ratio:>6.3f} | "
              f"{med['static fn']:>15.2f} {med['symbolic fn']:>17.2f} {ratio_fn:>6.3f}")
    verdict = "met" if worst <= TARGET else "NOT met"
    print(f"worst kernel ratio symbolic/static: {worst:.3f} (target <= {TARGET}: {verdict})")
    return status


if __name__ == "__main__":
    sys.exit(main())
