#!/usr/bin/env python3
"""Benchmark the Section 19 decode step (issues 6 and 11): Kina against NumPy, PyTorch and onnxruntime, and the bandwidth floor.

Run it (from the repo root; the `env -u` matters, see below):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_kv_step.py
    ... scripts/bench_kv_step.py --quick
    ... scripts/bench_kv_step.py --shapes 32x128 --s-past 2047,8191 --repeats 21 --json build/b.json
    ... scripts/bench_kv_step.py --repeats 9 --plot docs/bench_kv_step.png --markdown
    .venv/bin/python scripts/bench_kv_step.py --markdown --from-json build/bench_kv_step.json

Some machines here set OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE, which force an older, slower
OpenBLAS kernel under NumPy; unset both together, for this command only (never in tests or
CI). The run records which OpenBLAS core NumPy ended up with, and warns if either is set.
The full run takes about two minutes and needs about 6 GiB of memory; `--quick` about 40 s.

In:  the sizes (--shapes HxDh, --s-past), thread counts (--threads, to which
     kina.runtime.default_threads() is always added), --repeats; or --from-json REPORT.
Out: a table per size on stdout, the targets as PASS/FAIL, notes, and the JSON report
     (--json, default build/bench_kv_step.json: every figure, the samples and the checks).
     --markdown prints the performance table and rewrites it between the markers in
     docs/performance.md (--doc FILE for another file); --plot FILE.png draws it.
The exit status is 0 whether or not the targets pass: this measures, it does not gate.
NumPy's OpenBLAS and torch run on one thread except in the rows that say otherwise.

The parts, in scripts/benchlib/: kvstep.py (the variants Kina runs, their inputs and the spot
checks), peers.py (NumPy, PyTorch, onnxruntime), timing.py (interleaved rounds on rotated
inputs), bandwidth.py and floor.py (the floor model), report.py (the targets, the JSON,
--markdown, --plot). docs/performance.md has the latest figures and what they mean.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

import kina
import plotting
from benchlib import peers
from benchlib import report as rep
from benchlib.bandwidth import COPY_KERNEL, BandwidthKernels, add_samples, bandwidth
from benchlib.floor import add_floors, fit_floors
from benchlib.kvstep import DYN_EXAMPLE, Size, measure_compile, run_size
from benchlib.machine import MIB, ROOT, cpu_model, git_commit, llc_bytes, openblas
from benchlib.timing import fresh_compiles
from kina import runtime

DEFAULT_SHAPES, DEFAULT_S_PAST = "32x128,8x64", "127,511,2047,8191"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                epilog="See scripts/benchlib/floor.py for the floor model.")
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated HxDh (default: {DEFAULT_SHAPES})")
    p.add_argument("--s-past", default=DEFAULT_S_PAST, help="comma-separated S_past values")
    p.add_argument("--threads", type=rep.positive_ints, default="1,2",
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
    p.add_argument("--markdown", action="store_true",
                   help="also print the performance table (medians) and rewrite it in --doc")
    p.add_argument("--doc", default=str(rep.DOC), help="the file whose marked table --markdown rewrites "
                                                       "(default docs/performance.md)")
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


def plot(report: dict, path) -> Path:
    return rep.plot(report, path, defaults={"shapes": DEFAULT_SHAPES, "s_past": DEFAULT_S_PAST})


def publish(report: dict, args) -> None:
    """--markdown and --plot, from a report just measured or read back."""
    if args.markdown:
        print(rep.markdown_table(report))
        print(f"wrote the table into {rep.update_doc(args.doc, rep.markdown_block(report))}")
    if args.plot:
        print(f"wrote {plot(report, args.plot)}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        publish(rep.load_report(args.from_json), args)
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
    torch = peers.import_torch(notes)
    sessions, ort_version = peers.ort_sessions(args.threads, notes)
    commit = git_commit()  # now: others may commit while this runs

    print(f"kv_step benchmark: {cpu_model()}, {os.cpu_count()} cores, LLC {llc_bytes() / MIB:.0f} MiB; "
          f"numpy {np.__version__} (OpenBLAS {corename}, 1 thread)"
          + (f", torch {torch.__version__}" if torch else "") + (f", onnxruntime {ort_version}" if ort_version else "")
          + f"; kina {kina.__version__} @ {commit}, default threads {args.default_threads}; "
          f"threads {','.join(map(str, args.threads))}; load average {os.getloadavg()[0]:.2f}")
    compile_t = None if args.no_compile_time else measure_compile(args.compile_repeats)
    if compile_t:
        rep.print_compile(compile_t)

    with fresh_compiles():
        mod = kina.compile_file(DYN_EXAMPLE)
        copy_kernel = kina.compile_source(COPY_KERNEL, "<benchlib.bandwidth COPY_KERNEL>").copy

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
    rep.print_bandwidth(bw, len(bw_samples[str(args.threads[0])]["copy"]["np.copyto"]))
    for r in results:
        add_floors(r, bw)
        rep.print_size(r)

    results_checks = rep.checks(results, compile_t, bw, args.default_threads)
    rep.print_checks(results_checks)
    notes.append(f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
                 f"(the machine is shared: a busy neighbour slows some samples, most of all multi-threaded ones)")
    for n in notes:
        print(f"note: {n}")

    report = rep.make_report(
        machine={"cpu": cpu_model(), "cores": os.cpu_count(), "llc_bytes": llc_bytes(),
                 "load_average_start_end": [load_start, os.getloadavg()[0]], "openblas_core": corename,
                 "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "KINA_NUM_THREADS")}},
        versions={"kina": kina.__version__, "commit": commit, "numpy": np.__version__,
                  "torch": torch.__version__ if torch else None, "onnxruntime": ort_version},
        args=vars(args), bw=bw, measured=measured, bw_samples=bw_samples, compile_t=compile_t,
        results=results, results_checks=results_checks, notes=notes)
    print(f"wrote {rep.write_report(report, args.json)}")
    publish(report, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
