#!/usr/bin/env python3
"""A StoryLM decode step on 1, 2, ... threads (the threads pass), side by side.

    PYTHONPATH=src .venv/bin/python scripts/bench_threads.py [--shape smollm|small] [--threads 1,2]
        [--tokens 32] [--prompt 16] [--repeats 5]

Shapes: "smollm" is SmolLM-135M's (d 576, 9 heads, 3 KV heads, 30 layers, FFN 1536,
vocab 49152), "small" d 512, 8 heads, 4 layers, FFN 1408, vocab 4096; random F32
weights. Each repeat prefills --prompt tokens, then times --tokens decode steps
(`StoryLM.step`: every layer's decoder_step and the head, each one threaded call) at
each thread count in turn, so the variants interleave; the table shows the median
ms/token over all timed steps of all repeats, and checks that every thread count
gave the same logits bit for bit.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from kina.models import StoryLM

SHAPES = {
    "smollm": dict(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, n_layers=30, ffn_dim=1536),
    "small": dict(vocab_size=4096, d_model=512, n_heads=8, n_layers=4, ffn_dim=1408),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=SHAPES, default="smollm")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    model = StoryLM(**SHAPES[args.shape], max_seq_len=args.prompt + args.tokens + 1, threads=1)
    prompt = list(range(1, args.prompt + 1))
    times = {t: [] for t in counts}
    for _ in range(args.repeats):
        logits = {}
        for t in counts:
            model.threads = t
            cache = model.new_cache()
            out = model.prefill(prompt, cache)
            seen = []
            for _ in range(args.tokens):
                token = int(np.argmax(out))
                start = time.perf_counter()
                out = model.step(token, cache)
                times[t].append(time.perf_counter() - start)
                seen.append(out)
            logits[t] = np.stack(seen)
        same = all(np.array_equal(logits[counts[0]], logits[t]) for t in counts)
        assert same, "thread counts disagree"
    base = statistics.median(times[counts[0]])
    print(f"{args.shape}: {SHAPES[args.shape]}, {args.tokens} tokens after {args.prompt}, {args.repeats} repeats")
    print(f"{'threads':>7}  {'ms/token':>9}  {'speed-up':>8}")
    for t in counts:
        med = statistics.median(times[t])
        print(f"{t:>7}  {1e3 * med:>9.2f}  {base / med:>7.2f}x")
    print("logits bit-identical across thread counts: yes")


if __name__ == "__main__":
    main()
