#!/usr/bin/env python3
"""Benchmark the Section 19 decode step (issues 6 and 11): Kina against NumPy, PyTorch and onnxruntime, and the bandwidth floor.

Run it (from the repo root; the `env -u` matters, see below):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_kv_step.py
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_kv_step.py --quick
    ... scripts/bench_kv_step.py --shapes 32x128 --s-past 2047,8191 --repeats 21 --json build/b.json
    ... scripts/bench_kv_step.py --repeats 3 --plot docs/bench_kv_step.png
    .venv/bin/python scripts/bench_kv_step.py --plot FILE.png --from-json build/bench_kv_step.json

Some machines here set OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE, which force an older, slower
OpenBLAS kernel under NumPy; unset both together, for this command only (never in tests or
CI). The run records which OpenBLAS core NumPy ended up with, and warns if either is set.
The full run takes about two minutes and needs about 6 GiB of memory; `--quick` about 40 s.

What runs, in one process, interleaved (each repeat visits every variant, in a rotating order).
"nT" is a thread count: every one of --threads (default 1,2) and kina.runtime.default_threads().
One-off calls, each on an independent input set (examples/storylm0_kv_step_dyn.kina, symbolic
dims, one .so for every S, compiled with KINA_NO_CACHE=1 so the current compiler is measured):
  kina call_unchecked 1T  mod.kv_step.call_unchecked(bound, outs) on arguments bound once:
                     the kernel alone, on the same buffers NumPy gets.
  kina call_into nT  mod.kv_step.call_into(args, outs, threads=n) into the same preallocated
                     results: the kernel with the public call's checks.
  kina fn() nT       the public call mod.kv_step(*args, threads=n): argument checks and results
                     from the runtime's recycling allocator (kina.runtime.RESULTS), dropped at once.
  numpy              np.concatenate and np.matmul with out=, a stable softmax, into preallocated buffers.
  torch nT           PyTorch eager with out= (torch.cat, torch.matmul, aten._softmax.out) on the same
                     memory (torch.from_numpy), with torch.set_num_threads(n). If torch imports.
  ort nT             onnxruntime (intra_op_num_threads=n, sequential) on an ONNX graph of the step built
                     with onnx.helper (Concat, Concat, MatMul, Mul, Softmax(axis=-1), MatMul; symbolic
                     dims, one model for every size), run with IO binding on the same NumPy inputs and
                     preallocated results. If onnxruntime and onnx import (the [bench] extra).
  After each multi-threaded torch or ort sample (not timed) torch goes back to one thread and the
  run waits 100 ms (busy, see busy_wait): libgomp's and onnxruntime's idle workers spin for a while (onnxruntime's
  two-thread session measured 55-60 ms of CPU after each run), which would otherwise steal the
  second core from whatever runs next on this 2-core machine (Kina's 2T in-place rows measured
  1.9-6.6 ms at a 64 MiB cache with a 20 ms pause, 2.3-2.7 ms without onnxruntime).
The Section 19 host loop, one chain per input set (a chain starts from its set's k_past, v_past):
  kina loop fn() nT        k_next, v_next, context = mod.kv_step(q, k, k_new, v, v_new, scale,
                           threads=n); then k, v = k_next[..., :S], v_next[:, :, :S]: each call's
                           results are the next call's inputs (strided views, passed as they are),
                           the old ones die and their memory comes back to the allocator; the prefix
                           keeps every call at the same S_past.
  kina loop call_into nT   the same loop into two preallocated result sets per chain, used in turn.
In place, over caches with NaN in every unused slot:
  kina in place nT   kina.models.KVCache(B, H, Dh, T_max, threads=n).step(q, k_new, v_new, float scale),
                     after crop(S_past) (not timed) so every call appends at position S_past.
  numpy in place     append k_new/v_new into preallocated [B,H,Dh,T_max] / [B,H,T_max,Dh] buffers,
                     then attend over the filled prefix (strided views), results into scratch.
NumPy's OpenBLAS is set to one thread. Before timing, one call of every functional variant on the
first set is checked against the NumPy reference (k_next, v_next exact, context within 1e-4), and
every Kina variant's results must have the same bits; likewise the in-place steps (every thread
count the same bits). A disagreement is printed as a note.

Inputs rotate across independent sets: enough sets that their total size is at least
--working-set-mib (default 8x the last-level cache) and never fewer than two, with one counter
per pool shared by the variants that use it, so no call finds its data left in cache by the
previous one. Short calls are timed in batches over consecutive sets (~0.5 ms a sample).
Each sample starts with one untimed call of the same variant on another set, so every timed
call finds the cache as a loop of that variant leaves it: it pays for writing back its own
predecessor's dirty lines (as it would in a decode loop), never another variant's.
Every array starts on a 64-byte boundary (kina.runtime.empty), as Kina allocates its results:
in a decode loop the caches passed in are the previous step's results. All variants share them.

The floor model. A step that reads R bytes and writes W bytes moves m = min(R, W) of them as a
copy and the other R - m as plain reads (writes beyond the reads are counted as free):
    t_floor(n threads) = m / copy_bw[n] + (R - m) / read_bw[n]
  one-off and host loop: R = K_past + V_past + q + k_new + v_new + scale, W = K_next + V_next +
              context (W = R - 4 bytes): the floor is (K+V) / copy_bw.
  in place:   R = the filled K and V prefix (S_past+1 positions) + q + k_new + v_new,
              W = the new position + context: the floor is about (K+V) / read_bw.
read_bw[n] and copy_bw[n] are the best this machine was seen to do on n threads in this run,
so that no variant beats its floor:
  1. dedicated kernels on 256 MiB arrays (new ones each time), each split into n parts on n
     threads, at the start, between sizes and at the end (the best pass counts: noise only
     slows a pass down).
     read = bytes / time of np.sum, np.dot of the two halves of a part (two streams) and
     torch.sum; copy = bytes copied / time of np.copyto (glibc memcpy: non-temporal stores for
     large copies), torch's Tensor.copy_ and a Kina copy kernel (a concat fused into a
     one-row matmul, so the concat's copy loops use non-temporal stores; see COPY_KERNEL).
  2. on n threads, at least what fewer threads did (a run may leave a thread idle).
  3. every variant on at most n threads, at any size: if its best sample is faster than its
     floor, the bandwidth its kind rests on (read for in place, copy for the others) is raised
     to what that sample implies, and the report names the variant. Raising a bandwidth only
     lowers floors, so the result holds for every variant, and "x floor" is never below 1.

Compile time, in-process through kina.driver.pipeline.build_so on examples/storylm0_kv_step.kina:
cold = KINA_NO_CACHE=1 (median of --compile-repeats, after one untimed build that pays the
one-time imports, which is reported as "first"); warm = a cache hit in a fresh KINA_CACHE_DIR.

Ratios are of medians; "(best)" and "best vs best" divide the two variants' fastest samples,
which is the steadier figure when a neighbour is busy (the load average is printed and kept).
The runtime's allocator counts (blocks allocated / reused) over each size's timed samples are
printed and kept: a steady host loop reuses, it does not allocate.

Targets, judged on the medians at caches (K+V of S_past+1 positions) of 4 MiB and up, printed
as PASS/FAIL with the numbers.
  issue 11: the public call, one-off and in the host loop, <= 1.1x the same kernel through
    call_into (each thread count); kina fn() at the default thread count <= 0.6x NumPy;
    KVCache.step on one thread reads K+V at >= 85% of read_bw[1] at caches >= 16 MiB, and is no
    slower than NumPy in place below 16 MiB; on two threads >= 1.25x faster than on one at
    caches >= 64 MiB; kina fn() at the default thread count faster than torch and ort, each at
    its best thread count; cold compile <= 200 ms (goal 150), cache hit <= 1 ms.
  issue 6: kina call_unchecked 1T <= 0.6x NumPy and <= 1.5x its floor, faster than every torch row;
    kina in place 1T <= 0.75x NumPy in place and <= 1.3x its floor.
The JSON (--json, default build/bench_kv_step.json) has every figure, the samples and the checks.
The exit status is 0 whether or not the targets pass: this measures, it does not gate.

--plot FILE.png draws each variant's median time against the cache size, one panel per HxDh,
with the floors (needs matplotlib, in the [bench] extra); --markdown prints the README's table;
with --from-json either works on a report written earlier instead of measuring.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import glob
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import kina
import plotting
from kina import runtime
from kina.models import KVCache
from kina.runtime import empty as aligned_empty
from kina.runtime import bind
from validate_kv_cache import reference_numpy as reference  # the plain step, for the spot checks

ROOT = Path(__file__).resolve().parent.parent
DYN_EXAMPLE = ROOT / "examples" / "storylm0_kv_step_dyn.kina"
STATIC_EXAMPLE = ROOT / "examples" / "storylm0_kv_step.kina"
MIB = 1 << 20
F32 = 4
TARGET_MIN_CACHE = 4 * MIB
T_MAX_SLACK = 256  # unused positions past the in-place fill, so the filled prefix is a strided view
SETTLE_S = 0.1  # after a multi-threaded torch/ort sample: let their idle workers stop spinning

# A copy kernel for the copy bandwidth: a concat along the contraction axis of a one-row
# matmul is fused into it (fuse-concat-matmul), and the fused loop writes the concat with
# non-temporal stores, each row of c read once with its sums kept in registers (rows of
# D = 128 floats). The arithmetic, one multiply-add per element copied, is far below what a
# core does, so the kernel runs at the speed of its copy (the V half of the decode step;
# the K half, concat along the columns, measured half as fast as a copy kernel).
COPY_KERNEL = """
let copy = fn(w0: tensor<F32, [R, 1, N], @host>, w1: tensor<F32, [R, 1, 1], @host>,
              a: tensor<F32, [R, N, D], @host>, b: tensor<F32, [R, 1, D], @host>)
  -> (tensor<F32, [R, N+1, D], @host>, tensor<F32, [R, 1, D], @host>) {
  let w = concat[axis=2] w0 w1;
  let c = concat[axis=1] a b;
  (c, w @ c)
}
"""


# -- the machine -------------------------------------------------------------------

def llc_bytes() -> int:
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        return int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]]
    except (OSError, ValueError, KeyError):
        return 32 * MIB


def openblas() -> tuple[str, Callable[[int], None] | None]:
    """NumPy's OpenBLAS core name and a function that sets its thread count (or None)."""
    for lib_path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*.so*")):
        lib = ctypes.CDLL(lib_path)  # already loaded by numpy: this returns the same handle
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_corename{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.restype = ctypes.c_char_p
                put.argtypes = [ctypes.c_int]
                return get().decode(), put
    return "unknown", None


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@contextmanager
def fresh_compiles():
    """Build with KINA_NO_CACHE=1: the compile cache's key does not cover the compiler's own
    source, so during work on lower.py a cache hit could measure an older kernel."""
    saved, os.environ["KINA_NO_CACHE"] = os.environ.get("KINA_NO_CACHE"), "1"
    try:
        yield
    finally:
        os.environ.pop("KINA_NO_CACHE") if saved is None else os.environ.__setitem__("KINA_NO_CACHE", saved)


# -- bandwidth ---------------------------------------------------------------------

_helpers = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 1)), thread_name_prefix="bench")


def on_threads(calls: list[Callable]) -> None:
    """Run the calls concurrently, the first on this thread (NumPy releases the GIL in copies
    and BLAS; where it does not, the candidate is merely slow and never the best)."""
    rest = [_helpers.submit(c) for c in calls[1:]]
    calls[0]()
    for f in rest:
        f.result()


def split(a: np.ndarray, n: int) -> list[np.ndarray]:
    return [a[a.size * i // n: a.size * (i + 1) // n] for i in range(n)]


class BandwidthKernels:
    """The dedicated read and copy kernels of the floor model, on one 256 MiB source (and a
    256 MiB destination for the copies), each at a given thread count. A new pair is made for
    each round of passes: on this machine one pair of buffers was seen to copy 3-5x slower
    than another for a whole run (physical placement, most likely), and the floor wants the
    best the machine can do."""

    def __init__(self, copy_kernel, torch, nbytes: int = 256 * MIB):
        R, D = 32, 128
        N = nbytes // (R * D * F32)
        self.nbytes = R * N * D * F32
        src = aligned_empty((R, N, D))
        dst, w0, w1, b, y = (aligned_empty(s) for s in ((R, N + 1, D), (R, 1, N), (R, 1, 1), (R, 1, D), (R, 1, D)))
        for x in (src, dst, w0, w1, b, y):
            x.fill(0.5)  # fault the pages in
        self.flat_src, self.flat_dst = src.reshape(-1), dst.reshape(-1)[:src.size]
        self.kernel, self.torch = copy_kernel, torch
        self.kernel_args, self.kernel_outs = [w0, w1, src, b], [dst, y]

    def candidates(self, n: int) -> dict[str, dict[str, Callable]]:
        """{"read"|"copy": {name: f}}: f() moves self.nbytes (read, or copied) on n threads."""
        src, dst = split(self.flat_src, n), split(self.flat_dst, n)
        read = {"np.sum": lambda: on_threads([p.sum for p in src]),
                "np.dot": lambda: on_threads([lambda p=p: np.dot(p[:p.size // 2], p[p.size // 2:]) for p in src])}
        copy = {"np.copyto": lambda: on_threads([lambda s=s, d=d: np.copyto(d, s) for s, d in zip(src, dst)])}
        if self.kernel is not None:
            copy["kina copy"] = lambda: self.kernel.call_unchecked(self.kernel_args, self.kernel_outs, n)
        if self.torch is not None:
            t_src, t_dst = self.torch.from_numpy(self.flat_src), self.torch.from_numpy(self.flat_dst)
            read["torch.sum"] = lambda: self.torch_on(n, t_src.sum)
            copy["torch copy_"] = lambda: self.torch_on(n, lambda: t_dst.copy_(t_src))
        return {"read": read, "copy": copy}

    def torch_on(self, n: int, f: Callable) -> None:
        self.torch.set_num_threads(n)
        f()

    def measure(self, threads: list[int], passes: int) -> dict:
        """samples[str(n)][kind][name]: bytes/s of each pass."""
        out: dict = {}
        for _ in range(passes):
            for n in threads:
                for kind, fs in self.candidates(n).items():
                    for name, f in fs.items():
                        t = time.perf_counter()
                        f()
                        dt = time.perf_counter() - t
                        out.setdefault(str(n), {}).setdefault(kind, {}).setdefault(name, []).append(self.nbytes / dt)
                if n > 1 and self.torch is not None:
                    self.torch.set_num_threads(1)
                    busy_wait(SETTLE_S)
        return out


def add_samples(into: dict, more: dict) -> None:
    for n, kinds in more.items():
        for kind, names in kinds.items():
            for name, v in names.items():
                into.setdefault(n, {}).setdefault(kind, {}).setdefault(name, []).extend(v)


def bandwidth(samples: dict) -> dict[int, dict]:
    """Per thread count: read and copy, the best pass of the best kernel on at most that many
    threads (noise only ever slows a pass down), which kernel it was, and every kernel's best
    and median. Variants may raise these later (fit_floors)."""
    out: dict[int, dict] = {}
    best = {"read": (0.0, ""), "copy": (0.0, "")}
    for n in sorted(samples, key=int):
        row: dict = {"candidates": {}}
        for kind, names in samples[n].items():
            for name, v in names.items():
                row["candidates"][f"{kind} {name}"] = {"best": max(v), "median": statistics.median(v)}
                best[kind] = max(best[kind], (max(v), f"{name} on {n} thread{'s' * (n != '1')}"))
        for kind, (bps, by) in best.items():
            row[kind], row[f"{kind}_by"] = bps, by
        out[int(n)] = row
    return out


def floor_seconds(read_bytes: int, write_bytes: int, read_bw: float, copy_bw: float) -> float:
    """min(R, W) bytes move as a copy, the rest of the reads as reads (see the docstring)."""
    m = min(read_bytes, write_bytes)
    return m / copy_bw + (read_bytes - m) / read_bw


# -- inputs ------------------------------------------------------------------------

@dataclass
class Pool:
    """Independent input sets, handed out round robin by one counter that its variants share."""

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
    return max(2, math.ceil(working_set / nbytes_each))


@dataclass
class Size:
    H: int
    Dh: int
    S: int
    B: int = 1

    @property
    def label(self) -> str:
        return f"H={self.H} Dh={self.Dh} S_past={self.S}"

    @property
    def cache_bytes(self) -> int:  # K + V over S_past+1 positions: the cache the step attends over
        return 2 * self.B * self.H * self.Dh * (self.S + 1) * F32


@dataclass
class Variant:
    name: str
    pool: Pool
    run: Callable  # run(item) -> None, timed
    prepare: Callable | None = None  # prepare(item), not timed
    before: Callable | None = None  # once before each sample, not timed (e.g. thread count)
    after: Callable | None = None  # once after each sample, not timed
    ref: str = "numpy"  # the variant its ratio is taken against
    floor: str = "functional"  # which bytes it moves: "functional" or "in place"
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


def make_functional_pool(z: Size, working_set: int, rng) -> Pool:
    B, H, Dh, S = z.B, z.H, z.Dh, z.S
    per_set = 2 * (2 * B * H * Dh * S + 2 * B * H * Dh) * F32  # inputs and results, roughly
    sets = []

    def randn(*shape):  # aligned as kina.runtime allocates results: a decode loop passes those back in
        return rng.standard_normal(shape, dtype=np.float32, out=aligned_empty(shape))
    for _ in range(n_sets_for(per_set, working_set)):
        d = {
            "q": randn(B, H, 1, Dh),
            "k_past": randn(B, H, Dh, S),
            "k_new": randn(B, H, Dh, 1),
            "v_past": randn(B, H, S, Dh),
            "v_new": randn(B, H, 1, Dh),
            "scale": np.full((1, 1, 1, 1), 1 / math.sqrt(Dh), np.float32),
            "scale_f": 1 / math.sqrt(Dh),
            "k_next": aligned_empty((B, H, Dh, S + 1)),
            "v_next": aligned_empty((B, H, S + 1, Dh)),
            "context": aligned_empty((B, H, 1, Dh)),
        }
        for k in ("k_next", "v_next", "context"):
            d[k].fill(0.0)  # fault the pages in before timing
        d["args"] = [d[k] for k in ("q", "k_past", "k_new", "v_past", "v_new", "scale")]
        d["outs"] = [d["k_next"], d["v_next"], d["context"]]
        sets.append(d)
    return Pool(sets, per_set)


@dataclass
class Scratch:
    """The softmax's buffers, shared by the NumPy and PyTorch steps of one size."""

    scores: np.ndarray
    m: np.ndarray
    s: np.ndarray

    @classmethod
    def of(cls, z: Size) -> "Scratch":
        return cls(np.zeros((z.B, z.H, 1, z.S + 1), np.float32), np.zeros((z.B, z.H, 1, 1), np.float32),
                   np.zeros((z.B, z.H, 1, 1), np.float32))


def softmax_numpy(scores, m, s):
    np.max(scores, axis=3, keepdims=True, out=m)
    np.subtract(scores, m, out=scores)
    np.exp(scores, out=scores)
    np.sum(scores, axis=3, keepdims=True, out=s)
    np.divide(scores, s, out=scores)


def attend_numpy(q, k, v, scale, x: Scratch, out) -> None:
    """softmax(q @ k * scale) @ v into `out`, through the scratch buffers."""
    np.matmul(q, k, out=x.scores)
    np.multiply(x.scores, scale, out=x.scores)
    softmax_numpy(x.scores, x.m, x.s)
    np.matmul(x.scores, v, out=out)


# -- the variants, one function per family ------------------------------------------

def kina_one_off(fn, fpool: Pool, threads: list[int]) -> list[Variant]:
    """The public call and call_into, each call on its own input set; and the kernel alone
    (call_unchecked on arguments bound once), on one thread."""
    for d in fpool.sets:
        d["bound"], _ = bind(fn.signature, d["args"])

    def kernel(d):
        fn.call_unchecked(d["bound"], d["outs"], 1)
    out = [Variant("kina call_unchecked 1T", fpool, kernel, result=written(kernel))]
    for n in threads:
        def into(d, n=n):
            fn.call_into(d["args"], d["outs"], threads=n)

        def public(d, n=n):
            fn(*d["args"], threads=n)
        out += [Variant(f"kina call_into {n}T", fpool, into, threads=n, result=written(into)),
                Variant(f"kina fn() {n}T", fpool, public, ref=f"kina call_into {n}T", threads=n,
                        result=lambda d, n=n: fn(*d["args"], threads=n))]
    return out


def kina_host_loop(z: Size, fn, fpool: Pool, threads: list[int]) -> list[Variant]:
    """The Section 19 host loop: each call's k_next, v_next (their first S positions, so the
    length stays S_past) are the next call's k_past, v_past; one chain per input set."""
    S = z.S

    def chains(spare_results: bool) -> Pool:
        out = []
        for d in fpool.sets:  # q, k_new, v_new, scale from the set; the caches start as its own
            c = {"small": d, "k": d["k_past"], "v": d["v_past"], "last": None}
            if spare_results:  # two result sets, written in turn: the inputs are always the other
                c["results"] = [[aligned_empty(a.shape) for a in d["outs"]] for _ in range(2)]
                for a in (*c["results"][0], *c["results"][1]):
                    a.fill(0.0)
            out.append(c)
        return Pool(out, fpool.nbytes_each)

    def step(c, results) -> None:
        c["k"], c["v"], c["last"] = results[0][..., :S], results[1][:, :, :S], results

    def args(c) -> list:
        d = c["small"]
        return [d["q"], c["k"], d["k_new"], c["v"], d["v_new"], d["scale"]]

    public_chains, into_chains = chains(False), chains(True)
    variants = []
    for n in threads:
        def public(c, n=n):
            step(c, fn(*args(c), threads=n))  # the previous results die here

        def into(c, n=n):
            results = c["results"][0] if c["last"] is not c["results"][0] else c["results"][1]
            fn.call_into(args(c), results, threads=n)
            step(c, results)
        for name, pool, run, ref in ((f"kina loop call_into {n}T", into_chains, into, "numpy"),
                                     (f"kina loop fn() {n}T", public_chains, public, f"kina loop call_into {n}T")):
            variants.append(Variant(name, pool, run, ref=ref, group="host loop", threads=n,
                                    result=lambda c, run=run: (run(c), c["last"])[1]))
    return variants


def numpy_functional(fpool: Pool, x: Scratch) -> list[Variant]:
    def step(d):
        np.concatenate([d["k_past"], d["k_new"]], axis=3, out=d["k_next"])
        np.concatenate([d["v_past"], d["v_new"]], axis=2, out=d["v_next"])
        attend_numpy(d["q"], d["k_next"], d["v_next"], d["scale"], x, d["context"])
    return [Variant("numpy", fpool, step, result=written(step))]


def busy_wait(seconds: float) -> None:
    """Wait without sleeping: a core that sleeps here runs the next variant slower (on this
    VM a KVCache step took 10% longer on one thread, 40% on two, after a 20-100 ms sleep)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def settle(torch) -> Callable:
    def after():  # let torch's OpenMP (or onnxruntime's) workers stop spinning before the next variant
        if torch is not None:
            torch.set_num_threads(1)
        busy_wait(SETTLE_S)
    return after


def torch_functional(z: Size, fpool: Pool, x: Scratch, torch, threads: list[int]) -> list[Variant]:
    for d in fpool.sets:
        d["t"] = {k: torch.from_numpy(v) for k, v in d.items() if isinstance(v, np.ndarray)}
    t_scores, t_probs = torch.from_numpy(x.scores), torch.zeros((z.B, z.H, 1, z.S + 1))
    softmax_out = torch.ops.aten._softmax.out

    def step(d):
        t = d["t"]
        torch.cat([t["k_past"], t["k_new"]], dim=3, out=t["k_next"])
        torch.cat([t["v_past"], t["v_new"]], dim=2, out=t["v_next"])
        torch.matmul(t["q"], t["k_next"], out=t_scores)
        torch.mul(t_scores, t["scale"], out=t_scores)
        softmax_out(t_scores, 3, False, out=t_probs)
        torch.matmul(t_probs, t["v_next"], out=t["context"])
    return [Variant(f"torch {n}T", fpool, step, before=lambda n=n: torch.set_num_threads(n),
                    after=settle(torch) if n > 1 else None, threads=n, result=written(step)) for n in threads]


ORT_INPUTS = ("q_new", "k_past", "k_new", "v_past", "v_new", "scale")
ORT_OUTPUTS = ("k_next", "v_next", "context")


def ort_step_model(onnx) -> bytes:
    """The step as an ONNX graph (opset 17), symbolic in B, H, Dh, S: one model for every size."""
    h, f = onnx.helper, onnx.TensorProto.FLOAT
    shapes = {"q_new": ["B", "H", 1, "Dh"], "k_past": ["B", "H", "Dh", "S"], "k_new": ["B", "H", "Dh", 1],
              "v_past": ["B", "H", "S", "Dh"], "v_new": ["B", "H", 1, "Dh"], "scale": [1, 1, 1, 1],
              "k_next": ["B", "H", "Dh", "S1"], "v_next": ["B", "H", "S1", "Dh"], "context": ["B", "H", 1, "Dh"]}
    nodes = [h.make_node("Concat", ["k_past", "k_new"], ["k_next"], axis=3),
             h.make_node("Concat", ["v_past", "v_new"], ["v_next"], axis=2),
             h.make_node("MatMul", ["q_new", "k_next"], ["scores"]),
             h.make_node("Mul", ["scores", "scale"], ["scaled"]),
             h.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
             h.make_node("MatMul", ["probs", "v_next"], ["context"])]
    graph = h.make_graph(nodes, "kv_step", [h.make_tensor_value_info(n, f, shapes[n]) for n in ORT_INPUTS],
                         [h.make_tensor_value_info(n, f, shapes[n]) for n in ORT_OUTPUTS])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="bench_kv_step")
    model.ir_version = 8  # what onnxruntime 1.16 and later read
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ort_sessions(threads: list[int], notes: list[str]) -> tuple[dict, str | None]:
    """({n: an onnxruntime session of the step on n intra-op threads}, onnxruntime's version),
    or ({}, None) without onnxruntime."""
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        notes.append("onnxruntime or onnx is not installed (the [bench] extra): the ort rows are skipped")
        return {}, None
    model = ort_step_model(onnx)
    sessions = {}
    for n in threads:
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = n, 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sessions[n] = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return sessions, ort.__version__


def ort_functional(fpool: Pool, sessions: dict, torch) -> list[Variant]:
    """onnxruntime with every input and result bound to the set's own NumPy buffers."""
    for d in fpool.sets:
        d["ort"] = {}
        for n, sess in sessions.items():
            b = sess.io_binding()
            for name, a in zip(ORT_INPUTS, d["args"]):
                b.bind_input(name, "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
            for name, a in zip(ORT_OUTPUTS, d["outs"]):
                b.bind_output(name, "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
            d["ort"][n] = b
    variants = []
    for n, sess in sessions.items():
        def run(d, n=n, sess=sess):
            sess.run_with_iobinding(d["ort"][n])
        variants.append(Variant(f"ort {n}T", fpool, run, after=settle(torch) if n > 1 else None, threads=n,
                                result=written(run)))
    return variants


@dataclass
class InPlaceSets:
    """Per set: a [B,H,Dh,T] / [B,H,T,Dh] pair with S_past random positions, NaN after them,
    and the small inputs (q, k_new, v_new, scale) of a functional set."""

    k: list[np.ndarray]
    v: list[np.ndarray]
    small: list[dict]
    nbytes_each: int


def make_in_place_sets(z: Size, working_set: int, fpool: Pool, rng) -> InPlaceSets:
    B, H, Dh, S = z.B, z.H, z.Dh, z.S
    T = S + 1 + T_MAX_SLACK
    per_set = 2 * B * H * Dh * T * F32
    ks, vs = [], []
    for _ in range(n_sets_for(per_set, working_set)):
        k, v = aligned_empty((B, H, Dh, T)), aligned_empty((B, H, T, Dh))  # like KVCache's buffers
        k.fill(np.nan)  # the unused slots hold NaN: they must not matter
        v.fill(np.nan)
        k[..., :S] = rng.standard_normal((B, H, Dh, S), dtype=np.float32)
        v[:, :, :S] = rng.standard_normal((B, H, S, Dh), dtype=np.float32)
        ks.append(k)
        vs.append(v)
    return InPlaceSets(ks, vs, [fpool.sets[i % len(fpool.sets)] for i in range(len(ks))], per_set)


def kina_in_place(z: Size, sets: InPlaceSets, threads: list[int], notes: list[str]) -> list[Variant]:
    """KVCache.step on caches holding each set's positions, one cache per set and thread count;
    checked once against NumPy, and every thread count against the first for the same bits."""
    B, H, Dh, S = z.B, z.H, z.Dh, z.S
    variants, first = [], None
    for n in threads:
        items = []
        for k, v, small in zip(sets.k, sets.v, sets.small):
            c = KVCache(B, H, Dh, k.shape[3], threads=n)
            c.append(k[..., :S], v[:, :, :S])
            items.append({"cache": c, "small": small})
        d, c = items[0]["small"], items[0]["cache"]
        c.crop(S)
        got = c.step(d["q"], d["k_new"], d["v_new"], d["scale_f"])
        want = reference(d["q"], sets.k[0][..., :S], d["k_new"], sets.v[0][:, :, :S], d["v_new"], d["scale"])[2]
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
            notes.append(f"{z.label}: kina in place {n}T context differs from NumPy "
                         f"(max abs error {float(np.abs(got - want).max()):.3g})")
        if first is None:
            first = got
        elif not np.array_equal(got, first):
            notes.append(f"{z.label}: kina in place {n}T context differs from {threads[0]}T's bits")

        def run(item):
            d = item["small"]
            item["cache"].step(d["q"], d["k_new"], d["v_new"], d["scale_f"])
        variants.append(Variant(f"kina in place {n}T", Pool(items, sets.nbytes_each), run,
                                prepare=lambda it: it["cache"].crop(S), ref="numpy in place", floor="in place",
                                group="in place", threads=n))
    return variants


def numpy_in_place(z: Size, sets: InPlaceSets, x: Scratch) -> list[Variant]:
    S = z.S
    items = [{"k": k, "v": v, "small": small, "context": np.zeros((z.B, z.H, 1, z.Dh), np.float32)}
             for k, v, small in zip(sets.k, sets.v, sets.small)]

    def step(item):
        d, k, v = item["small"], item["k"], item["v"]
        np.copyto(k[..., S:S + 1], d["k_new"])
        np.copyto(v[:, :, S:S + 1], d["v_new"])
        attend_numpy(d["q"], k[..., :S + 1], v[:, :, :S + 1], d["scale"], x, item["context"])
    return [Variant("numpy in place", Pool(items, sets.nbytes_each), step, ref="numpy in place",
                    floor="in place", group="in place")]


def build_variants(z: Size, args, fpool: Pool, rng, mod, torch, sessions: dict, notes: list[str]) -> list[Variant]:
    fn, x = mod.kv_step, Scratch.of(z)
    variants = kina_one_off(fn, fpool, args.threads) + kina_host_loop(z, fn, fpool, args.threads)
    variants += numpy_functional(fpool, x)
    if torch is not None:
        variants += torch_functional(z, fpool, x, torch, args.threads)
    variants += ort_functional(fpool, sessions, torch)
    in_place = make_in_place_sets(z, args.working_set, fpool, rng)
    variants += kina_in_place(z, in_place, args.threads, notes) + numpy_in_place(z, in_place, x)
    return variants


def spot_check(z: Size, fpool: Pool, variants: list[Variant], notes: list[str]) -> None:
    """One call of each functional variant on set 0 (a host loop: on the chain that starts from
    it) against the plain reference; every Kina variant must give the same bits as the first."""
    d = fpool.sets[0]
    k_ref, v_ref, c_ref = reference(*d["args"])
    first = None
    for v in variants:
        if v.result is None:
            continue
        if v.before:
            v.before()
        d["context"].fill(np.nan)
        k, vv, c = v.result(v.pool.sets[0])
        if v.after:
            v.after()
        if not (np.array_equal(k, k_ref) and np.array_equal(vv, v_ref) and np.allclose(c, c_ref, rtol=1e-4, atol=1e-5)):
            notes.append(f"{z.label}: {v.name} disagrees with the NumPy reference")
        if v.name.startswith("kina"):
            if first is None:
                first = (v.name, *(np.array(a) for a in (k, vv, c)))  # copies: later variants overwrite
            elif not all(np.array_equal(a, b) for a, b in zip((k, vv, c), first[1:])):
                notes.append(f"{z.label}: {v.name}'s results differ from {first[0]}'s bits")


# -- the run -----------------------------------------------------------------------

def run_size(z: Size, args, mod, torch, sessions: dict, bw: dict, notes: list[str]) -> dict:
    """Time every variant on one size; `bw` (a first estimate) only sizes the timing batches."""
    rng = np.random.default_rng(z.S * 1000 + z.H)
    fpool = make_functional_pool(z, args.working_set, rng)
    variants = [v for v in build_variants(z, args, fpool, rng, mod, torch, sessions, notes)
                if v.name not in args.skip]
    spot_check(z, fpool, variants, notes)

    B, H, Dh, S = z.B, z.H, z.Dh, z.S
    kv_past, kv_next = 2 * B * H * Dh * S * F32, 2 * B * H * Dh * (S + 1) * F32
    small_in, one_pos, ctx = (B * H * Dh * 3 + 1) * F32, 2 * B * H * Dh * F32, B * H * Dh * F32
    moved = {"functional": (kv_past + small_in, kv_next + ctx), "in place": (kv_next + small_in, one_pos + ctx)}
    rough_floor = floor_seconds(*moved["in place"], bw["read"], bw["copy"])
    inner = max(1, min(32, round(0.5e-3 / rough_floor), min(len(v.pool.sets) for v in variants) // 2))

    for v in variants:  # warm-up: one untimed pass over every set (code, pages, thread pools, allocator)
        for item in v.pool.take(max(inner, len(v.pool.sets))):
            if v.prepare:
                v.prepare(item)
            if v.before:
                v.before()
            v.run(item)
            if v.after:
                v.after()
    # Each sample starts with one untimed call of the same variant on another set, so the
    # cache holds what that variant leaves behind in a loop of its own: the timed calls pay
    # for writing back their own predecessor's dirty lines, never another variant's.
    allocated, reused = runtime.RESULTS.allocated, runtime.RESULTS.reused
    gc.disable()
    try:
        for rep in range(args.repeats):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for v in order:
                first, *items = v.pool.take(inner + 1)
                if v.prepare:
                    for item in (first, *items):
                        v.prepare(item)
                if v.before:
                    v.before()
                v.run(first)
                t = time.perf_counter()
                for item in items:
                    v.run(item)
                v.samples.append((time.perf_counter() - t) / inner)
                if v.after:
                    v.after()
    finally:
        gc.enable()
        if torch is not None:
            torch.set_num_threads(1)
    allocator = {"allocated": runtime.RESULTS.allocated - allocated, "reused": runtime.RESULTS.reused - reused}

    pools = {"functional": fpool, "in_place": next((v.pool for v in variants if v.group == "in place"), None)}
    med = {v.name: statistics.median(v.samples) for v in variants}
    best = {v.name: min(v.samples) for v in variants}
    rows = {}
    for v in variants:
        rows[v.name] = {
            "median_s": med[v.name], "min_s": best[v.name], "max_s": max(v.samples),
            "vs": v.ref, "ratio_vs": med[v.name] / med[v.ref] if v.ref in med else None,
            # best against best: noise only ever adds time, so on a busy machine this is the steadier ratio
            "ratio_vs_best": best[v.name] / best[v.ref] if v.ref in best else None,
            "floor": v.floor, "group": v.group, "threads": v.threads,
            "samples_s": v.samples,
        }
    return {
        "H": H, "Dh": Dh, "B": B, "S_past": S, "cache_bytes": z.cache_bytes, "inner": inner,
        "sets": {k: len(p.sets) if p else 0 for k, p in pools.items()},
        "working_set_bytes": {k: len(p.sets) * p.nbytes_each if p else 0 for k, p in pools.items()},
        "bytes": {k: {"read": r, "written": w} for k, (r, w) in moved.items()},
        "allocator": allocator,
        "variants": rows,
    }


def fit_floors(results: list[dict], bw: dict[int, dict]) -> None:
    """Step 2 and 3 of the floor model (see the docstring): on n threads at least what fewer
    threads did, then raised until no variant on at most n threads has a sample below its floor."""
    prev = None
    for n in sorted(bw):
        b = bw[n]
        for kind in ("read", "copy"):
            if prev is not None and prev[kind] > b[kind]:
                b[kind], b[f"{kind}_by"] = prev[kind], prev[f"{kind}_by"]
        for kind in ("in place", "functional"):  # in place raises read; then the rest raise copy
            for r in results:
                R, W = r["bytes"][kind]["read"], r["bytes"][kind]["written"]
                m = min(R, W)
                for name, v in r["variants"].items():
                    t = v["min_s"]
                    if v["floor"] != kind or v["threads"] > n or floor_seconds(R, W, b["read"], b["copy"]) <= t:
                        continue
                    which = "read" if kind == "in place" else "copy"
                    rest = m / b["copy"] if which == "read" else (R - m) / b["read"]
                    if rest < t:
                        b[which] = (R - m if which == "read" else m) / (t - rest)
                    f = floor_seconds(R, W, b["read"], b["copy"])
                    if f > t:  # the other bandwidth is beaten too (never seen): raise both
                        b["read"], b["copy"] = b["read"] * f / t, b["copy"] * f / t
                    b[f"{which}_by"] = (f"{name} at H={r['H']} Dh={r['Dh']} S_past={r['S_past']} "
                                        f"(its best sample)")
        prev = b


def floor_of(r: dict, bw: dict[int, dict], kind: str, threads: int) -> float:
    m = r["bytes"][kind]
    return floor_seconds(m["read"], m["written"], bw[threads]["read"], bw[threads]["copy"])


def add_floors(r: dict, bw: dict[int, dict]) -> None:
    """Fill in each size's floors and every variant's ratio to its floor, from the run's bandwidth."""
    r["floor_s_threads"] = {str(n): {k: floor_of(r, bw, k, n) for k in r["bytes"]} for n in bw}
    r["floor_s"] = r["floor_s_threads"][str(min(bw))]  # one thread's, as the plot draws them
    for v in r["variants"].values():
        v["floor_s"] = r["floor_s_threads"][str(v["threads"])][v["floor"]]
        v["ratio_floor"] = v["median_s"] / v["floor_s"]


# -- compile time ------------------------------------------------------------------

def measure_compile(repeats: int) -> dict:
    from kina.driver import pipeline
    src, name = STATIC_EXAMPLE.read_bytes(), str(STATIC_EXAMPLE.relative_to(ROOT))
    saved = {k: os.environ.get(k) for k in ("KINA_NO_CACHE", "KINA_CACHE_DIR")}
    cache = tempfile.mkdtemp(prefix="kina-bench-cache-")

    def timed_build() -> float:
        t = time.perf_counter()
        so = pipeline.build_so(src, name)
        dt = time.perf_counter() - t
        if os.environ.get("KINA_NO_CACHE") == "1":
            shutil.rmtree(so.parent, ignore_errors=True)
        return dt
    try:
        os.environ["KINA_NO_CACHE"] = "1"
        first = timed_build()
        cold = [timed_build() for _ in range(repeats)]
        os.environ.pop("KINA_NO_CACHE")
        os.environ["KINA_CACHE_DIR"] = cache
        populate = timed_build()
        warm = [timed_build() for _ in range(max(repeats, 5))]
        t = time.perf_counter()
        kina.compile_file(STATIC_EXAMPLE).close()
        warm_load = time.perf_counter() - t
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(cache, ignore_errors=True)
    return {"file": name, "first_s": first, "cold_s": cold, "cold_median_s": statistics.median(cold),
            "populate_s": populate, "warm_s": warm, "warm_median_s": statistics.median(warm),
            "warm_compile_file_and_load_s": warm_load}


# -- report ------------------------------------------------------------------------

def fmt_t(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def print_bandwidth(bw: dict[int, dict], passes: int) -> None:
    print(f"bandwidth (GB/s, best of {passes} passes of each kernel on 256 MiB; median in brackets):")
    for n, b in bw.items():
        kernels = ", ".join(f"{name} {c['best'] / 1e9:.1f} [{c['median'] / 1e9:.1f}]" for name, c in b["candidates"].items())
        print(f"  {n} thread{'s' * (n > 1)}: read {b['read'] / 1e9:.1f} ({b['read_by']}), "
              f"copy {b['copy'] / 1e9:.1f} ({b['copy_by']}, bytes copied per second)\n    kernels: {kernels}")


def print_size(r: dict) -> None:
    fl = r["floor_s_threads"]
    floors = "; ".join(f"{n}T functional {fmt_t(f['functional'])}, in place {fmt_t(f['in place'])}" for n, f in fl.items())
    a = r["allocator"]
    print(f"\nH={r['H']} Dh={r['Dh']} S_past={r['S_past']}  cache {r['cache_bytes'] / MIB:.2f} MiB  "
          f"sets {r['sets']['functional']}/{r['sets']['in_place']} "
          f"(working set {r['working_set_bytes']['functional'] / MIB:.0f}/{r['working_set_bytes']['in_place'] / MIB:.0f} MiB)"
          f"  results allocator: {a['allocated']} allocated, {a['reused']} reused\n  floor ms: {floors}")
    print(f"  {'variant':<23} {'median (min-max) ms':>27} {'x ref':>6} {'(best)':>7}  {'ref':<23} {'x floor':>7} "
          f"{'K+V GB/s':>8}")
    for name, v in r["variants"].items():
        span = f"{fmt_t(v['median_s'])} ({fmt_t(v['min_s'])}-{fmt_t(v['max_s'])})"
        ratio = f"{v['ratio_vs']:.2f}" if v["ratio_vs"] is not None else "-"
        best = f"({v['ratio_vs_best']:.2f})" if v["ratio_vs_best"] is not None else "-"
        print(f"  {name:<23} {span:>27} {ratio:>6} {best:>7}  {v['vs']:<23} {v['ratio_floor']:>7.2f} "
              f"{r['cache_bytes'] / v['median_s'] / 1e9:>8.1f}")


def markdown_table(report: dict) -> str:
    """The README's performance table: one row per size, from a report (medians)."""
    try:
        D = report["args"]["default_threads"]
        one, most = min(report["args"]["threads"]), max(report["args"]["threads"])
        bw = report["bandwidth"]["by_threads"][str(one)]["read"]
    except (KeyError, TypeError, ValueError) as e:
        raise SystemExit(f"--markdown: the report lacks {e} (it predates --markdown: run the benchmark again)")

    def ms(v):
        return f"{fmt_t(v['median_s'])} ms" if v else "-"

    def best_of(v, lib):
        rows = [x for name, x in v.items() if name.startswith(f"{lib} ")]
        return ms(min(rows, key=lambda x: x["median_s"])) if rows else "-"

    def ratio(v, a, b):
        return f"{v[a]['median_s'] / v[b]['median_s']:.2f}" if a in v and b in v else "-"
    lines = [f"| H, Dh | S_past (cache) | Kina fn() {one}T / {most}T | vs call_into ({one}T, loop {one}T) | "
             f"{D}T vs NumPy | NumPy | torch best | ort best | in place {one}T / {most}T | "
             f"vs NumPy in place ({one}T) | in place {one}T reads K+V at |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["sizes"]:
        v, c = r["variants"], r["cache_bytes"]
        ip = v.get(f"kina in place {one}T")
        reads = f"{c / ip['median_s'] / 1e9:.1f} GB/s ({c / ip['median_s'] / bw:.0%})" if ip else "-"
        lines.append(
            f"| {r['H']}, {r['Dh']} | {r['S_past']} ({c / MIB:g} MiB) | "
            f"{ms(v.get(f'kina fn() {one}T'))[:-3]} / {ms(v.get(f'kina fn() {most}T'))} | "
            f"{ratio(v, f'kina fn() {one}T', f'kina call_into {one}T')}, "
            f"{ratio(v, f'kina loop fn() {one}T', f'kina loop call_into {one}T')} | "
            f"{ratio(v, f'kina fn() {D}T', 'numpy')} | {ms(v.get('numpy'))} | {best_of(v, 'torch')} | "
            f"{best_of(v, 'ort')} | {fmt_t(ip['median_s']) if ip else '-'} / {ms(v.get(f'kina in place {most}T'))} | "
            f"{ratio(v, f'kina in place {one}T', 'numpy in place')} | {reads} |")
    return "\n".join(lines)


# -- plot --------------------------------------------------------------------------

REPORT_FORMAT = "kina-bench-kv-step-1"
# Colour by implementation (the first prefix that matches), marker by thread count, line by
# group: solid one-off, dash-dot host loop, dashed in place. Reports from before the groups
# existed give the line by floor instead. Anything else gets the next default colour.
COLOURS = (("kina loop fn()", "tab:pink"), ("kina loop", "tab:cyan"), ("kina fn()", "tab:purple"),
           ("kina call_into", "tab:brown"), ("kina", "tab:blue"), ("numpy", "tab:orange"), ("torch", "tab:green"), ("ort", "tab:red"))
MARKERS = {"1T": "o", "2T": "^"}
GROUP_LINES = {"one-off": "-", "host loop": "-.", "in place": "--"}
FLOOR_LINES = {"functional": "-", "in place": "--"}


def look(name: str, v: dict) -> tuple[str | None, str, str]:
    """(colour, marker, line style) of a variant's curve."""
    colour = next((c for prefix, c in COLOURS if name.startswith(prefix)), None)
    marker = MARKERS.get(name.rsplit(" ", 1)[-1], "s")
    line = GROUP_LINES[v["group"]] if "group" in v else FLOOR_LINES.get(v["floor"], ":")
    return colour, marker, line


def load_report(path: str) -> dict:
    """A report written by this script (--json), or SystemExit saying what is wrong with the file."""
    try:
        report = json.loads(Path(path).read_text())
    except OSError as e:
        raise SystemExit(f"error: --from-json: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise SystemExit(f"error: --from-json: {path} is not JSON: {e}") from None
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        got = report.get("format") if isinstance(report, dict) else type(report).__name__
        raise SystemExit(f"error: --from-json: expected a {REPORT_FORMAT!r} report (from --json), "
                         f"got format {got!r} in {path}")
    return report


def plot(report: dict, path: str | Path) -> Path:
    """Each variant's median time per cache size, with the floors: one panel per HxDh."""
    shapes = list(dict.fromkeys((r["H"], r["Dh"]) for r in report["sizes"]))
    fig, axes = plotting.figure(640, ncols=len(shapes), layout="constrained", squeeze=False)
    for ax, (H, Dh) in zip(axes[0], shapes):
        rows = sorted((r for r in report["sizes"] if (r["H"], r["Dh"]) == (H, Dh)), key=lambda r: r["cache_bytes"])
        mib = [r["cache_bytes"] / MIB for r in rows]
        for name in dict.fromkeys(n for r in rows for n in r["variants"]):
            have = [(m, r["variants"][name]) for m, r in zip(mib, rows) if name in r["variants"]]
            colour, marker, line = look(name, have[0][1])
            ax.plot([m for m, _ in have], [v["median_s"] * 1e3 for _, v in have], line, marker=marker, ms=4,
                    lw=1.2, color=colour, label=name)
        floors = rows[0].get("floor_s_threads", {"1": rows[0]["floor_s"]})
        for i, n in enumerate(floors):  # one thread's floors thick, more threads' thinner
            for kind, style in FLOOR_LINES.items():
                ax.plot(mib, [r.get("floor_s_threads", {n: r["floor_s"]})[n][kind] * 1e3 for r in rows], style,
                        color="black", lw=3 if i == 0 else 1.5, alpha=0.3, label=f"floor, {kind}, {n}T")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(mib, [f"{m:g}\nS={r['S_past']}" for m, r in zip(mib, rows)])
        ax.set_xticks([], minor=True)  # the sizes measured, and no others
        plotting.plain_log_ticks(ax.yaxis)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"H={H} heads, Dh={Dh}")
        ax.set_xlabel("K+V cache attended, MiB (S = S_past)")
    axes[0][0].set_ylabel("time per step, ms (median, log scale)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=8)

    m, bw, args = report["machine"], report["bandwidth"]["Bps"], report["args"]
    defaults = vars(parse_args([]))
    subset = [f"--{k.replace('_', '-')} {args[k]}" for k in ("shapes", "s_past") if args.get(k) != defaults[k]]
    fig.suptitle(f"kv_step decode step (F32, B=1): median of {args['repeats']} samples per variant"
                 + (f" (sizes limited: {' '.join(subset)})" if subset else "")
                 + f"\n{m['cores']} cores, {m['cpu']}, shared with other work (noisy); NumPy on one thread, nT = n threads"
                 f"\nfloor = bytes the step moves at the best one-thread read {bw['read'] / 1e9:.1f} GB/s and "
                 f"copy {bw['copy'] / 1e9:.1f} GB/s seen; kina @ {report['versions']['commit']}", fontsize=10.5)
    return plotting.save(fig, path)


# -- targets -----------------------------------------------------------------------

OPS = {"<=": lambda v, lim: v <= lim, "<": lambda v, lim: v < lim, ">=": lambda v, lim: v >= lim}


def checks(results: list[dict], compile_t: dict | None, bw: dict[int, dict], default_threads: int) -> list[dict]:
    """The targets of issues 11 and 6 (see the docstring), each a dict with its value and verdict."""
    out = []

    def check(issue, what, value, op, limit, best=None):
        if value is not None:  # None: a variant that was skipped or could not run
            out.append({"issue": issue, "check": what, "value": value, "op": op, "limit": limit,
                        "pass": OPS[op](value, limit), "best_vs_best": best})

    def ratio(v, a, b, stat="median_s"):
        return v[a][stat] / v[b][stat] if a in v and b in v else None

    threads = sorted(bw)
    one, most, D = min(threads), max(threads), default_threads
    for r in results:
        if r["cache_bytes"] < TARGET_MIN_CACHE:
            continue
        v, tag = r["variants"], f"{r['cache_bytes'] / MIB:g} MiB (H={r['H']} Dh={r['Dh']} S={r['S_past']})"
        for n in threads:
            for pub, ref in ((f"kina fn() {n}T", f"kina call_into {n}T"), (f"kina loop fn() {n}T", f"kina loop call_into {n}T")):
                check(11, f"{tag}: {pub} / {ref}", ratio(v, pub, ref), "<=", 1.1, ratio(v, pub, ref, "min_s"))
        public = f"kina fn() {D}T"
        check(11, f"{tag}: {public} (default threads) / numpy", ratio(v, public, "numpy"), "<=", 0.6,
              ratio(v, public, "numpy", "min_s"))
        ip1 = v.get(f"kina in place {one}T")
        if ip1 and r["cache_bytes"] >= 16 * MIB:
            share = lambda t: r["cache_bytes"] / t / bw[one]["read"]  # noqa: E731
            check(11, f"{tag}: kina in place {one}T reads K+V at this share of read_bw[{one}] "
                      f"({bw[one]['read'] / 1e9:.1f} GB/s)", share(ip1["median_s"]), ">=", 0.85, share(ip1["min_s"]))
        elif ip1:
            check(11, f"{tag}: kina in place {one}T / numpy in place", ip1["ratio_vs"], "<=", 1.0, ip1["ratio_vs_best"])
        if r["cache_bytes"] >= 64 * MIB and most > one:
            a, b = f"kina in place {one}T", f"kina in place {most}T"
            check(11, f"{tag}: speed-up of {b} over {a}", ratio(v, a, b), ">=", 1.25, ratio(v, a, b, "min_s"))
        for lib in ("torch", "ort"):
            rows = [name for name in v if name.startswith(f"{lib} ")]
            if rows and public in v:
                fastest = min(rows, key=lambda name: v[name]["median_s"])
                check(11, f"{tag}: {public} / {fastest} (its best thread count)", ratio(v, public, fastest), "<", 1.0,
                      ratio(v, public, min(rows, key=lambda name: v[name]["min_s"]), "min_s"))
        kernel = "kina call_unchecked 1T"
        if kernel in v:
            check(6, f"{tag}: {kernel} / numpy", v[kernel]["ratio_vs"], "<=", 0.6, v[kernel]["ratio_vs_best"])
            check(6, f"{tag}: {kernel} / floor", v[kernel]["ratio_floor"], "<=", 1.5)
            for name in (n for n in v if n.startswith("torch ")):
                check(6, f"{tag}: {kernel} / {name}", ratio(v, kernel, name), "<", 1.0, ratio(v, kernel, name, "min_s"))
        if ip1:
            check(6, f"{tag}: kina in place {one}T / numpy in place", ip1["ratio_vs"], "<=", 0.75, ip1["ratio_vs_best"])
            check(6, f"{tag}: kina in place {one}T / floor", ip1["ratio_floor"], "<=", 1.3)
    if compile_t:
        check(11, "cold compile (s)", compile_t["cold_median_s"], "<=", 0.200)
        check(11, "cache hit (s)", compile_t["warm_median_s"], "<=", 0.001)
    return out


def print_checks(results_checks: list[dict]) -> None:
    for issue in (11, 6):
        mine = [c for c in results_checks if c["issue"] == issue]
        print(f"\nissue {issue} targets: {sum(c['pass'] for c in mine)} of {len(mine)} pass")
        for c in mine:
            best = f"; best vs best {c['best_vs_best']:.3f}" if c["best_vs_best"] is not None else ""
            print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['check']}: {c['value']:.3f} (limit {c['op']} {c['limit']}{best})")


def thread_counts(text: str) -> list[int]:
    try:
        counts = {int(t) for t in text.split(",") if t.strip()}
    except ValueError:
        counts = set()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return sorted(counts)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                epilog="See the module docstring for the method and the floor model.")
    p.add_argument("--shapes", default="32x128,8x64", help="comma-separated HxDh (default: 32x128,8x64)")
    p.add_argument("--s-past", default="127,511,2047,8191", help="comma-separated S_past values")
    p.add_argument("--threads", type=thread_counts, default="1,2",
                   help="comma-separated thread counts for the threaded rows (default 1,2; "
                        "kina.runtime.default_threads() is always added)")
    p.add_argument("--repeats", type=int, default=15, help="timed samples per variant and size (default 15)")
    p.add_argument("--compile-repeats", type=int, default=5, help="cold compiles to time (default 5)")
    p.add_argument("--bw-repeats", type=int, default=5, help="bandwidth passes at the start and at the end")
    p.add_argument("--working-set-mib", type=int, default=None,
                   help="least total size of the rotated input sets (default: 8x the last-level cache)")
    p.add_argument("--no-compile-time", action="store_true", help="skip the compile-time measurement")
    p.add_argument("--skip", default="", help="comma-separated variant names to leave out, e.g. 'torch 2T'")
    p.add_argument("--quick", action="store_true", help="a fast look: S_past 127,2047, 5 repeats, 3 compiles")
    p.add_argument("--json", default=str(ROOT / "build" / "bench_kv_step.json"), help="where to write the JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the times per cache size, with the floors")
    p.add_argument("--from-json", metavar="FILE",
                   help="with --plot or --markdown: use this report (from --json), measure nothing")
    p.add_argument("--markdown", action="store_true", help="also print the README's table (medians) of the report")
    a = p.parse_args(argv)
    if a.from_json and not (a.plot or a.markdown):
        p.error("--from-json reads a report: give --plot FILE.png or --markdown too")
    if a.plot:
        plotting.check_target(a.plot)  # before a long run, not after it
    if a.quick:
        a.s_past, a.repeats, a.compile_repeats, a.bw_repeats = "127,2047", 5, 3, 3
    a.sizes = [Size(*map(int, hd.lower().split("x")), int(s)) for hd in a.shapes.split(",") for s in a.s_past.split(",")]
    a.skip = {n.strip() for n in a.skip.split(",") if n.strip()}
    a.working_set = (a.working_set_mib or 8 * llc_bytes() // MIB) * MIB
    try:
        a.default_threads = runtime.default_threads()
    except ValueError as e:  # a bad KINA_NUM_THREADS
        p.error(str(e))
    a.threads = sorted({*a.threads, a.default_threads})
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        report = load_report(args.from_json)
        if args.markdown:
            print(markdown_table(report))
        if args.plot:
            print(f"wrote {plot(report, args.plot)}")
        return 0
    notes: list[str] = []
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if os.environ.get(var):
            notes.append(f"{var}={os.environ[var]} is set: NumPy may run a slower OpenBLAS kernel "
                         f"(run with env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)")
    load_start = os.getloadavg()[0]  # the machine is shared: a busy neighbour shows up here
    corename, set_blas_threads = openblas()
    if set_blas_threads:
        set_blas_threads(1)
    else:
        notes.append("could not set NumPy's OpenBLAS thread count")
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
        notes.append("torch is not installed: the torch rows are skipped")
    sessions, ort_version = ort_sessions(args.threads, notes)
    commit = git_commit()  # now: others may commit while this runs

    print(f"kv_step benchmark: {cpu_model()}, {os.cpu_count()} cores, LLC {llc_bytes() / MIB:.0f} MiB; "
          f"numpy {np.__version__} (OpenBLAS {corename}, 1 thread)"
          + (f", torch {torch.__version__}" if torch else "") + (f", onnxruntime {ort_version}" if ort_version else "")
          + f"; kina {kina.__version__} @ {commit}, default threads {args.default_threads}; "
          f"threads {','.join(map(str, args.threads))}; load average {os.getloadavg()[0]:.2f}")

    compile_t = None if args.no_compile_time else measure_compile(args.compile_repeats)
    if compile_t:
        print(f"compile {compile_t['file']}: cold {fmt_t(compile_t['cold_median_s'])} ms median "
              f"({fmt_t(min(compile_t['cold_s']))}-{fmt_t(max(compile_t['cold_s']))}, first in process "
              f"{fmt_t(compile_t['first_s'])}); warm (cache hit) {fmt_t(compile_t['warm_median_s'])} ms, "
              f"compile_file+load {fmt_t(compile_t['warm_compile_file_and_load_s'])} ms")

    with fresh_compiles():
        mod = kina.compile_file(DYN_EXAMPLE)
        copy_kernel = kina.compile_source(COPY_KERNEL, "<bench_kv_step COPY_KERNEL>").copy

    def measure_bandwidth(passes: int) -> dict:
        return BandwidthKernels(copy_kernel, torch).measure(args.threads, passes)
    bw_samples = measure_bandwidth(args.bw_repeats)
    results = []
    for z in args.sizes:  # bandwidth samples between sizes too, so a noisy spell does not set the floor
        t = time.perf_counter()
        rough = bandwidth(bw_samples)[args.threads[0]]  # sizes the timing batches only
        results.append(run_size(z, args, mod, torch, sessions, rough, notes))
        gc.collect()
        runtime.release_memory()  # the results allocator's blocks of this size: not needed again
        add_samples(bw_samples, measure_bandwidth(2))
        print(f"  {z.label}: {time.perf_counter() - t:.1f} s", flush=True)
    add_samples(bw_samples, measure_bandwidth(args.bw_repeats))
    bw = bandwidth(bw_samples)
    measured = {n: {k: b[k] for k in ("read", "copy")} for n, b in bw.items()}
    fit_floors(results, bw)
    for n, b in bw.items():
        for k in ("read", "copy"):
            if b[k] > measured[n][k]:
                notes.append(f"{k}_bw[{n}] raised from the kernels' {measured[n][k] / 1e9:.1f} to "
                             f"{b[k] / 1e9:.1f} GB/s by {b[f'{k}_by']}")
    print_bandwidth(bw, len(bw_samples[str(args.threads[0])]["copy"]["np.copyto"]))
    for r in results:
        add_floors(r, bw)
        print_size(r)

    results_checks = checks(results, compile_t, bw, args.default_threads)
    print_checks(results_checks)
    notes.append(f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
                 f"(the machine is shared: a busy neighbour slows some samples, most of all multi-threaded ones)")
    for n in notes:
        print(f"note: {n}")

    report = {
        "format": REPORT_FORMAT, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "llc_bytes": llc_bytes(),
                    "load_average_start_end": [load_start, os.getloadavg()[0]],
                    "openblas_core": corename, "env": {k: os.environ.get(k) for k in
                                                       ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "KINA_NUM_THREADS")}},
        "versions": {"kina": kina.__version__, "commit": commit, "numpy": np.__version__,
                     "torch": torch.__version__ if torch else None, "onnxruntime": ort_version,
                     "python": platform.python_version()},
        "args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items() if k != "sizes"},
        "bandwidth": {"Bps": {k: v for k, v in bw[min(bw)].items() if k != "candidates"},
                      "by_threads": {str(n): b for n, b in bw.items()}, "kernels_Bps": measured,
                      "samples_Bps": bw_samples},
        "compile": compile_t, "sizes": results, "checks": results_checks, "notes": notes,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    if args.markdown:
        print(markdown_table(report))
    if args.plot:
        print(f"wrote {plot(report, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
