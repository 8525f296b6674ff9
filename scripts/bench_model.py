#!/usr/bin/env python3
"""A Llama end to end: Kina against transformers and llama.cpp, all on the same Hugging Face folder.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_model.py \\
        [--shape smollm|small|tiny] [--prompt 32] [--new 64] [--repeats 3] [--threads 1,2] \\
        [--json FILE] [--markdown] [--plot FILE.png [--add-json EARLIER.json ...]]
    .venv/bin/python scripts/bench_model.py --from-json REPORT.json --markdown   # measure nothing

One folder per shape (benchlib/engines.py, SHAPES): transformers' LlamaForCausalLM with
seeded random weights (gains perturbed), written with save_pretrained in F32 under
build/bench_model/ and reused while its stamp matches. Every engine loads that folder:

- Kina: kina.models.load(folder, dtype) in F32, F16 and BF16, and F32 activations
  against F16 or BF16 weights (weight_dtype: rows "F32+F16w" and "F32+BF16w", llama.cpp F16's
  and BF16's arrangement),
  the StoryLM whose every layer step is one compiled Kina call, at each of --threads
  threads; with --fma, also load_pretrained(..., fma=True) (rows "Kina+fma": one rounding
  per multiply-add).
- transformers: LlamaForCausalLM.from_pretrained(folder), eager attention, F32, its own
  KV cache, at each of --threads torch threads.
- llama.cpp (llama-cpp-python, the [llama] extra; skipped with a note when missing): F32,
  F16 and BF16 GGUF files written from the folder's tensors with the gguf package, at each of
  --threads threads; F32 KV cache, flash attention off, the prompt in one batch.

Shapes: smollm (the default) is SmolLM-135M's: d 576, 9 heads, 3 KV heads, 30 layers, FFN
1536, vocab 49152, tied embeddings; small is d 512, 8 heads, 4 layers, FFN 1408, vocab 4096
(untied, no GQA); tiny is for a quick check (the test runs it).

Every engine generates --new greedy tokens after the same --prompt random ids. The runs
are interleaved: one untimed run each, then --repeats rounds; the table shows medians of
the prefill, of the median decode step, and decode tokens/s (1 / that step). Checks, each
printed as PASS or FAIL: Kina F32's logits within 1e-4 of transformers' (relative to the
row's largest) at every step, llama.cpp F32's within 1e-3 at the first 8 steps, and every
engine's greedy tokens against transformers' (the first divergence is reported; F16, BF16,
F32+F16w and F32+BF16w rows are reported, not checked). The exit status is 0 whether or not they pass: this measures.

The floor: a decode step reads every weight once (bytes per token, F32 and F16: BF16's are
F16's), far more
than the last-level cache at smollm, so its time is at least bytes / read bandwidth; the
read bandwidth is measured in the same run on 1 and 2 threads (benchlib.bandwidth, before
and after the engines, best pass). "of floor" is the floor at the row's thread count over
its decode step: 100% would be reading the weights at the best bandwidth seen.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads
import numpy as np  # noqa: E402

import kina  # noqa: E402
from benchlib import engines, machine  # noqa: E402
from benchlib import report as rep  # noqa: E402
from benchlib.bandwidth import read_bandwidths  # noqa: E402
from benchlib.timing import interleaved, medians  # noqa: E402

REPORT_FORMAT = "kina-bench-model-1"
MB = 1e6
LLAMA_CPP_STEPS = 8  # llama.cpp F32's logits are checked at the first decode steps
TOL = {"Kina": 1e-4, "llama.cpp": 1e-3}
REFERENCE = "transformers F32 1T"


def markers(shape: str) -> tuple[str, str]:
    return (f"<!-- BEGIN bench_model --shape {shape} --markdown: generated, edit the script rather than this table -->",
            f"<!-- END bench_model --shape {shape} --markdown -->")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--shape", choices=list(engines.SHAPES), default="smollm")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens (default 32)")
    p.add_argument("--new", type=int, default=64, help="tokens generated (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each engine, interleaved (default 3)")
    p.add_argument("--threads", type=rep.positive_ints, default="1,2",
                   help="thread counts every engine runs at (default 1,2)")
    p.add_argument("--fma", action="store_true",
                   help="also run Kina with fused multiply-adds (load_pretrained(fma=True): rows 'Kina+fma')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bw-passes", type=int, default=4,
                   help="read-bandwidth passes on each thread count, before the runs and again after (default 4)")
    p.add_argument("--folder", help="the model folder (default build/bench_model/<shape>-seed<seed>)")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--markdown", action="store_true",
                   help="rewrite this shape's table between its BEGIN/END markers in --doc")
    p.add_argument("--doc", default=str(rep.DOC), help="default docs/performance.md")
    p.add_argument("--plot", metavar="FILE.png", help="draw decode tokens/s against model size and threads")
    p.add_argument("--add-json", action="append", default=[], metavar="REPORT",
                   help="with --plot: earlier reports (--json) to draw beside this run's")
    p.add_argument("--from-json", metavar="REPORT",
                   help="with --markdown or --plot: use this report (from --json), measure nothing")
    a = p.parse_args(argv)
    if a.from_json and not (a.markdown or a.plot):
        p.error("--from-json reads a report: give --markdown or --plot too")
    if a.new < 2 or a.prompt < 1 or a.repeats < 1 or a.bw_passes < 1:
        p.error("--new must be >= 2, --prompt, --repeats and --bw-passes >= 1")
    if a.plot:
        import plotting
        plotting.check_target(a.plot)
    a.folder = Path(a.folder) if a.folder else machine.ROOT / "build" / "bench_model" / f"{a.shape}-seed{a.seed}"
    return a


def quiet_transformers():
    import transformers
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def gguf_files(folder: Path) -> dict[str, Path]:
    """{"F32": path, "F16": path, "BF16": path}, written next to the folder's tensors unless newer than them."""
    out = {}
    for name, dt in (("F32", np.float32), ("F16", np.float16), ("BF16", kina.runtime.numpy_dtype("BF16"))):
        path = folder / f"model-{name.lower()}.gguf"
        if not path.is_file() or path.stat().st_mtime < (folder / "model.safetensors").stat().st_mtime:
            t = time.perf_counter()
            engines.write_gguf(folder, path.with_suffix(".tmp"), dt).rename(path)
            print(f"wrote {path} in {time.perf_counter() - t:.1f} s")
        out[name] = path
    return out


def make_engines(args, notes: list[str]) -> tuple[dict, dict]:
    """({row name: (run, dtype name, threads)}, versions)."""
    n_ctx = args.prompt + args.new
    rows, versions = {}, {}
    # (label, activations, weights, the dtype whose bytes a token reads: BF16 reads F16's): F32+F16w is F32
    # activations against F16 weight matrices (load_pretrained(weight_dtype=float16)), as llama.cpp's F16 runs
    bf16 = kina.runtime.numpy_dtype("BF16")
    kinds = [("F32", np.float32, None, "F32"), ("F16", np.float16, None, "F16"), ("BF16", bf16, None, "F16"),
             ("F32+F16w", np.float32, np.float16, "F16"), ("F32+BF16w", np.float32, bf16, "F16")]
    for engine, fma in [("Kina", False)] + [("Kina+fma", True)] * args.fma:
        for label, dt, wdt, floor_dt in kinds:
            t = time.perf_counter()
            k = engines.KinaEngine(args.folder, dt, n_ctx, fma=fma, weight_dtype=wdt)
            print(f"{engine} {label}: loaded and compiled (or a compile-cache hit) in {time.perf_counter() - t:.1f} s")
            for n in args.threads:
                rows[f"{engine} {label} {n}T"] = (lambda k=k, n=n: k.run(args.prompt_ids, args.new, n), floor_dt, n)
    tf = engines.TransformersEngine(args.folder)
    versions["transformers"], versions["torch"] = tf.version, tf.torch.__version__
    for n in args.threads:
        rows[f"transformers F32 {n}T"] = (lambda n=n: tf.run(args.prompt_ids, args.new, n), "F32", n)
    versions["llama_cpp"] = engines.llama_cpp_version()
    if versions["llama_cpp"] is None:
        notes.append("llama-cpp-python or gguf is not installed (the [llama] extra): the llama.cpp rows are skipped")
        return rows, versions
    import gguf
    versions["gguf"] = getattr(gguf, "__version__", None) or _dist_version("gguf")
    for dt, path in gguf_files(args.folder).items():
        e = engines.LlamaCppEngine(path, n_ctx)
        for n in args.threads:
            rows[f"llama.cpp {dt} {n}T"] = (lambda e=e, n=n: e.run(args.prompt_ids, args.new, n),
                                            "F16" if dt == "BF16" else dt, n)
    return rows, versions


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def keep_first_logits(name, run):
    """A run that keeps the logits of its first call only (the checks need one set; the
    timed rounds would otherwise hold --repeats copies of [new, vocab] per engine), and
    prints its time, so that a long run shows progress."""
    state = {"first": None}

    def wrapped():
        r = run()
        print(f"  {name}: {r['total']:.2f} s", flush=True)
        if state["first"] is None:
            state["first"] = r["logits"]
        r.pop("logits")
        return r
    wrapped.state = state
    return wrapped


def check_rows(rows: dict, firsts: dict) -> list[dict]:
    """Each engine's first run against transformers F32 on one thread: tokens, and logits."""
    want = firsts[REFERENCE]
    out = []
    for name, r in firsts.items():
        if name == REFERENCE:
            continue
        engine, dt = name.split()[0], rows[name][1]
        steps = LLAMA_CPP_STEPS if engine == "llama.cpp" else None
        c = engines.compare(r, want, steps)
        engine = engine.split("+")[0]  # Kina+fma is checked as Kina
        c.update(row=name, tol=TOL.get(engine) if dt == "F32" and engine in TOL else None)
        c["logits_pass"] = None if c["tol"] is None else c["rel_err"] <= c["tol"]
        c["tokens_pass"] = None if dt != "F32" else c["first_divergence"] is None
        out.append(c)
    return out


def fmt_tokens(c: dict, new: int) -> str:
    d = c["first_divergence"]
    return "all agree" if d is None else f"differ from step {d} of {new}"


def markdown_table(report: dict) -> str:
    bpt, floors = report["weight_bytes_per_token"], report["floor_s"]
    checks = {c["row"]: c for c in report["checks"]}
    P = report["args"]["prompt"]
    lines = [f"| engine | threads | prefill ({P} tokens) | decode, per token | tokens/s | floor | of floor | "
             f"tokens vs {REFERENCE} | logits vs it |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, m in report["rows"].items():
        c = checks.get(name)
        toks = "reference" if c is None else fmt_tokens(c, report["args"]["new"])
        err = "-" if c is None else f"{c['rel_err']:.1e}" + (f" ({c['steps_compared']} steps)" if c["steps_compared"] != report["args"]["new"] else "")
        floor = floors[m["dtype"]][str(m["threads"])]
        lines.append(f"| {name.rsplit(' ', 1)[0]} | {m['threads']} | {m['prefill'] * 1e3:.1f} ms | "
                     f"{m['decode'] * 1e3:.2f} ms | {1 / m['decode']:.0f} | {floor * 1e3:.2f} ms | "
                     f"{floor / m['decode']:.0%} | {toks} | {err} |")
    lines.append("")
    lines.append(f"Weights read per token: {bpt['F32'] / MB:.1f} MB in F32, {bpt['F16'] / MB:.1f} MB in F16. "
                 + "; ".join(f"{n} thread{'s' * (n != '1')}: read {bw / 1e9:.1f} GB/s, floor F32 "
                             f"{floors['F32'][n] * 1e3:.2f} ms, F16 {floors['F16'][n] * 1e3:.2f} ms"
                             for n, bw in report["read_bw"].items()) + ".")
    return "\n".join(lines)


def provenance(report: dict) -> str:
    m, v = report["machine"], report["versions"]
    peers = ", ".join(f"{k} {v[k]}" for k in ("torch", "transformers", "llama_cpp", "gguf") if v.get(k))
    return (f"From `{report['command']}` at commit {v['commit']}, {report['date']}, on {m['cores']} cores of "
            f"{m['cpu']} (load average {m['load_average_start_end'][0]:.2f} at the start, "
            f"{m['load_average_start_end'][1]:.2f} at the end; shared with other jobs); {report['shape_text']}; "
            f"{report['args']['new']} tokens after a {report['args']['prompt']}-token prompt, medians of "
            f"{report['args']['repeats']} interleaved rounds; {peers}.")


def plot(reports: list[dict], path) -> Path:
    """Decode tokens/s against the model's F32 weight bytes, one line per engine, dtype and thread count."""
    import plotting
    fig, ax = plotting.figure(560, layout="constrained")
    reports = sorted(reports, key=lambda r: r["weight_bytes_per_token"]["F32"])
    names = list(dict.fromkeys(n for r in reports for n in r["rows"]))
    colours = {"Kina": "tab:blue", "transformers": "tab:green", "llama.cpp": "tab:red"}
    for name in names:
        pts = [(r["weight_bytes_per_token"]["F32"] / MB, 1 / r["rows"][name]["decode"]) for r in reports if name in r["rows"]]
        engine, dt, threads = name.split()
        ax.plot(*zip(*pts), {"F32": "-", "F16": "--", "BF16": "-."}.get(dt, ":"), marker="o" if threads == "1T" else "^",
                color="tab:purple" if engine == "Kina+fma" else colours.get(engine),
                alpha=1.0 if threads == "1T" else 0.6, label=name)
    for n in dict.fromkeys(k for r in reports for k in r["read_bw"]):
        for dt in ("F32", "F16"):
            pts = [(r["weight_bytes_per_token"]["F32"] / MB, 1 / r["floor_s"][dt][n]) for r in reports if n in r["read_bw"]]
            ax.plot(*zip(*pts), "-" if dt == "F32" else "--", color="black", alpha=0.25, lw=3 if n == "1" else 1.5,
                    label=f"floor {dt} {n}T")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plotting.plain_log_ticks(ax.yaxis)
    plotting.plain_log_ticks(ax.xaxis)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_xlabel("F32 weights read per token, MB (shapes: " + ", ".join(r["args"]["shape"] for r in reports) + ")")
    ax.set_ylabel("decode tokens/s (1 / median step)")
    ax.set_title(f"Same HF folder in every engine: {plotting.machine()}, shared (noisy); nT = n threads\n"
                 f"floor = weight bytes per token at the best read bandwidth seen on n threads in the same run")
    ax.legend(fontsize=7, ncol=3)
    return plotting.save(fig, path)


def load_report(path: str) -> dict:
    return rep.load_report(path, REPORT_FORMAT)


def publish(report: dict, args) -> None:
    """--markdown and --plot, from a report just measured or read back."""
    if args.markdown:
        block = f"{provenance(report)}\n\n{markdown_table(report)}" + "".join(f"\n- {n}" for n in report["notes"])
        shape = report["args"]["shape"]
        print(f"wrote the table into {rep.update_doc(args.doc, block, *markers(shape))}")
    if args.plot:
        print(f"wrote {plot([report, *map(load_report, args.add_json)], args.plot)}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        publish(load_report(args.from_json), args)
        return 0
    notes: list[str] = []
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if os.environ.get(var):
            notes.append(f"{var} is set (benchmarks unset it: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)")
    load_start, commit = os.getloadavg()[0], machine.git_commit()
    quiet_transformers()
    print(f"bench_model --shape {args.shape}: {engines.describe(args.shape)}; {args.new} tokens after a "
          f"{args.prompt}-token prompt\n{machine.describe()}, kina {kina.__version__}; load average {load_start:.2f}",
          flush=True)
    t = time.perf_counter()
    folder, built = engines.build_folder(args.shape, args.seed, args.folder)
    print(f"{'built' if built else 'reused'} {folder} ({time.perf_counter() - t:.1f} s)")
    args.prompt_ids = [int(x) for x in np.random.default_rng(args.seed).integers(3, engines.SHAPES[args.shape]["vocab_size"], args.prompt)]

    made, versions = make_engines(args, notes)
    runs_in = {name: keep_first_logits(name, run) for name, (run, _, _) in made.items()}
    threads = sorted({1, *args.threads})
    samples = [read_bandwidths(args.bw_passes, threads)]
    runs = interleaved(runs_in, args.repeats)
    samples.append(read_bandwidths(args.bw_passes, threads))
    read_bw = {str(n): max(s[n] for s in samples) for n in threads}

    bpt = {"F32": engines.weight_bytes(folder, 4), "F16": engines.weight_bytes(folder, 2)}
    floor_s = {dt: {n: b / bw for n, bw in read_bw.items()} for dt, b in bpt.items()}
    rows = {}
    for name, rs in runs.items():
        _, dt, n = made[name]
        rows[name] = {**medians(rs), "dtype": dt, "threads": n, "tokens": rs[0]["tokens"],
                      "same_tokens_every_round": all(r["tokens"] == rs[0]["tokens"] for r in rs)}
    firsts = {name: {"tokens": rows[name]["tokens"], "logits": runs_in[name].state["first"]} for name in rows}
    checks = check_rows(made, firsts)
    report = {
        "format": REPORT_FORMAT, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", os.path.relpath(__file__, machine.ROOT), *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpu": machine.cpu_model(), "cores": os.cpu_count(),
                    "load_average_start_end": [load_start, os.getloadavg()[0]]},
        "versions": {"kina": kina.__version__, "commit": commit, "numpy": np.__version__,
                     "python": platform.python_version(), **versions},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                 if k not in ("add_json",)},
        "shape": engines.SHAPES[args.shape], "shape_text": engines.describe(args.shape),
        "weight_bytes_per_token": bpt, "read_bw": read_bw, "read_bw_samples": [{str(n): v for n, v in s.items()} for s in samples],
        "floor_s": floor_s, "rows": rows, "checks": checks, "notes": notes,
    }
    print()
    print(markdown_table(report))
    print()
    for c in checks:
        if c["tokens_pass"] is not None:
            print(f"{'PASS' if c['tokens_pass'] else 'FAIL'}  tokens: {c['row']} vs {REFERENCE}: "
                  f"{fmt_tokens(c, args.new)}")
        if c["logits_pass"] is not None:
            print(f"{'PASS' if c['logits_pass'] else 'FAIL'}  logits: {c['row']} vs {REFERENCE}: {c['rel_err']:.2e} "
                  f"over {c['steps_compared']} steps (limit {c['tol']:g})")
    llc = machine.llc_bytes()
    if bpt["F32"] < llc:
        notes.append(f"the F32 weights ({bpt['F32'] / MB:.0f} MB) fit in the last-level cache this machine reports "
                     f"({llc / MB:.0f} MB): a step may read them from the cache, faster than the floor's "
                     f"256 MiB probe, so the floor bounds nothing here")
    for name, r in firsts.items():
        if not np.abs(r["logits"]).max() > 0:
            notes.append(f"{name}: every logit of the first step is 0 (overflow to inf inside the model?)")
    for name, m in rows.items():
        if not m["same_tokens_every_round"]:
            notes.append(f"{name} gave different tokens in different rounds")
    notes.append(f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    for n in notes:
        print(f"note: {n}")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")
    publish(report, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
