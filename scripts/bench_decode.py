#!/usr/bin/env python3
"""Per-step time of cached decode vs full recompute as the sequence grows.

    python scripts/bench_decode.py [--tokens 1000] [--layers 1] [--heads 2] [--d-model 32] [--vocab 128]
                                   [--plot FILE.png]

Generates `--tokens` tokens from a one-token prompt twice with the same
kina.models.TinyDecoder: once with the KV cache (one in-place step per token,
attention over the n cached positions: O(n) per step) and once recomputing full
causal attention over all n positions at every step (O(n^2) per step). Prints
the best-of-`--repeats` step time at several n for both (a step at n: n-1
positions cached, crop() back after each repeat), least-squares fits
(cached: a + b*n; recompute: a + b*n + c*n^2), checks that both produced the
same tokens, and the ratio of the total times. `--plot FILE.png` also draws the
step times against n, time on a log scale (needs matplotlib, in the [bench] extra).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchlib.timing import best
from kina.models import TinyDecoder


def plot(path, points, cached, recompute, setup: str, repeats: int):
    """Draw the two step-time curves (seconds per step at each n in `points`) into `path`."""
    import plotting  # next to this script; only --plot needs it (and matplotlib)
    fig, ax = plotting.figure(540, layout="constrained")
    cached_ms, recompute_ms = [t * 1e3 for t in cached], [t * 1e3 for t in recompute]
    ax.plot(points, cached_ms, "o-", color="tab:blue", label="KV cache: one in-place step, O(n)")
    ax.plot(points, recompute_ms, "s-", color="tab:orange", label="full recompute: causal attention over n, O(n²)")
    ax.set_yscale("log")  # n is evenly spaced, so a linear n axis; the times span decades
    plotting.plain_log_ticks(ax.yaxis)
    n, lo, hi = points[-1], cached_ms[-1], recompute_ms[-1]
    ax.annotate("", (n, hi), (n, lo), arrowprops={"arrowstyle": "<->", "color": "0.4", "shrinkA": 6, "shrinkB": 6})
    ax.annotate(f"{hi / lo:.0f}× at n = {n}", (n, (lo * hi) ** 0.5), xytext=(-6, 0), textcoords="offset points",
                ha="right", va="center")
    ax.set_xlim(0, points[-1] * 1.02)
    ax.set_xlabel("n, positions attended by the step (n − 1 cached + the new token)")
    ax.set_ylabel("time per generated token, ms (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title(f"Decode step time vs sequence length, cached vs recomputed (best of {repeats} cached, "
                 f"{max(1, repeats // 3)} recomputed)\n{setup}; {plotting.machine()}, shared machine")
    return plotting.save(fig, path)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=9, help="timed calls per point; the fastest counts (default 9)")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the step times against n into this file")
    args = p.parse_args(argv)
    if args.tokens < 20 or args.repeats < 1:
        p.error("--tokens must be at least 20 to show a curve, and --repeats at least 1")
    if args.plot:
        import plotting
        plotting.check_target(args.plot)  # before the run, not after it

    model = TinyDecoder(args.vocab, args.d_model, args.heads, args.layers, max_seq_len=args.tokens, seed=args.seed)
    prompt = [args.seed % args.vocab]
    model.trace(prompt, 2)  # compile (or load) the kernels outside the timings
    model.trace(prompt, 2, use_cache=False)
    print(f"TinyDecoder vocab={args.vocab} d_model={args.d_model} heads={args.heads} layers={args.layers}; "
          f"{args.tokens} tokens from a 1-token prompt")

    runs = {}
    for name, use_cache in (("cached", True), ("recompute", False)):
        sys.stderr.write(f"{name}: generating {args.tokens} tokens...\n")
        t0 = time.perf_counter()
        run = model.trace(prompt, args.tokens, use_cache=use_cache)
        runs[name] = (run, time.perf_counter() - t0)

    # The step curves, timed apart from the runs above: min of `--repeats` per point is robust to load.
    seq = prompt + runs["cached"][0].tokens
    points = sorted({2, *np.linspace(0, args.tokens, 11).astype(int)[1:]})
    cached, recompute = [], []
    for n in points:  # a step that attends over n positions: n-1 cached, then the n-th token
        caches = model.new_cache()
        model.prefill(seq[:n - 1], caches)
        cached.append(best(lambda: model.step(seq[n - 1], caches), args.repeats,
                           after=lambda: [c.crop(n - 1) for c in caches]))
        recompute.append(best(lambda: model.recompute(seq[:n]), max(1, args.repeats // 3)))
    print(f"\n{'n (positions attended)':>24}{'cached ms/step':>16}{'recompute ms/step':>20}{'ratio':>9}")
    for n, c, r in zip(points, cached, recompute):
        print(f"{n:>24}{c * 1e3:>16.4f}{r * 1e3:>20.4f}{r / c:>9.1f}")

    n = np.array(points, dtype=np.float64)
    lin = np.linalg.lstsq(np.stack([np.ones_like(n), n], 1), np.array(cached), rcond=None)[0]
    quad = np.linalg.lstsq(np.stack([np.ones_like(n), n, n * n], 1), np.array(recompute), rcond=None)[0]
    print(f"\nfits: cached    ~ {lin[0] * 1e6:.1f} us + {lin[1] * 1e9:.2f} ns * n")
    print(f"      recompute ~ {quad[0] * 1e6:.1f} us + {quad[1] * 1e9:.2f} ns * n + {quad[2] * 1e9:.4f} ns * n^2")
    half = points.index(points[len(points) // 2])
    print(f"doubling n from {points[half]} to {points[-1]} multiplies the step time by "
          f"{cached[-1] / cached[half]:.2f} (cached) and {recompute[-1] / recompute[half]:.2f} (recompute)")
    same = runs["cached"][0].tokens == runs["recompute"][0].tokens
    print(f"\nsame tokens from both: {'yes' if same else 'NO'}")
    tc, tr = runs["cached"][1], runs["recompute"][1]
    print(f"total for {args.tokens} tokens: cached {tc:.3f} s, recompute {tr:.3f} s, ratio {tr / tc:.1f}x")
    if args.plot:
        setup = (f"TinyDecoder d_model={args.d_model}, {args.heads} heads, {args.layers} layer"
                 f"{'s' if args.layers != 1 else ''}, F32")
        print(f"wrote {plot(args.plot, points, cached, recompute, setup, args.repeats)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
