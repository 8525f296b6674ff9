#!/usr/bin/env python3
"""StoryLM-0 end to end (issue 13): Kina against PyTorch eager (1 and 2 threads) and NumPy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_model.py \\
        [--prompt 32] [--new 256] [--d-model 512] [--heads 8] [--layers 4] [--ffn 1408] [--vocab 4096] [--repeats 3]

Every variant generates --new greedy tokens after the same --prompt-token prompt, with
the same seeded F32 weights:

- Kina: kina.models.StoryLM. One decoder_prefill call per layer for the prompt, then one
  decoder_step call per layer per token, and the head (src/kina/models/kernels/storylm.kina), all compiled;
  the host looks up the embedding row and takes the argmax. One thread.
- PyTorch eager, 1 and 2 threads: tests/storylm_torch.py, the tests' reference, with its
  KV cache grown by torch.cat as Hugging Face's default cache does, under inference_mode.
- NumPy: kina.models.NumPyStoryLM, the same layer in NumPy ops (OpenBLAS at 1 thread).

The variants run interleaved, --repeats times after one untimed run each, and the table
shows medians over the runs: the prefill, the median decode step, and tokens/s over the
whole generation (the prefill included). For Kina, each compiled entry point and each layer
step is timed from the outside (a wrapper around the ctypes call), which splits the
decode time per token into compiled calls and Python (argument lists, descriptors,
result allocation, the embedding row, the argmax). All variants must agree on the tokens.

What limits it: a decode step reads every weight once (4 D^2 + 3 D F per layer, plus the
head's D V), 60 MB at the default sizes, more than the last-level cache, so the step is
bound by memory bandwidth; the script measures the machine's read bandwidth in the same
run and prints the floor, weight bytes / bandwidth, beside the measured step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # NumPy's row on one thread, as Kina's; before numpy loads
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # storylm_torch, the tests' PyTorch model

import kina  # noqa: E402
from benchlib import machine  # noqa: E402
from benchlib.bandwidth import read_bandwidth  # noqa: E402
from benchlib.timing import interleaved, medians  # noqa: E402
from kina.models import NumPyStoryLM, StoryLM  # noqa: E402

MB = 1e6
BW_PASSES = 5  # read-bandwidth passes before the runs and again after them


class Timed:
    """A callable that times every call of `fn` (the seconds add up in `.seconds`)."""

    def __init__(self, fn):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args):
        t = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1

    def reset(self):
        self.seconds, self.calls = 0.0, 0


def instrument(model: StoryLM) -> dict[str, Timed]:
    """Time each compiled entry point of `model` (its ctypes function). This reaches into
    the runtime's Function._cfunc: it is a measurement, not an interface."""
    timers = {}
    for name, fn in model._kernels.functions.items():
        fn._cfunc = timers[name] = Timed(fn._cfunc)
    return timers


def run_storylm(model, prompt, n_new, timers=None) -> dict:
    for t in (timers or {}).values():
        t.reset()
    g = model.trace(prompt, n_new)
    decode = g.step_seconds[1:]
    out = dict(tokens=g.tokens, prefill=g.step_seconds[0], decode=statistics.median(decode),
               mean_decode=sum(decode) / len(decode), total=sum(g.step_seconds),
               first=statistics.median(decode[:16]), last=statistics.median(decode[-16:]))
    if timers:
        steps = len(decode)
        # the prefill made n_layers decoder_prefill calls and one head call: only the decode is split
        compiled = timers["decoder_step"].seconds + timers["logits"].seconds * steps / (steps + 1)
        out.update(compiled=compiled / steps, python=(sum(decode) - compiled) / steps,
                   layer_compiled=timers["decoder_step"].seconds / timers["decoder_step"].calls)
    return out


def run_torch(torch, model, threads, prompt, n_new) -> dict:
    torch.set_num_threads(threads)
    tokens, _, seconds = model.generate(prompt, n_new)
    decode = seconds[1:]
    return dict(tokens=tokens, prefill=seconds[0], decode=statistics.median(decode),
                mean_decode=sum(decode) / len(decode), total=sum(seconds))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--new", type=int, default=256, help="tokens generated")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1408)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each variant, interleaved")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.new < 2 or a.prompt < 1 or a.repeats < 1:
        p.error("--new must be >= 2, --prompt and --repeats >= 1")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    sizes = dict(vocab_size=args.vocab, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
                 ffn_dim=args.ffn, max_seq_len=args.prompt + args.new)
    D, F, V, L = args.d_model, args.ffn, args.vocab, args.layers
    weight_bytes = 4 * (L * (4 * D * D + 3 * D * F) + D * V)
    print(f"StoryLM-0: d_model {D}, {args.heads} heads, {L} layers, FFN {F}, vocab {V}, F32; "
          f"{args.new} tokens after a {args.prompt}-token prompt")
    print(f"{machine.describe()}, kina {kina.__version__}; numpy {np.__version__} (OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']})"
          + (f", torch {torch.__version__}" if torch else ", no torch (its rows are skipped)")
          + f"; load average {os.getloadavg()[0]:.2f}", flush=True)

    t = time.perf_counter()
    model = StoryLM(**sizes, seed=args.seed)
    print(f"StoryLM built (weights and compile, or a compile-cache hit) in {time.perf_counter() - t:.2f} s")
    timers = instrument(model)
    prompt = [int(x) for x in np.random.default_rng(args.seed).integers(0, V, args.prompt)]
    variants = {"Kina (StoryLM)": lambda: run_storylm(model, prompt, args.new, timers)}
    if torch is not None:
        from storylm_torch import TorchStoryLM
        tmodel = TorchStoryLM(model.weights, args.heads, model.eps, model.rope_theta)
        variants["PyTorch eager, 1 thread"] = lambda: run_torch(torch, tmodel, 1, prompt, args.new)
        variants["PyTorch eager, 2 threads"] = lambda: run_torch(torch, tmodel, 2, prompt, args.new)
    nmodel = NumPyStoryLM(**sizes, weights=model.weights)
    variants["NumPy"] = lambda: run_storylm(nmodel, prompt, args.new)

    bw = read_bandwidth(BW_PASSES)
    runs = interleaved(variants, args.repeats)
    bw = max(bw, read_bandwidth(BW_PASSES))

    med = {name: medians(rs) for name, rs in runs.items()}
    want = runs["Kina (StoryLM)"][0]["tokens"]
    print(f"\n| variant | prefill ({args.prompt} tokens) | decode, per token (median step) | tokens/s | same tokens |")
    print("| --- | --- | --- | --- | --- |")
    for name, m in med.items():
        same = all(r["tokens"] == want for r in runs[name])
        print(f"| {name} | {m['prefill'] * 1e3:.2f} ms | {m['decode'] * 1e3:.3f} ms | "
              f"{args.new / m['total']:.0f} | {'yes' if same else 'NO'} |")
    k = med["Kina (StoryLM)"]
    python = k["python"]
    S0, S1 = args.prompt + 8, args.prompt + args.new - 9
    print(f"\nKina's step grows with the cache it reads and copies: {k['first'] * 1e3:.3f} ms at S ~ {S0}, "
          f"{k['last'] * 1e3:.3f} ms at S ~ {S1} (medians of 16 steps).")
    layer_python = python / L  # all of the token's Python, the head's included, charged to the layers
    print(f"Kina, per decode token (means): {k['mean_decode'] * 1e3:.3f} ms = compiled calls {k['compiled'] * 1e3:.3f} ms "
          f"+ Python {python * 1e3:.3f} ms ({python / k['mean_decode']:.1%}). Per layer step: decoder_step "
          f"{k['layer_compiled'] * 1e6:.0f} us compiled + at most {layer_python * 1e6:.0f} us of Python "
          f"({layer_python / (k['layer_compiled'] + layer_python):.1%} of the step).")
    floor = weight_bytes / bw
    print(f"Limit: each token reads {weight_bytes / MB:.1f} MB of weights ({L} layers x {4 * (4 * D * D + 3 * D * F) / MB:.1f} MB "
          f"+ head {4 * D * V / MB:.1f} MB; the KV cache adds at most {8 * L * D * (args.prompt + args.new) / MB:.1f} MB "
          f"read and copied), more than the LLC; at the read bandwidth of one thread, {bw / 1e9:.1f} GB/s "
          f"(np.sum and np.dot, best of {2 * BW_PASSES} passes), that is a floor of {floor * 1e3:.2f} ms per token. Kina's compiled "
          f"calls take {k['compiled'] / floor:.2f}x that floor, its whole token {k['mean_decode'] / floor:.2f}x.")
    torch_best = min((m["decode"], n) for n, m in med.items() if n.startswith("PyTorch")) if torch else None
    if torch_best:
        print(f"Kina's decode token takes {k['decode'] / torch_best[0]:.2f}x the time of {torch_best[1]} (the faster).")
    print(f"load average at the end {os.getloadavg()[0]:.2f} (a shared machine: figures are noisy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
