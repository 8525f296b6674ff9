#!/usr/bin/env python3
"""The runtime's two ways to run one call on two threads, against each other and one thread.

    .venv/bin/python scripts/ab_host_split.py [--rounds 15] [--threads 2] [--only kv_step,in_place,...]

A call of a function with independent leading axes (batch, heads) that moves at least
`kina.runtime.PARALLEL_MIN_BYTES` was split by the host: the parts' descriptors built in
Python, each part a call of the kernel on worker threads (`kina.runtime.workers`). A
function with a threaded entry (the threads pass) can run the same call inside the
kernel instead, the team's threads claiming parts of each op. This times, for each call:

    1T        the kernel on one thread
    host nT   the host's split along an independent axis (the threshold set to 0)
    entry nT  the threaded entry (the host's split turned off)

on the calls bench_kv_step.py times (the functional decode step, H x Dh 32x128 and 8x64,
S_past 127 to 8191; and KVCache's in-place step, a prepared call or one per part), a
batched step (B = 4), a batched matmul against a shared weight and a batched elementwise
op. Each sample is the mean of a few calls over inputs rotated through more memory than
the caches hold, the variants interleaved round by round (benchlib.timing); the median
of --rounds samples is printed, with each variant's results checked bit for bit against
one thread's. The machine is shared and noisy: compare figures of one run only.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

import kina
from benchlib.machine import MIB, ROOT
from benchlib.timing import InputSets, Variant, n_sets_for, run_rounds
from kina import runtime
from kina.runtime import calls

WORKING_SET = 256 * MIB
BATCHED_MATMUL = """
let f = fn(x: tensor<F32, [B, S, 576], @host>, w: tensor<F32, [576, 1536], @host>)
  -> (tensor<F32, [B, S, 1536], @host>) {
  (x @ w)
}
"""
BATCHED_ELEMENTWISE = """
let f = fn(x: tensor<F32, [B, N], @host>) -> (tensor<F32, [B, N], @host>) {
  (exp(x) - x / 2.0)
}
"""


def host_split(on: bool):
    """before/after hooks: the host's split for every call (on), or for none."""
    return lambda: setattr(calls, "PARALLEL_MIN_BYTES", 0 if on else 1 << 62)


def restore():
    calls.PARALLEL_MIN_BYTES = DEFAULT_MIN


DEFAULT_MIN = calls.PARALLEL_MIN_BYTES


def one_off(name: str, fn, make_args, threads: int, rng) -> tuple[list[Variant], callable]:
    """1T, host nT and entry nT of fn on input sets make_args(rng) bound once, results preallocated."""
    first = make_args(rng)
    arrays, env = runtime.bind(fn.signature, first, fn._plan)
    nbytes = sum(a.nbytes for a in arrays) + sum(np.prod(s) * 4 for s in fn._plan.result_shapes(env))
    sets = []
    for i in range(n_sets_for(int(nbytes), WORKING_SET)):
        args = first if i == 0 else make_args(rng)
        bound, env = runtime.bind(fn.signature, args, fn._plan)
        outs = [runtime.empty(s, d) for s, d in zip(fn._plan.result_shapes(env), fn._result_dtypes)]
        sets.append({"bound": bound, "outs": outs})
    inputs = InputSets(sets, int(nbytes))

    def run(n):
        return lambda d: fn.call_unchecked(d["bound"], d["outs"], n)
    variants = [Variant(f"{name} 1T", inputs, run(1), before=host_split(False), after=restore),
                Variant(f"{name} host {threads}T", inputs, run(threads), before=host_split(True), after=restore),
                Variant(f"{name} entry {threads}T", inputs, run(threads), before=host_split(False), after=restore)]

    def check():
        results = {}
        for v in variants:
            v.before()
            d = sets[0]
            for o in d["outs"]:
                o.fill(np.nan)
            v.run(d)
            results[v.name] = [o.copy() for o in d["outs"]]
            v.after()
        ref = results[variants[0].name]
        return {k: all(np.array_equal(a, b, equal_nan=True) for a, b in zip(r, ref)) for k, r in results.items()}
    return variants, check, nbytes


def kv_inputs(B, H, Dh, S):
    def make(rng):
        r = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
        return (r(B, H, 1, Dh), r(B, H, Dh, S), r(B, H, Dh, 1), r(B, H, S, Dh), r(B, H, 1, Dh),
                np.full((1, 1, 1, 1), 1 / np.sqrt(Dh), np.float32))
    return make


def in_place(name: str, B, H, Dh, n, threads: int, rng):
    """KVCache's attention over n filled positions: host nT runs one prepared call per part
    at once (call_concurrently, as KVCache does from PARALLEL_MIN_BYTES), entry nT one
    prepared call on the threaded entry (PreparedCall.threads)."""
    from kina.models import KVCache
    caches = []
    per = 2 * B * H * Dh * n * 4
    for _ in range(n_sets_for(per, WORKING_SET)):
        c = KVCache(B, H, Dh, n + 1, threads=threads)
        c.append(rng.standard_normal((B, H, Dh, n), dtype=np.float32),
                 rng.standard_normal((B, H, n, Dh), dtype=np.float32))
        c._q[...] = rng.standard_normal((B, H, 1, Dh), dtype=np.float32)
        c._s[...] = 0.125
        out = np.empty((B, H, 1, Dh), np.float32)
        entry = c._kernels.attend.prepare([c._q, c._k, c._v, c._s], [out], dims=("N",), threads=threads)
        entry.set_dim("N", n)
        one = c._kernels.attend.prepare([c._q, c._k, c._v, c._s], [out], dims=("N",), threads=1)
        one.set_dim("N", n)
        parts = c._parts()
        for call, where in parts:
            c._patch(call, n, out[where])
        caches.append({"one": one, "entry": entry, "parts": [call for call, _ in parts], "out": out})
    inputs = InputSets(caches, per)
    variants = [Variant(f"{name} 1T", inputs, lambda d: d["one"]()),
                Variant(f"{name} host {threads}T", inputs, lambda d: runtime.call_concurrently(d["parts"])),
                Variant(f"{name} entry {threads}T", inputs, lambda d: d["entry"]())]

    def check():
        got = {}
        for v in variants:
            d = caches[0]
            d["out"].fill(np.nan)
            v.run(d)
            got[v.name] = d["out"].copy()
        ref = got[variants[0].name]
        return {k: np.array_equal(r, ref, equal_nan=True) for k, r in got.items()}
    return variants, check, per


def cases(threads: int, rng, only):
    step = kina.compile_file(ROOT / "examples" / "storylm0_kv_step_dyn.kina").kv_step
    matmul = kina.compile_source(BATCHED_MATMUL, "batched_matmul.kina").f
    elementwise = kina.compile_source(BATCHED_ELEMENTWISE, "batched_elementwise.kina").f
    for H, Dh in ((32, 128), (8, 64)):
        for S in (127, 511, 2047, 8191):
            if "kv_step" in only:
                yield one_off(f"kv_step 1x{H}x{Dh} S={S}", step, kv_inputs(1, H, Dh, S), threads, rng)
            if "in_place" in only:
                yield in_place(f"in place 1x{H}x{Dh} n={S}", 1, H, Dh, S, threads, rng)
    if "batched" in only:
        yield one_off("kv_step 4x8x64 S=2047", step, kv_inputs(4, 8, 64, 2047), threads, rng)
        yield in_place("in place 4x8x64 n=2047", 4, 8, 64, 2047, threads, rng)
        yield one_off("matmul x[16, 128, 576] @ W", matmul,
                      lambda r: (r.standard_normal((16, 128, 576), dtype=np.float32),
                                 r.standard_normal((576, 1536), dtype=np.float32)), threads, rng)
        yield one_off("elementwise x[64, 65536]", elementwise,
                      lambda r: (r.standard_normal((64, 65536), dtype=np.float32),), threads, rng)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", default="kv_step,in_place,batched", help="comma-separated: kv_step, in_place, batched")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'call':<34} {'MiB':>7} {'1T us':>9} {'host':>9} {'entry':>9}  entry/host  same bits")
    for variants, check, nbytes in cases(args.threads, rng, set(args.only.split(","))):
        same = check()
        inner = max(2, min(20, int(64 * MIB // max(nbytes, 1))))
        run_rounds(variants, args.rounds, inner)
        med = [statistics.median(v.samples) * 1e6 for v in variants]
        name = variants[0].name.removesuffix(" 1T")
        print(f"{name:<34} {nbytes / MIB:7.1f} {med[0]:9.1f} {med[1]:9.1f} {med[2]:9.1f}  {med[2] / med[1]:10.2f}"
              f"  {'yes' if all(same.values()) else 'NO: ' + str(same)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
