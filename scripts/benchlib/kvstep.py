"""The Section 19 decode step measured: its sizes, input sets, Kina's rows, one size's run.

In:  a Size (H, Dh, S_past, B), the compiled module of examples/storylm0_kv_step_dyn.kina
     (symbolic dims: one .so for every size), the thread counts, torch and onnxruntime
     sessions when they import (peers.py), and a working-set size.
Out: run_size's dict for the JSON report: per variant its samples, median, min, max and
     ratios (median and best against its reference variant), with the bytes the step
     moves, the input sets used and the results allocator's counts over the timed samples.
Guarantees: before timing, one call of every functional variant on the first set is checked
against the plain NumPy reference (k_next and v_next exact, context within 1e-4), every
Kina variant must give the same bits as the first, and likewise the in-place steps at
every thread count; a disagreement becomes a note, never a silent row.

Kina's rows ("nT" is a thread count):
  kina call_unchecked 1T   mod.kv_step.call_unchecked(bound, outs) on arguments bound once:
                           the kernel alone, on the same buffers NumPy gets.
  kina call_into nT        mod.kv_step.call_into(args, outs, threads=n) into preallocated
                           results: the kernel with the public call's checks.
  kina fn() nT             the public call mod.kv_step(*args, threads=n): argument checks, and
                           results from the runtime's recycling allocator, dropped at once.
  kina loop fn() nT        the Section 19 host loop, one chain per input set: each call's
                           k_next[..., :S], v_next[:, :, :S] (strided views, passed as they are)
                           are the next call's k_past, v_past, so S_past stays put.
  kina loop call_into nT   the same loop into two preallocated result sets per chain, in turn.
  kina in place nT         kina.models.KVCache(B, H, Dh, T_max, threads=n).step(q, k_new, v_new,
                           scale) after crop(S_past) (not timed), over caches with NaN in every
                           unused slot.
Inputs rotate across independent sets (timing.InputSets): enough that their total size is at
least the working set, never fewer than two. Every array starts on a 64-byte boundary
(kina.runtime.empty), as Kina allocates its results: in a decode loop the caches passed in
are the previous step's results. Short calls are timed in batches over consecutive sets
(about 0.5 ms a sample).
"""
from __future__ import annotations

import math
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass

import numpy as np

import kina
from kina import runtime
from kina.models import KVCache
from kina.runtime import bind
from kina.runtime import empty as aligned_empty
from validate_kv_cache import reference_numpy as reference  # the plain step, for the spot checks

from . import peers
from .floor import F32, bytes_moved, floor_seconds
from .machine import ROOT
from .timing import InputSets, Variant, n_sets_for, run_rounds, written

DYN_EXAMPLE = ROOT / "examples" / "storylm0_kv_step_dyn.kina"
STATIC_EXAMPLE = ROOT / "examples" / "storylm0_kv_step.kina"
T_MAX_SLACK = 256  # unused positions past the in-place fill, so the filled prefix is a strided view


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


def make_functional_sets(z: Size, working_set: int, rng) -> InputSets:
    """Sets of the step's six arguments (`args`), its preallocated results (`outs`), and
    each array by name; `scale_f` is the scale as a float, for KVCache.step."""
    B, H, Dh, S = z.B, z.H, z.Dh, z.S
    per_set = 2 * (2 * B * H * Dh * S + 2 * B * H * Dh) * F32  # inputs and results, roughly
    sets = []

    def randn(*shape):  # aligned as kina.runtime allocates results: a decode loop passes those back in
        return rng.standard_normal(shape, dtype=np.float32, out=aligned_empty(shape))
    for _ in range(n_sets_for(per_set, working_set)):
        d = {"q": randn(B, H, 1, Dh), "k_past": randn(B, H, Dh, S), "k_new": randn(B, H, Dh, 1),
             "v_past": randn(B, H, S, Dh), "v_new": randn(B, H, 1, Dh),
             "scale": np.full((1, 1, 1, 1), 1 / math.sqrt(Dh), np.float32), "scale_f": 1 / math.sqrt(Dh),
             "k_next": aligned_empty((B, H, Dh, S + 1)), "v_next": aligned_empty((B, H, S + 1, Dh)),
             "context": aligned_empty((B, H, 1, Dh))}
        for k in ("k_next", "v_next", "context"):
            d[k].fill(0.0)  # fault the pages in before timing
        d["args"] = [d[k] for k in ("q", "k_past", "k_new", "v_past", "v_new", "scale")]
        d["outs"] = [d["k_next"], d["v_next"], d["context"]]
        sets.append(d)
    return InputSets(sets, per_set)


@dataclass
class InPlaceSets:
    """Per set: a [B,H,Dh,T] / [B,H,T,Dh] pair with S_past random positions, NaN after them,
    and the small inputs (q, k_new, v_new, scale) of a functional set."""

    k: list[np.ndarray]
    v: list[np.ndarray]
    small: list[dict]
    nbytes_each: int


def make_in_place_sets(z: Size, working_set: int, fsets: InputSets, rng) -> InPlaceSets:
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
    return InPlaceSets(ks, vs, [fsets.sets[i % len(fsets.sets)] for i in range(len(ks))], per_set)


def kina_one_off(fn, fsets: InputSets, threads: list[int]) -> list[Variant]:
    """The public call and call_into, each call on its own input set; and the kernel alone."""
    for d in fsets.sets:
        d["bound"], _ = bind(fn.signature, d["args"])

    def kernel(d):
        fn.call_unchecked(d["bound"], d["outs"], 1)
    out = [Variant("kina call_unchecked 1T", fsets, kernel, result=written(kernel))]
    for n in threads:
        def into(d, n=n):
            fn.call_into(d["args"], d["outs"], threads=n)

        def public(d, n=n):
            fn(*d["args"], threads=n)
        out += [Variant(f"kina call_into {n}T", fsets, into, threads=n, result=written(into)),
                Variant(f"kina fn() {n}T", fsets, public, ref=f"kina call_into {n}T", threads=n,
                        result=lambda d, n=n: fn(*d["args"], threads=n))]
    return out


def kina_host_loop(z: Size, fn, fsets: InputSets, threads: list[int]) -> list[Variant]:
    """The Section 19 host loop: one chain per input set, starting from its k_past, v_past."""
    S = z.S

    def chains(spare_results: bool) -> InputSets:
        out = []
        for d in fsets.sets:  # q, k_new, v_new, scale from the set; the caches start as its own
            c = {"small": d, "k": d["k_past"], "v": d["v_past"], "last": None}
            if spare_results:  # two result sets, written in turn: the inputs are always the other
                c["results"] = [[aligned_empty(a.shape) for a in d["outs"]] for _ in range(2)]
                for a in (*c["results"][0], *c["results"][1]):
                    a.fill(0.0)
            out.append(c)
        return InputSets(out, fsets.nbytes_each)

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
        for name, sets, run, ref in ((f"kina loop call_into {n}T", into_chains, into, "numpy"),
                                     (f"kina loop fn() {n}T", public_chains, public, f"kina loop call_into {n}T")):
            variants.append(Variant(name, sets, run, ref=ref, group="host loop", threads=n,
                                    result=lambda c, run=run: (run(c), c["last"])[1]))
    return variants


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
        variants.append(Variant(f"kina in place {n}T", InputSets(items, sets.nbytes_each), run,
                                prepare=lambda it: it["cache"].crop(S), ref="numpy in place", floor="in place",
                                group="in place", threads=n))
    return variants


def build_variants(z: Size, threads: list[int], working_set: int, fsets: InputSets, rng, mod, torch,
                   sessions: dict, notes: list[str]) -> list[Variant]:
    fn, x = mod.kv_step, peers.Scratch.of(z)
    variants = kina_one_off(fn, fsets, threads) + kina_host_loop(z, fn, fsets, threads)
    variants += peers.numpy_functional(fsets, x)
    if torch is not None:
        variants += peers.torch_functional(z, fsets, x, torch, threads)
    variants += peers.ort_functional(fsets, sessions, torch)
    in_place = make_in_place_sets(z, working_set, fsets, rng)
    variants += kina_in_place(z, in_place, threads, notes) + peers.numpy_in_place(z, in_place, x)
    return variants


def spot_check(z: Size, fsets: InputSets, variants: list[Variant], notes: list[str]) -> None:
    """One call of each functional variant on set 0 (a host loop: on the chain that starts from
    it) against the plain reference; every Kina variant must give the same bits as the first."""
    d = fsets.sets[0]
    k_ref, v_ref, c_ref = reference(*d["args"])
    first = None
    for v in variants:
        if v.result is None:
            continue
        if v.before:
            v.before()
        d["context"].fill(np.nan)
        k, vv, c = v.result(v.inputs.sets[0])
        if v.after:
            v.after()
        if not (np.array_equal(k, k_ref) and np.array_equal(vv, v_ref) and np.allclose(c, c_ref, rtol=1e-4, atol=1e-5)):
            notes.append(f"{z.label}: {v.name} disagrees with the NumPy reference")
        if v.name.startswith("kina"):
            if first is None:
                first = (v.name, *(np.array(a) for a in (k, vv, c)))  # copies: later variants overwrite
            elif not all(np.array_equal(a, b) for a, b in zip((k, vv, c), first[1:])):
                notes.append(f"{z.label}: {v.name}'s results differ from {first[0]}'s bits")


def run_size(z: Size, args, mod, torch, sessions: dict, bw: dict, notes: list[str]) -> dict:
    """Time every variant on one size (args: threads, working_set, skip, repeats); `bw` (a
    first estimate of one thread's bandwidth) only sizes the timing batches."""
    rng = np.random.default_rng(z.S * 1000 + z.H)
    fsets = make_functional_sets(z, args.working_set, rng)
    variants = [v for v in build_variants(z, args.threads, args.working_set, fsets, rng, mod, torch, sessions, notes)
                if v.name not in args.skip]
    spot_check(z, fsets, variants, notes)

    moved = bytes_moved(z.B, z.H, z.Dh, z.S)
    rough_floor = floor_seconds(*moved["in place"], bw["read"], bw["copy"])
    inner = max(1, min(32, round(0.5e-3 / rough_floor), min(len(v.inputs.sets) for v in variants) // 2))
    allocated, reused = runtime.RESULTS.allocated, runtime.RESULTS.reused
    try:
        run_rounds(variants, args.repeats, inner)
    finally:
        if torch is not None:
            torch.set_num_threads(1)
    allocator = {"allocated": runtime.RESULTS.allocated - allocated, "reused": runtime.RESULTS.reused - reused}

    used = {"functional": fsets, "in_place": next((v.inputs for v in variants if v.group == "in place"), None)}
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
        "H": z.H, "Dh": z.Dh, "B": z.B, "S_past": z.S, "cache_bytes": z.cache_bytes, "inner": inner,
        "sets": {k: len(s.sets) if s else 0 for k, s in used.items()},
        "working_set_bytes": {k: len(s.sets) * s.nbytes_each if s else 0 for k, s in used.items()},
        "bytes": {k: {"read": r, "written": w} for k, (r, w) in moved.items()},
        "allocator": allocator,
        "variants": rows,
    }


def measure_compile(repeats: int) -> dict:
    """Compile time, in-process through kina.driver.cache.build_so on STATIC_EXAMPLE: cold
    (KINA_NO_CACHE=1; the median of `repeats`, after one untimed build that pays the one-time
    imports, reported as "first") and warm (a cache hit in a fresh KINA_CACHE_DIR)."""
    from kina import knobs
    from kina.driver import cache as compile_cache
    src, name = STATIC_EXAMPLE.read_bytes(), str(STATIC_EXAMPLE.relative_to(ROOT))
    cache = tempfile.mkdtemp(prefix="kina-bench-cache-")

    def timed_build() -> float:
        t = time.perf_counter()
        so = compile_cache.build_so(src, name)
        dt = time.perf_counter() - t
        if knobs.get("KINA_NO_CACHE"):
            shutil.rmtree(so.parent, ignore_errors=True)
        return dt
    try:
        with knobs.scoped(KINA_NO_CACHE=1):
            first = timed_build()
            cold = [timed_build() for _ in range(repeats)]
        with knobs.scoped(KINA_NO_CACHE=None, KINA_CACHE_DIR=cache):
            populate = timed_build()
            warm = [timed_build() for _ in range(max(repeats, 5))]
            t = time.perf_counter()
            kina.compile_file(STATIC_EXAMPLE).close()
            warm_load = time.perf_counter() - t
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {"file": name, "first_s": first, "cold_s": cold, "cold_median_s": statistics.median(cold),
            "populate_s": populate, "warm_s": warm, "warm_median_s": statistics.median(warm),
            "warm_compile_file_and_load_s": warm_load}
