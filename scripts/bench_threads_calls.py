#!/usr/bin/env python3
"""One StoryLM layer step and the head, each a prepared call on 1 and on N threads, interleaved.

    PYTHONPATH=src .venv/bin/python scripts/bench_threads_calls.py [--shape smollm|small] [--threads 2]
        [--samples 300] [--S 64]

The same two prepared calls (decoder_step of layer 0 at cache length S, and the head)
are timed alternately on 1 thread (the plain entry) and on N (the threaded entry, the
module's team), many times; the table shows the minimum, the 25th percentile and the
median of each. On a machine shared with other processes the minimum is the figure
least disturbed by them: it is what a call costs when every thread it uses is running.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from kina.models import StoryLM

from bench_threads import SHAPES


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=SHAPES, default="smollm")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--S", type=int, default=64)
    args = p.parse_args()
    model = StoryLM(**{**SHAPES[args.shape], "n_layers": 1}, max_seq_len=args.S + 2, threads=1)
    cache = model.new_cache()
    model.prefill(list(range(1, args.S + 1)), cache)
    steps, x, cos, sin, logits = cache._calls or model._prepare_calls(cache)
    step = steps[cache._cur][0]
    step.set_dim("S", args.S)
    x[...] = model._embed[1]
    calls = {"decoder_step": step, "logits": logits}
    times = {(name, t): [] for name in calls for t in (1, args.threads)}
    for _ in range(args.samples):
        for name, call in calls.items():
            for t in (1, args.threads):
                call.threads = t
                start = time.perf_counter()
                call()
                times[name, t].append(time.perf_counter() - start)
    print(f"{args.shape}, S = {args.S}, {args.samples} samples each, interleaved")
    print(f"{'call':<13} {'threads':>7} {'min ms':>8} {'p25 ms':>8} {'median ms':>10}  speed-up (min, p25, median)")
    for name in calls:
        base = [np.percentile(times[name, 1], q) for q in (0, 25, 50)]
        for t in (1, args.threads):
            got = [np.percentile(times[name, t], q) for q in (0, 25, 50)]
            ups = ", ".join(f"{b / g:.2f}x" for b, g in zip(base, got))
            print(f"{name:<13} {t:>7} {1e3 * got[0]:>8.3f} {1e3 * got[1]:>8.3f} {1e3 * got[2]:>10.3f}  {ups}")


if __name__ == "__main__":
    main()
