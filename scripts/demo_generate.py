#!/usr/bin/env python3
"""Generate tokens greedily with kina.models.TinyDecoder and show per-step timing.

    python scripts/demo_generate.py [--tokens 1000] [--prompt 16] [--layers 2] [--heads 4] [--d-model 64]
                                    [--vocab 256] [--seed 0] [--no-cache]

The prompt is `--prompt` seeded random token ids. With the cache (the default)
the prompt goes through one prefill and every new token through one in-place
KV-cache step; `--no-cache` recomputes full causal attention at every step.
A tqdm progress bar with the latest step's time and token goes to stderr (only
when stderr is a terminal, so piped or logged runs stay clean); the summary
(time per step at a few points, total, tokens/s, the first generated ids, cache
bytes) goes to stdout.
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager

import numpy as np
from tqdm import tqdm

from kina.models import TinyDecoder


@contextmanager
def progress(total: int, stream=None):
    """An on_step callback for TinyDecoder.trace that advances a tqdm bar on `stream` (stderr),
    showing the latest step's time and token; the bar is closed on leaving the block.
    disable=None is tqdm's "only on a terminal": piped or captured, nothing is written."""
    bar = tqdm(total=total, file=stream or sys.stderr, unit="tok", disable=None)

    def on_step(i: int, token: int, seconds: float) -> None:
        if not bar.disable:
            # refresh=False: tqdm redraws at most every mininterval (0.1 s), not once per step
            bar.set_postfix_str(f"step {seconds * 1e3:7.3f} ms, token {token:5d}", refresh=False)
            bar.update()
    try:
        yield on_step
    finally:
        bar.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1000, help="tokens to generate (default 1000)")
    p.add_argument("--prompt", type=int, default=16, help="prompt length (default 16)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cache", action="store_true", help="recompute full causal attention at every step")
    args = p.parse_args(argv)
    if args.tokens < 1 or args.prompt < 1:
        p.error("--tokens and --prompt must be at least 1")

    model = TinyDecoder(args.vocab, args.d_model, args.heads, args.layers,
                        max_seq_len=args.prompt + args.tokens, seed=args.seed)
    prompt = np.random.default_rng(args.seed).integers(0, args.vocab, args.prompt).tolist()
    mode = "full recompute" if args.no_cache else "KV cache"
    print(f"TinyDecoder vocab={args.vocab} d_model={args.d_model} heads={args.heads} layers={args.layers}, "
          f"prompt {args.prompt} tokens, generating {args.tokens} ({mode})")
    t0 = time.perf_counter()
    model.trace(prompt, 1, use_cache=not args.no_cache)  # compiles (or loads) the Kina kernels
    print(f"kernels ready in {time.perf_counter() - t0:.2f} s")

    with progress(args.tokens) as on_step:
        t0 = time.perf_counter()
        run = model.trace(prompt, args.tokens, use_cache=not args.no_cache, on_step=on_step)
        total = time.perf_counter() - t0
    steps = np.array(run.step_seconds)
    print(f"first step (prefill of {args.prompt} tokens): {steps[0] * 1e3:.3f} ms")
    for n in sorted({min(args.tokens, k) for k in (10, 100, 250, 500, 1000, args.tokens)} - {1}):
        lo = max(1, n - 10)
        print(f"  steps {lo:4d}..{n - 1:4d} (positions up to {args.prompt + n - 2:5d}): "
              f"median {np.median(steps[lo:n]) * 1e3:8.3f} ms")
    print(f"total {total:.3f} s for {args.tokens} tokens: {args.tokens / total:.1f} tokens/s")
    print(f"first tokens: {run.tokens[:16]}")
    if not args.no_cache:
        cache = model.new_cache()
        print(f"KV cache: {len(cache)} layers x {cache[0].bytes_per_token} bytes/token x {cache[0].max_seq_len} "
              f"positions = {sum(c.nbytes for c in cache) / 1024:.1f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
