#!/usr/bin/env python3
"""Pass-option variants against each other, in one process, in interleaved rounds.

    .venv/bin/python scripts/ab_passes.py model --shape smollm --dtype f16 --threads 2 \\
        default= 'parts4=threads{parts=4}'
    .venv/bin/python scripts/ab_passes.py row --k 576 --n 1536 --weights f16 \\
        default= 'no-prefetch=matmul-loops{prefetch-bytes=0}'

Each VARIANT is NAME=PASS_OPTIONS, the text `kinac --pass-options` takes (empty: the
default build). What is timed:

  model  A StoryLM with seeded random weights at a bench_model shape (benchlib.engines:
         smollm, small, tiny), F32, F16 or F32 activations against F16 weights
         (--dtype f32, f16, f32+f16w), with --fma, built once per variant
         (StoryLM(..., pass_options=...)) on --threads threads. A round runs greedy
         generation once per variant, in an order rotated by one each round: --mode
         decode times the median step of --new steps after a --prompt-token prompt,
         --mode prefill the prompt alone.
  row    One decode row x[1, K] @ W[K, N] (x F32, W of --weights: F32, F16 or a block
         format's seeded random blocks, in the layout the build reads), built once per
         variant, called on one thread and on --threads, over copies of W that cover
         --working-set-mib so that each call reads W from memory (benchlib.timing's
         rotated input sets and interleaved rounds).

Prints the median of --rounds rounds per variant (ms a step, or us a call), its ratio to the first variant's, and
whether its results are the first variant's bit for bit (an option may change the order
of the sums: then they are not, and the largest relative difference is shown). The
machine is shared and noisy: compare figures of one run only, never across runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from kina import dtypes

from benchlib import engines
from benchlib.timing import InputSets, Variant, copies, run_rounds

BLOCK_FORMATS = [d.name for d in dtypes.DTYPES.values() if d.blocked]
DTYPES = {"f32": (np.float32, None), "f16": (np.float16, None), "f32+f16w": (np.float32, np.float16)}


def variant(text: str) -> tuple[str, str]:
    name, eq, options = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=PASS_OPTIONS (the options may be empty), got {text!r}")
    return name, options


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["model", "row"])
    p.add_argument("variants", nargs="+", type=variant, metavar="NAME=PASS_OPTIONS")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shape", choices=sorted(engines.SHAPES), default="smollm")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f16")
    p.add_argument("--fma", action="store_true", help="every variant's matmuls round each multiply-add once")
    p.add_argument("--mode", choices=["decode", "prefill"], default="decode")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--k", type=int, default=576)
    p.add_argument("--n", type=int, default=1536)
    p.add_argument("--weights", choices=["f32", "f16", *(d.lower() for d in BLOCK_FORMATS)], default="f16")
    p.add_argument("--working-set-mib", type=int, default=512)
    args = p.parse_args(argv)
    for name in ("rounds", "threads", "prompt", "new", "k", "n", "working_set_mib"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    names = [n for n, _ in args.variants]
    if len(set(names)) != len(names):
        p.error(f"variant names must differ, got {', '.join(names)}")
    from kina.driver.pipeline import Options
    for name, options in args.variants:
        try:
            Options(pass_options=options)
        except ValueError as e:
            p.error(f"variant {name}: {e}")
    return args


def storylm_kwargs(shape: str) -> dict:
    """StoryLM's sizes for a benchlib.engines shape (its LlamaConfig fields)."""
    c = engines.SHAPES[shape]
    return dict(vocab_size=c["vocab_size"], d_model=c["hidden_size"], n_heads=c["num_attention_heads"],
                n_kv_heads=c["num_key_value_heads"], n_layers=c["num_hidden_layers"], ffn_dim=c["intermediate_size"],
                tie_embeddings=c["tie_word_embeddings"])


def time_models(args) -> tuple[dict, dict]:
    """({(name, ""): [ms of each round]}, {name: logits of its last round})."""
    from kina.models import StoryLM
    dtype, weight_dtype = DTYPES[args.dtype]
    models = {name: StoryLM(**storylm_kwargs(args.shape), max_seq_len=args.prompt + args.new, dtype=dtype,
                            weight_dtype=weight_dtype, fma=args.fma, threads=args.threads, pass_options=options)
              for name, options in args.variants}
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, models[args.variants[0][0]].vocab_size,
                                                                args.prompt)]
    new = 1 if args.mode == "prefill" else args.new
    times, logits = {(name, ""): [] for name in models}, {}
    names = list(models)
    for name in names:  # untimed: pages, thread pools
        models[name].trace(prompt, min(new, 2))
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            g = models[name].trace(prompt, new)
            seconds = g.step_seconds[:1] if args.mode == "prefill" else g.step_seconds[1:]
            times[name, ""].append(1e3 * statistics.median(seconds))
            logits[name] = g.logits
    return times, logits


def time_rows(args) -> tuple[dict, dict]:
    """({(name, "nT"): [us of each round]}, {name: its result on the first set})."""
    import kina
    from kina.driver.pipeline import Options
    from kina.runtime import empty
    from kina.runtime.quant import random_blocks, storage
    K, N, kind = args.k, args.n, args.weights.upper()
    src = f"""let f = fn(x: tensor<F32, [1, 1, {K}], @host>, w: tensor<{kind}, [{K}, {N}], @host>)
                  -> (tensor<F32, [1, 1, {N}], @host>) {{ (x @ w) }}"""
    try:
        fns = {name: kina.compile_source(src, "<ab_passes>", Options(pass_options=options)).f
               for name, options in args.variants}
    except kina.KinaError as e:  # a block format whose block does not divide --k
        print(f"ab_passes.py: error: --k {K}, --weights {args.weights}: {e.message}", file=sys.stderr)
        sys.exit(2)
    rng = np.random.default_rng(K * N)
    x = rng.standard_normal((1, 1, K)).astype(np.float32)
    if kind in BLOCK_FORMATS:  # seeded random blocks, copied in the layout each variant's build reads
        w0 = random_blocks(kind, (K, N), rng)
        layouts = {name: dict(f.signature.layouts).get("w") for name, f in fns.items()}
    else:
        w0 = (rng.standard_normal((K, N)) * K ** -0.5).astype({"F32": np.float32, "F16": np.float16}[kind])
        layouts = {name: None for name in fns}
    stored = {layout: w0 if kind not in BLOCK_FORMATS else storage(w0, layout) for layout in set(layouts.values())}
    sets = {layout: InputSets([(x, w, empty((1, 1, N), np.float32)) for w in copies(a, args.working_set_mib << 20)],
                              a.nbytes) for layout, a in stored.items()}
    results, variants = {}, {}
    for name, f in fns.items():
        results[name] = f(x, w0)[0]
        for t in sorted({1, args.threads}):
            variants[name, f"{t}T"] = Variant(f"{name}, {t}T", sets[layouts[name]], threads=t,
                                              run=lambda s, f=f, t=t: f.call_unchecked([s[0], s[1]], [s[2]], t))
    run_rounds(list(variants.values()), args.rounds, max(2, min(len(s.sets) for s in sets.values()) // 2))
    return {key: [1e6 * s for s in v.samples] for key, v in variants.items()}, results


def same_bits(got: np.ndarray, want: np.ndarray) -> str:
    if np.array_equal(got, want):
        return "same bits"
    g, w = got.astype(np.float64), want.astype(np.float64)
    return f"differ: {np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-300):.1e} of the largest"


def main(argv=None) -> int:
    args = parse_args(argv)
    options = dict(args.variants)
    if args.what == "model":
        what = (f"StoryLM {args.shape} ({engines.describe(args.shape)}), {args.dtype}{', fma' if args.fma else ''}, "
                f"{args.threads} threads, {args.mode}: "
                + (f"{args.prompt}-token prompt" if args.mode == "prefill" else
                   f"median step of {args.new} after a {args.prompt}-token prompt"))
        times, results, unit = *time_models(args), "ms"
    else:
        what = f"x[1, {args.k}] @ W[{args.k}, {args.n}], W {args.weights}, over {args.working_set_mib} MiB of copies of W"
        times, results, unit = *time_rows(args), "us"
    print(f"{what}; medians of {args.rounds} interleaved rounds")
    first = next(iter(results))
    base = {}  # the first variant's median, per thread count
    rows = {key: ", ".join(filter(None, key)) for key in times}
    width = max(map(len, rows.values()))
    for (name, threads), ms in times.items():
        row, median = rows[name, threads], statistics.median(ms)
        base.setdefault(threads, median)
        shown = ", ".join(f"{m:.4g}" for m in ms)
        print(f"{row:<{width}}  {median:>9.4g} {unit}  {median / base[threads]:6.3f}x  "
              f"{same_bits(results[name], results[first])}  [{options[name] or 'the default build'}]  ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
