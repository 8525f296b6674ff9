#!/usr/bin/env python3
"""Benchmark the Section 19 decode step (issue 6): Kina against NumPy and PyTorch, and the bandwidth floor.

Run it (from the repo root; the `env -u` matters, see below):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_kv_step.py
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_kv_step.py --quick
    ... scripts/bench_kv_step.py --shapes 32x128 --s-past 2047,8191 --repeats 21 --json build/b.json
    ... scripts/bench_kv_step.py --repeats 3 --plot docs/bench_kv_step.png
    .venv/bin/python scripts/bench_kv_step.py --plot FILE.png --from-json build/bench_kv_step.json

Some machines here set OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE, which force an older, slower
OpenBLAS kernel under NumPy; unset both together, for this command only (never in tests or
CI). The run records which OpenBLAS core NumPy ended up with, and warns if either is set.
The full run takes about a minute and needs about 3 GiB of memory; `--quick` about 20 s.

What runs, in one process, interleaved (each repeat visits every variant, in a rotating order):
  kina functional    examples/storylm0_kv_step_dyn.kina (symbolic dims, one .so for every S),
                     compiled by kina.compile_file (with KINA_NO_CACHE=1, so the current compiler
                     is what gets measured) and called through Function.call_unchecked with
                     preallocated results: the kernel, with the same buffers NumPy gets.
  kina fn() API      the same .so through the public call `mod.kv_step(...)`: argument checks
                     and fresh result arrays (page faults included) on every call. Information only.
  numpy              np.concatenate and np.matmul with out=, a stable softmax, into preallocated buffers.
  torch 1T / 2T      PyTorch eager with out= (torch.cat, torch.matmul, aten._softmax.out) on the same
                     memory (torch.from_numpy), with torch.set_num_threads(1) and (2). If torch imports.
                     After each 2-thread sample (not timed) torch goes back to one thread and the run
                     sleeps 20 ms: libgomp's idle worker spins for milliseconds, which would otherwise
                     steal the second core from whatever runs next on this 2-core machine.
  kina in place      kina.decode.KVCache(B, H, Dh, T_max).step(q, k_new, v_new, float scale), after
                     crop(S_past) (not timed) so every call appends at position S_past. If it exists.
  numpy in place     append k_new/v_new into preallocated [B,H,Dh,T_max] / [B,H,T_max,Dh] buffers,
                     then attend over the filled prefix (strided views), results into scratch.
NumPy's OpenBLAS is set to one thread, and Kina's code is single-threaded.

Inputs rotate across independent sets: enough sets that their total size is at least
--working-set-mib (default 8x the last-level cache) and never fewer than two, with one counter
per pool shared by the variants that use it, so no call finds its data left in cache by the
previous one. Short calls are timed in batches over consecutive sets (~0.5 ms a sample).
Each sample starts with one untimed call of the same variant on another set, so every timed
call finds the cache as a loop of that variant leaves it: it pays for writing back its own
predecessor's dirty lines (as it would in a decode loop), never another variant's.
Every array starts on a 64-byte boundary (kina.runtime.empty), as Kina allocates its results:
in a decode loop the caches passed in are the previous step's results. All variants share them.

Bandwidth, measured in the same run (one thread, 256 MiB arrays, at the start, between sizes
and at the end; the best pass counts, since noise only slows a pass down): read = bytes / time
of the faster of np.sum(a) and np.dot(first half, second half) (one read stream, or two);
copy = bytes copied / time of np.copyto(b, a) (glibc memcpy, which streams large copies with
non-temporal stores). The floor model: a step
that reads R bytes and writes W <= R bytes costs at least
    t_floor = R / read_bw + W * (1 / copy_bw - 1 / read_bw)
i.e. every written byte rides with a read byte as a copy, and the remaining reads cost a read.
  functional: R = K_past + V_past + q + k_new + v_new + scale, W = K_next + V_next + context;
              the floor is about (K+V) / copy_bw.
  in place:   R = the filled K and V prefix (S_past+1 positions) + q + k_new + v_new,
              W = the new position + context; the floor is about (K+V) / read_bw.

Compile time, in-process through kina.pipeline.build_so on examples/storylm0_kv_step.kina:
cold = KINA_NO_CACHE=1 (median of --compile-repeats, after one untimed build that pays the
one-time imports, which is reported as "first"); warm = a cache hit in a fresh KINA_CACHE_DIR.

Ratios are of medians; "(best)" and "best vs best" divide the two variants' fastest samples,
which is the steadier figure when a neighbour is busy (the load average is printed and kept).

Targets (issue 6), judged on the medians, checked for caches (K+V of S_past+1 positions) of
4 MiB and up, printed as PASS/FAIL: functional <= 0.6x NumPy and <= 1.5x its floor; in place <= 0.75x NumPy in place and
<= 1.3x its floor; kina functional faster than torch 1T and 2T; cold compile <= 300 ms.
The JSON (--json, default build/bench_kv_step.json) has every figure, the samples and the checks.
The exit status is 0 whether or not the targets pass: this measures, it does not gate.

--plot FILE.png draws each variant's median time against the cache size, one panel per HxDh,
with both floors (needs matplotlib, in the [bench] extra); with --from-json it draws a
report written earlier instead of measuring.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import kina
import plotting
from kina.decode import KVCache
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


def measure_bandwidth(repeats: int, nbytes: int = 256 * MIB) -> dict[str, list[float]]:
    """Read (np.sum) and copy (np.copyto) bandwidth in bytes/s, one sample per pass."""
    a = np.ones(nbytes // F32, np.float32)
    b = np.zeros_like(a)
    b.fill(1.0)  # fault the pages in
    lo, hi = a[:a.size // 2], a[a.size // 2:]
    out: dict[str, list[float]] = {"read_sum": [], "read_dot": [], "copy": []}
    for _ in range(repeats):
        for key, f in (("read_sum", a.sum), ("read_dot", lambda: np.dot(lo, hi)), ("copy", lambda: np.copyto(b, a))):
            t = time.perf_counter()
            f()
            out[key].append(nbytes / (time.perf_counter() - t))
    return out


def bandwidth(samples: dict[str, list[float]]) -> dict[str, float]:
    """The best of all samples (noise only ever slows a pass down, so the best is the closest to
    the machine's real figure); read is the faster of np.sum (one stream) and np.dot (two)."""
    best = {k: max(v) for k, v in samples.items()}
    return {"read": max(best["read_sum"], best["read_dot"]), **best,
            **{f"{k}_median": statistics.median(v) for k, v in samples.items()}}


def add_samples(into: dict[str, list[float]], more: dict[str, list[float]]) -> None:
    for k, v in more.items():
        into.setdefault(k, []).extend(v)


def floor_seconds(read_bytes: int, write_bytes: int, read_bw: float, copy_bw: float) -> float:
    return read_bytes / read_bw + write_bytes * max(0.0, 1 / copy_bw - 1 / read_bw)


# -- the step, in NumPy and PyTorch ------------------------------------------------

def softmax_numpy(scores, m, s):
    np.max(scores, axis=3, keepdims=True, out=m)
    np.subtract(scores, m, out=scores)
    np.exp(scores, out=scores)
    np.sum(scores, axis=3, keepdims=True, out=s)
    np.divide(scores, s, out=scores)


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
    floor: str = "functional"
    samples: list[float] = field(default_factory=list)


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


# -- the run -----------------------------------------------------------------------

def build_variants(z: Size, args, fpool: Pool, rng, mod, torch, set_blas_threads, notes: list[str]) -> list[Variant]:
    B, H, Dh, S = z.B, z.H, z.Dh, z.S
    fn = mod.kv_step
    variants: list[Variant] = []

    # kina functional: checked once per set here, then the raw call in the timed loop
    for d in fpool.sets:
        d["bound"], _ = bind(fn.signature, d["args"])
    variants.append(Variant("kina functional", fpool, lambda d: fn.call_unchecked(d["bound"], d["outs"])))
    variants.append(Variant("kina fn() API", fpool, lambda d: fn(*d["args"])))

    scores = np.zeros((B, H, 1, S + 1), np.float32)
    m = np.zeros((B, H, 1, 1), np.float32)
    s = np.zeros((B, H, 1, 1), np.float32)

    def numpy_step(d):
        np.concatenate([d["k_past"], d["k_new"]], axis=3, out=d["k_next"])
        np.concatenate([d["v_past"], d["v_new"]], axis=2, out=d["v_next"])
        np.matmul(d["q"], d["k_next"], out=scores)
        np.multiply(scores, d["scale"], out=scores)
        softmax_numpy(scores, m, s)
        np.matmul(scores, d["v_next"], out=d["context"])
    variants.append(Variant("numpy", fpool, numpy_step))

    if torch is not None:
        for d in fpool.sets:
            d["t"] = {k: torch.from_numpy(v) for k, v in d.items() if isinstance(v, np.ndarray)}
        t_scores, t_probs = torch.from_numpy(scores), torch.zeros((B, H, 1, S + 1))
        softmax_out = torch.ops.aten._softmax.out

        def torch_step(d):
            t = d["t"]
            torch.cat([t["k_past"], t["k_new"]], dim=3, out=t["k_next"])
            torch.cat([t["v_past"], t["v_new"]], dim=2, out=t["v_next"])
            torch.matmul(t["q"], t["k_next"], out=t_scores)
            torch.mul(t_scores, t["scale"], out=t_scores)
            softmax_out(t_scores, 3, False, out=t_probs)
            torch.matmul(t_probs, t["v_next"], out=t["context"])
        def settle():  # let torch's OpenMP worker stop spinning before the next variant runs
            torch.set_num_threads(1)
            time.sleep(0.02)
        variants.append(Variant("torch 1T", fpool, torch_step, before=lambda: torch.set_num_threads(1)))
        variants.append(Variant("torch 2T", fpool, torch_step, before=lambda: torch.set_num_threads(2), after=settle))

    # in place
    T = S + 1 + T_MAX_SLACK
    per_set = 2 * B * H * Dh * T * F32
    n_sets = n_sets_for(per_set, args.working_set)
    small = fpool.sets  # q, k_new, v_new, scale come from the functional sets (a few KiB each)

    def fresh_prefix():
        k, v = aligned_empty((B, H, Dh, T)), aligned_empty((B, H, T, Dh))  # like KVCache's buffers
        k.fill(np.nan)  # the unused slots hold NaN: they must not matter
        v.fill(np.nan)
        k[..., :S] = rng.standard_normal((B, H, Dh, S), dtype=np.float32)
        v[:, :, :S] = rng.standard_normal((B, H, S, Dh), dtype=np.float32)
        return k, v

    caches = []
    for i in range(n_sets):
        k, v = fresh_prefix()
        c = KVCache(B, H, Dh, T)
        c.append(k[..., :S], v[:, :, :S])
        caches.append({"cache": c, "small": small[i % len(small)]})
    item = caches[0]
    d = item["small"]
    item["cache"].crop(S)
    got = item["cache"].step(d["q"], d["k_new"], d["v_new"], d["scale_f"])
    want = reference(d["q"], item["cache"].keys()[..., :S], d["k_new"],
                     item["cache"].values()[:, :, :S], d["v_new"], d["scale"])[2]
    if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        notes.append(f"{z.label}: kina in place context differs from NumPy "
                     f"(max abs error {float(np.abs(got - want).max()):.3g})")
    ipool = Pool(caches, per_set)

    def kina_inplace(item):
        d = item["small"]
        item["cache"].step(d["q"], d["k_new"], d["v_new"], d["scale_f"])
    variants.append(Variant("kina in place", ipool, kina_inplace, prepare=lambda it: it["cache"].crop(S),
                            ref="numpy in place", floor="in place"))

    bufs = []
    for i in range(n_sets):
        k, v = fresh_prefix()
        bufs.append({"k": k, "v": v, "small": small[i % len(small)], "context": np.zeros((B, H, 1, Dh), np.float32)})
    npool = Pool(bufs, per_set)

    def numpy_inplace(item):
        d, k, v = item["small"], item["k"], item["v"]
        np.copyto(k[..., S:S + 1], d["k_new"])
        np.copyto(v[:, :, S:S + 1], d["v_new"])
        np.matmul(d["q"], k[..., :S + 1], out=scores)
        np.multiply(scores, d["scale"], out=scores)
        softmax_numpy(scores, m, s)
        np.matmul(scores, v[:, :, :S + 1], out=item["context"])
    variants.append(Variant("numpy in place", npool, numpy_inplace, ref="numpy in place", floor="in place"))
    return variants


def spot_check(z: Size, fpool: Pool, variants: list[Variant], notes: list[str]) -> None:
    """One call of each functional variant on set 0 against the plain reference."""
    d = fpool.sets[0]
    k_ref, v_ref, c_ref = reference(*d["args"])
    for v in variants:
        if v.pool is not fpool or v.name == "kina fn() API":
            continue
        if v.before:
            v.before()
        d["context"].fill(np.nan)
        v.run(d)
        ok = (np.array_equal(d["k_next"], k_ref) and np.array_equal(d["v_next"], v_ref)
              and np.allclose(d["context"], c_ref, rtol=1e-4, atol=1e-5))
        if not ok:
            notes.append(f"{z.label}: {v.name} disagrees with the NumPy reference")


def run_size(z: Size, args, mod, torch, set_blas_threads, bw: dict, notes: list[str]) -> dict:
    """Time every variant on one size; `bw` (a first estimate) only sizes the timing batches."""
    rng = np.random.default_rng(z.S * 1000 + z.H)
    fpool = make_functional_pool(z, args.working_set, rng)
    variants = [v for v in build_variants(z, args, fpool, rng, mod, torch, set_blas_threads, notes)
                if v.name not in args.skip]
    spot_check(z, fpool, variants, notes)

    B, H, Dh, S = z.B, z.H, z.Dh, z.S
    kv_past, kv_next = 2 * B * H * Dh * S * F32, 2 * B * H * Dh * (S + 1) * F32
    small_in, one_pos, ctx = (B * H * Dh * 3 + 1) * F32, 2 * B * H * Dh * F32, B * H * Dh * F32
    moved = {"functional": (kv_past + small_in, kv_next + ctx), "in place": (kv_next + small_in, one_pos + ctx)}
    rough_floor = floor_seconds(*moved["in place"], bw["read"], bw["copy"])
    inner = max(1, min(32, round(0.5e-3 / rough_floor), min(len(v.pool.sets) for v in variants) // 2))

    for v in variants:  # warm-up: one untimed sample each (code, page tables, thread pools)
        for item in v.pool.take(inner):
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

    ipool = next((v.pool for v in variants if v.floor == "in place"), None)
    med = {v.name: statistics.median(v.samples) for v in variants}
    best = {v.name: min(v.samples) for v in variants}
    rows = {}
    for v in variants:
        rows[v.name] = {
            "median_s": med[v.name], "min_s": min(v.samples), "max_s": max(v.samples),
            "vs": v.ref, "ratio_vs": med[v.name] / med[v.ref] if v.ref in med else None,
            # best against best: noise only ever adds time, so on a busy machine this is the steadier ratio
            "ratio_vs_best": min(v.samples) / best[v.ref] if v.ref in best else None,
            "floor": v.floor,
            "samples_s": v.samples,
        }
    return {
        "H": H, "Dh": Dh, "B": B, "S_past": S, "cache_bytes": z.cache_bytes, "inner": inner,
        "sets": {"functional": len(fpool.sets), "in_place": len(ipool.sets) if ipool else 0},
        "working_set_bytes": {"functional": len(fpool.sets) * fpool.nbytes_each,
                              "in_place": len(ipool.sets) * ipool.nbytes_each if ipool else 0},
        "bytes": {k: {"read": r, "written": w} for k, (r, w) in moved.items()},
        "variants": rows,
    }


def add_floors(r: dict, bw: dict) -> None:
    """Fill in each size's floors and every variant's ratio to its floor, from the run's bandwidth."""
    r["floor_s"] = {k: floor_seconds(m["read"], m["written"], bw["read"], bw["copy"]) for k, m in r["bytes"].items()}
    for v in r["variants"].values():
        v["ratio_floor"] = v["median_s"] / r["floor_s"][v["floor"]]


# -- compile time ------------------------------------------------------------------

def measure_compile(repeats: int) -> dict:
    from kina import pipeline
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


def print_size(r: dict) -> None:
    fl = r["floor_s"]
    print(f"\nH={r['H']} Dh={r['Dh']} S_past={r['S_past']}  cache {r['cache_bytes'] / MIB:.2f} MiB  "
          f"sets {r['sets']['functional']}/{r['sets']['in_place']} "
          f"(working set {r['working_set_bytes']['functional'] / MIB:.0f}/{r['working_set_bytes']['in_place'] / MIB:.0f} MiB)"
          f"  floor: functional {fmt_t(fl['functional'])} ms, in place {fmt_t(fl['in place'])} ms")
    print(f"  {'variant':<17} {'median (min-max) ms':>30} {'x ref':>7} {'(best)':>7}  {'ref':<15} {'x floor':>7}")
    for name, v in r["variants"].items():
        span = f"{fmt_t(v['median_s'])} ({fmt_t(v['min_s'])}-{fmt_t(v['max_s'])})"
        ratio = f"{v['ratio_vs']:.2f}" if v["ratio_vs"] is not None else "-"
        best = f"({v['ratio_vs_best']:.2f})" if v["ratio_vs_best"] is not None else "-"
        print(f"  {name:<17} {span:>30} {ratio:>7} {best:>7}  {v['vs']:<15} {v['ratio_floor']:>7.2f}")


# -- plot --------------------------------------------------------------------------

REPORT_FORMAT = "kina-bench-kv-step-1"
# Colour and marker by implementation, line by the floor a variant is held to: solid functional,
# dashed in place. A variant not listed here still gets drawn, in the next default colour.
LOOKS = {"kina functional": ("tab:blue", "o"), "kina in place": ("tab:blue", "o"), "kina fn() API": ("tab:purple", "x"),
         "numpy": ("tab:orange", "s"), "numpy in place": ("tab:orange", "s"),
         "torch 1T": ("tab:green", "^"), "torch 2T": ("tab:olive", "v")}
FLOOR_LINES = {"functional": "-", "in place": "--"}


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
    """Each variant's median time per cache size, with the two floors: one panel per HxDh."""
    shapes = list(dict.fromkeys((r["H"], r["Dh"]) for r in report["sizes"]))
    fig, axes = plotting.figure(560, ncols=len(shapes), layout="constrained", squeeze=False)
    for ax, (H, Dh) in zip(axes[0], shapes):
        rows = sorted((r for r in report["sizes"] if (r["H"], r["Dh"]) == (H, Dh)), key=lambda r: r["cache_bytes"])
        mib = [r["cache_bytes"] / MIB for r in rows]
        for name in dict.fromkeys(n for r in rows for n in r["variants"]):
            have = [(m, r["variants"][name]) for m, r in zip(mib, rows) if name in r["variants"]]
            colour, marker = LOOKS.get(name, (None, "o"))
            ax.plot([m for m, _ in have], [v["median_s"] * 1e3 for _, v in have],
                    FLOOR_LINES.get(have[0][1]["floor"], ":"), marker=marker, ms=5, color=colour, label=name)
        for kind, style in FLOOR_LINES.items():
            ax.plot(mib, [r["floor_s"][kind] * 1e3 for r in rows], style, color="black", lw=3, alpha=0.3,
                    label=f"floor, {kind}")
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
    fig.legend(handles, labels, loc="outside lower center", ncol=4)

    m, bw, args = report["machine"], report["bandwidth"]["Bps"], report["args"]
    defaults = vars(parse_args([]))
    subset = [f"--{k.replace('_', '-')} {args[k]}" for k in ("shapes", "s_past") if args.get(k) != defaults[k]]
    fig.suptitle(f"kv_step decode step (F32, B=1): median of {args['repeats']} samples per variant"
                 + (f" (sizes limited: {' '.join(subset)})" if subset else "")
                 + f"\n{m['cores']} cores, {m['cpu']}, shared with other work (noisy); Kina and NumPy on one thread"
                 f"\nfloor = bytes the step moves at the measured read {bw['read'] / 1e9:.1f} GB/s and "
                 f"copy {bw['copy'] / 1e9:.1f} GB/s; kina @ {report['versions']['commit']}", fontsize=10.5)
    return plotting.save(fig, path)


def checks(results: list[dict], compile_t: dict | None) -> list[dict]:
    out = []

    def check(what, value, limit, less_than=False, best=None):
        if value is None:  # a variant that was skipped or could not run
            return
        ok = value < limit if less_than else value <= limit
        out.append({"check": what, "value": value, "limit": limit, "pass": ok, "best_vs_best": best})

    for r in results:
        if r["cache_bytes"] < TARGET_MIN_CACHE:
            continue
        v, tag = r["variants"], f"H={r['H']} Dh={r['Dh']} S={r['S_past']}"
        f = v.get("kina functional")
        if f:
            check(f"{tag}: functional / numpy", f["ratio_vs"], 0.6, best=f["ratio_vs_best"])
            check(f"{tag}: functional / floor", f["ratio_floor"], 1.5)
        for t in ("torch 1T", "torch 2T"):
            if f and t in v:
                check(f"{tag}: functional / {t}", f["median_s"] / v[t]["median_s"], 1.0, less_than=True,
                      best=f["min_s"] / v[t]["min_s"])
        if "kina in place" in v:
            check(f"{tag}: in place / numpy in place", v["kina in place"]["ratio_vs"], 0.75,
                  best=v["kina in place"]["ratio_vs_best"])
            check(f"{tag}: in place / floor", v["kina in place"]["ratio_floor"], 1.3)
    if compile_t:
        check("cold compile (s)", compile_t["cold_median_s"], 0.300)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                epilog="See the module docstring for the method and the floor model.")
    p.add_argument("--shapes", default="32x128,8x64", help="comma-separated HxDh (default: 32x128,8x64)")
    p.add_argument("--s-past", default="127,511,2047,8191", help="comma-separated S_past values")
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
    p.add_argument("--from-json", metavar="FILE", help="with --plot: draw this report (from --json), measure nothing")
    a = p.parse_args(argv)
    if a.from_json and not a.plot:
        p.error("--from-json draws a report: give --plot FILE.png too")
    if a.plot:
        plotting.check_target(a.plot)  # before a long run, not after it
    if a.quick:
        a.s_past, a.repeats, a.compile_repeats, a.bw_repeats = "127,2047", 5, 3, 3
    a.sizes = [Size(*map(int, hd.lower().split("x")), int(s)) for hd in a.shapes.split(",") for s in a.s_past.split(",")]
    a.skip = {n.strip() for n in a.skip.split(",") if n.strip()}
    a.working_set = (a.working_set_mib or 8 * llc_bytes() // MIB) * MIB
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        print(f"wrote {plot(load_report(args.from_json), args.plot)}")
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

    print(f"kv_step benchmark: {cpu_model()}, {os.cpu_count()} cores, LLC {llc_bytes() / MIB:.0f} MiB; "
          f"numpy {np.__version__} (OpenBLAS {corename}, 1 thread)"
          + (f", torch {torch.__version__}" if torch else "") + f"; kina {kina.__version__} @ {git_commit()}; "
          f"load average {os.getloadavg()[0]:.2f}")

    compile_t = None if args.no_compile_time else measure_compile(args.compile_repeats)
    if compile_t:
        print(f"compile {compile_t['file']}: cold {fmt_t(compile_t['cold_median_s'])} ms median "
              f"({fmt_t(min(compile_t['cold_s']))}-{fmt_t(max(compile_t['cold_s']))}, first in process "
              f"{fmt_t(compile_t['first_s'])}); warm (cache hit) {fmt_t(compile_t['warm_median_s'])} ms, "
              f"compile_file+load {fmt_t(compile_t['warm_compile_file_and_load_s'])} ms")

    # Built fresh, not from the compile cache: its key does not cover the compiler's own source,
    # so during work on lower.py a cache hit could measure an older kernel.
    saved, os.environ["KINA_NO_CACHE"] = os.environ.get("KINA_NO_CACHE"), "1"
    try:
        mod = kina.compile_file(DYN_EXAMPLE)
    finally:
        os.environ.pop("KINA_NO_CACHE") if saved is None else os.environ.__setitem__("KINA_NO_CACHE", saved)
    bw_samples = measure_bandwidth(args.bw_repeats)
    results = []
    for z in args.sizes:  # bandwidth samples between sizes too, so a noisy spell does not set the floor
        t = time.perf_counter()
        results.append(run_size(z, args, mod, torch, set_blas_threads, bandwidth(bw_samples), notes))
        add_samples(bw_samples, measure_bandwidth(2))
        print(f"  {z.label}: {time.perf_counter() - t:.1f} s", flush=True)
        gc.collect()
    add_samples(bw_samples, measure_bandwidth(args.bw_repeats))
    bw = bandwidth(bw_samples)
    print(f"bandwidth (best of {len(bw_samples['copy'])} passes; median in brackets): read {bw['read'] / 1e9:.1f} GB/s "
          f"(np.sum {bw['read_sum'] / 1e9:.1f} [{bw['read_sum_median'] / 1e9:.1f}], np.dot {bw['read_dot'] / 1e9:.1f} "
          f"[{bw['read_dot_median'] / 1e9:.1f}]), copy {bw['copy'] / 1e9:.1f} [{bw['copy_median'] / 1e9:.1f}] GB/s "
          f"(bytes copied per second)")
    for r in results:
        add_floors(r, bw)
        print_size(r)

    results_checks = checks(results, compile_t)
    print()
    for c in results_checks:
        best = f"; best vs best {c['best_vs_best']:.3f}" if c["best_vs_best"] is not None else ""
        print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['check']}: {c['value']:.3f} (limit {c['limit']}, "
              f"{'<' if 'torch' in c['check'] else '<='}{best})")
    for n in notes:
        print(f"note: {n}")

    report = {
        "format": "kina-bench-kv-step-1", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "llc_bytes": llc_bytes(),
                    "load_average_start_end": [load_start, os.getloadavg()[0]],
                    "openblas_core": corename, "env": {k: os.environ.get(k) for k in
                                                       ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}},
        "versions": {"kina": kina.__version__, "commit": git_commit(), "numpy": np.__version__,
                     "torch": torch.__version__ if torch else None, "python": platform.python_version()},
        "args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items() if k != "sizes"},
        "bandwidth": {"Bps": bw, "samples_Bps": bw_samples},
        "compile": compile_t, "sizes": results, "checks": results_checks, "notes": notes,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    if args.plot:
        print(f"wrote {plot(report, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
