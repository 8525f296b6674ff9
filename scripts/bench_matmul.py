#!/usr/bin/env python3
"""The model's matmuls on one thread: decode rows against the read floor, prefill against OpenBLAS.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_matmul.py
    .venv/bin/python scripts/bench_matmul.py --quick          # two shapes, a few rounds: a smoke test

Shapes are SmolLM-135M's projections (K x N: 576x576, 576x192 for GQA k/v, 576x1536,
1536x576, the head 576x49152) and StoryLM's at d 512 (512x512, 512x1408, 1408x512,
512x4096), weights [K, N] row-major as the models store them, each compiled with static
dims (as the models compile theirs) at the default level, called through
`call_unchecked` on one thread:

  decode   x[1, K] @ W[K, N]: GB/s of W's bytes, and that as a share of the one-thread read
           floor measured in the same run (benchlib.bandwidth.read_bandwidth: np.sum and
           np.dot over new 256 MiB arrays; the best pass, of those at the start and one
           before each shape, since a neighbour's load only ever lowers it); NumPy's x @ W
           beside it, and "read W": the probe's kernel (np.dot of W's two halves, F16 bytes
           read as F32) on the same weights in the same rounds, a floor that shares the
           neighbours' load.
  prefill  x[P, K] @ W[K, N] at P = 32 and 256: GFLOP/s (2PKN per call) against NumPy's
           sgemm (OpenBLAS, set to one thread), and the ratio.

F32 and F16 (F16 operands, F32 sums, rounded once: half the bytes of W). F16 rows also
give their time against the F32 row's (the decode speed-up F16 weights buy); NumPy's F16
matmul is not a BLAS, so F16 prefill is shown against the F32 sgemm's rate.

Each shape's variants are timed in interleaved rounds (benchlib.timing.run_rounds: the
order rotates, one untimed call before each batch), on input sets rotated through
--working-set-mib so each decode call finds W in memory rather than in cache; the
figures are medians over rounds. The sets' weights are views of one buffer per shape,
as a model's weights loaded together are (NumPy gives buffers of 4 MiB and up huge
pages, as it does the floor's 256 MiB arrays). This is a benchmark, not a test: it
exits 0 whatever the speed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from benchlib import machine
from benchlib.bandwidth import read_bandwidth
from benchlib.timing import InputSets, Variant, copies, fresh_compiles, run_rounds

MIB = 1 << 20
SRC = """
let f = fn[T](x: tensor<T, [P, K], @host>, w: tensor<T, [K, N], @host>) -> (tensor<T, [P, N], @host>) {
  (x @ w)
}
"""
SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152),
          (512, 512), (512, 1408), (1408, 512), (512, 4096)]
QUICK_SHAPES = [(576, 576), (512, 1408)]
PREFILL_ROWS = (32, 256)
DTYPES = {"F32": np.float32, "F16": np.float16}
BATCH_S = 0.02  # the length of one timed batch of calls
QUICK_BATCH_S = 0.002  # --quick: NumPy's F16 matmul (no BLAS) is some 30x slower than Kina's, so a batch sized
# by Kina's call lasts 30x longer for it; shorter batches keep the smoke test to seconds


def input_sets(P: int, K: int, N: int, dtype, working_set: int) -> InputSets:
    """Sets (x, W, out) covering working_set; the W's are 64-byte-aligned views of one buffer."""
    from kina.runtime import empty
    rng = np.random.default_rng(K * N + P)
    w0 = (rng.standard_normal((K, N)) * 0.05).astype(dtype)
    sets = []
    for w in copies(w0, working_set):
        x = empty((P, K), dtype)
        x[...] = rng.standard_normal((P, K)).astype(dtype)
        sets.append((x, w, empty((P, N), dtype)))
    return InputSets(sets, K * N * np.dtype(dtype).itemsize)


def time_shape(P: int, K: int, N: int, dtype_name: str, working_set: int, rounds: int,
               batch_s: float = BATCH_S) -> dict[str, float]:
    """{variant: median seconds per call} for Kina and NumPy at one shape, interleaved."""
    import kina
    from kina.driver.pipeline import Options
    dtype = DTYPES[dtype_name]
    fn = kina.compile_source(SRC, "<bench_matmul>", Options(dtypes=(("T", dtype_name),),
                                                             dims=(("P", P), ("K", K), ("N", N)))).f
    sets = input_sets(P, K, N, dtype, working_set)
    x, w, _ = sets.sets[0]
    if not np.allclose(fn(x, w)[0].astype(np.float32), x.astype(np.float32) @ w.astype(np.float32),
                       rtol=1e-2, atol=1e-2 * np.sqrt(K)):
        raise SystemExit(f"bench_matmul: Kina's {dtype_name} {P}x{K}x{N} matmul differs from NumPy's")
    variants = [Variant("kina", sets, lambda s: fn.call_unchecked([s[0], s[1]], [s[2]])),
                Variant("numpy", sets, lambda s: np.matmul(s[0], s[1], out=s[2]))]
    if P == 1:  # the floor probe's kernel on the same bytes, in the same rounds (the same neighbours)
        words = [s[1].reshape(-1)[:s[1].size // 2 * 2].view(np.float32) for s in sets.sets]  # F16 as F32: same bytes
        halves = InputSets([(w[:w.size // 2], w[w.size // 2:]) for w in words], sets.nbytes_each)
        variants.append(Variant("read", halves, lambda h: np.dot(*h)))
    if dtype_name != "F32" and P > 1:  # F16 has no BLAS: the F32 sgemm's rate is the reference
        f32 = input_sets(P, K, N, np.float32, 0)
        variants[1] = Variant("numpy", f32, lambda s: np.matmul(s[0], s[1], out=s[2]))
    t0 = time_once(variants[0], sets)
    run_rounds(variants, rounds, max(1, int(batch_s / t0)))
    return {v.name: statistics.median(v.samples) for v in variants}


def progress(what: str) -> None:
    sys.stderr.write(f"bench_matmul: {what}\n")
    sys.stderr.flush()


def time_once(v: Variant, sets: InputSets) -> float:
    """Seconds of one warm call of v (sizes the timed batches)."""
    s = sets.take(1)[0]
    v.run(s)
    t = time.perf_counter()
    v.run(s)
    return max(time.perf_counter() - t, 1e-6)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--quick", action="store_true", help="two shapes, 3 rounds of 2 ms batches, a 16 MiB working set (a smoke test)")
    p.add_argument("--rounds", type=int, default=11, help="interleaved rounds per shape (the median is taken)")
    p.add_argument("--working-set-mib", type=int, default=1024, help="decode inputs rotate through at least this much")
    p.add_argument("--part", choices=("all", "decode", "prefill"), default="all", help="which table (default both)")
    p.add_argument("--floor-passes", type=int, default=5, help="passes of the read-floor probe (the best counts)")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.working_set_mib < 1 or a.floor_passes < 1:
        p.error("--rounds, --working-set-mib and --floor-passes must be at least 1")
    shapes, rounds, ws, passes, batch_s = SHAPES, a.rounds, a.working_set_mib * MIB, a.floor_passes, BATCH_S
    if a.quick:
        shapes, rounds, ws, passes, batch_s = QUICK_SHAPES, 3, 16 * MIB, 1, QUICK_BATCH_S
    corename, set_threads = machine.openblas()
    if set_threads is not None:
        set_threads(1)
    noted = [v for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if v in os.environ]
    print(f"{machine.describe()}; OpenBLAS {corename}, 1 thread"
          + (f" (note: {', '.join(noted)} set, which can slow OpenBLAS)" if noted else ""))
    with fresh_compiles():
        floor = read_bandwidth(passes)
        decode, prefill = [], []
        for name in DTYPES if a.part != "prefill" else ():  # a probe pass before each shape: the best counts
            for K, N in shapes:
                progress(f"decode {name} {K}x{N}")
                decode.append((name, K, N, time_shape(1, K, N, name, ws, rounds, batch_s)))
                floor = max(floor, read_bandwidth(1))
        for name in DTYPES if a.part != "decode" else ():
            for K, N in shapes:
                if K * N > 4 * MIB:  # the head: a prefill computes it for the last position only
                    continue
                for P in PREFILL_ROWS:
                    progress(f"prefill {name} {P}x{K}x{N}")
                    prefill.append((name, P, K, N, time_shape(P, K, N, name, ws if a.quick else 64 * MIB, rounds, batch_s)))
    print(f"read floor, one thread: {floor / 1e9:.1f} GB/s (the best of {passes + len(decode)} passes over 256 MiB, "
          f"spread through the run); medians of {rounds} interleaved rounds; decode weights rotated through "
          f"{ws // MIB} MiB")
    print("\ndecode x[1,K] @ W[K,N]: GB/s of W, and x floor")
    print(f"{'dtype':<5} {'K':>5} {'N':>6} {'W MiB':>7} {'kina GB/s':>10} {'x floor':>8} "
          f"{'numpy GB/s':>11} {'x floor':>8} {'read W GB/s':>12} {'kina x read':>12} {'vs F32':>7}")
    f32_time = {(K, N): t["kina"] for name, K, N, t in decode if name == "F32"}
    for name, K, N, t in decode:
        nbytes = K * N * np.dtype(DTYPES[name]).itemsize
        kina_bw, np_bw, read_bw = nbytes / t["kina"], nbytes / t["numpy"], nbytes / t["read"]
        speedup = f"{f32_time[(K, N)] / t['kina']:6.2f}x" if (K, N) in f32_time else "-"
        print(f"{name:<5} {K:>5} {N:>6} {nbytes / MIB:>7.2f} {kina_bw / 1e9:>10.1f} {kina_bw / floor:>8.2f} "
              f"{np_bw / 1e9:>11.1f} {np_bw / floor:>8.2f} {read_bw / 1e9:>12.1f} {kina_bw / read_bw:>12.2f} {speedup:>7}")
    print("\nprefill x[P,K] @ W[K,N]: GFLOP/s (2PKN per call) against NumPy's sgemm (F32, one thread)")
    print(f"{'dtype':<5} {'P':>4} {'K':>5} {'N':>6} {'kina GFLOP/s':>13} {'sgemm GFLOP/s':>14} {'ratio':>6}")
    for name, P, K, N, t in prefill:
        flops = 2 * P * K * N
        print(f"{name:<5} {P:>4} {K:>5} {N:>6} {flops / t['kina'] / 1e9:>13.1f} "
              f"{flops / t['numpy'] / 1e9:>14.1f} {t['numpy'] / t['kina']:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
