#!/usr/bin/env python3
"""Validate the compiled Section 19 KV-cache step against NumPy (and PyTorch if present).

    python scripts/validate_kv_cache.py [build/storylm0_kv_step.so]

With no argument it compiles examples/storylm0_kv_step.kina first. The .so is
loaded through ctypes (kina.load) and fed patterned finite F32 tensors: ramps,
sines, alternating signs, and seeded random ones. k_next and v_next must match
NumPy bit for bit; context must be within 1e-6 relative (max error over max |ref|).
Exits non-zero on any mismatch.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import kina

ROOT = Path(__file__).resolve().parent.parent
CONTEXT_RTOL = 1e-6


def reference_numpy(q, k_past, k_new, v_past, v_new, scale):
    k_next = np.concatenate([k_past, k_new], axis=3)
    v_next = np.concatenate([v_past, v_new], axis=2)
    scores = np.matmul(q, k_next) * scale
    e = np.exp(scores - scores.max(axis=3, keepdims=True))
    return k_next, v_next, np.matmul(e / e.sum(axis=3, keepdims=True), v_next)


def reference_torch(torch, q, k_past, k_new, v_past, v_new, scale):
    t = [torch.from_numpy(x) for x in (q, k_past, k_new, v_past, v_new, scale)]
    k_next, v_next = torch.cat([t[1], t[2]], dim=3), torch.cat([t[3], t[4]], dim=2)
    probs = torch.softmax(torch.matmul(t[0], k_next) * t[5], dim=3)
    return k_next.numpy(), v_next.numpy(), torch.matmul(probs, v_next).numpy()


def patterns(shapes, seed=0):
    """Named input sets: deterministic patterns and seeded random ones."""
    rng = np.random.default_rng(seed)

    def ramp(shape, lo=-1.0, hi=1.0):
        return np.linspace(lo, hi, int(np.prod(shape)), dtype=np.float32).reshape(shape)

    def sine(shape, freq):
        return np.sin(freq * np.arange(int(np.prod(shape)), dtype=np.float32)).reshape(shape).astype(np.float32)

    def alternating(shape):
        return np.where(np.arange(int(np.prod(shape))) % 2, 1.5, -0.5).astype(np.float32).reshape(shape)

    scale = np.full(shapes[-1], 1 / np.sqrt(2), np.float32)
    yield "scaled ramps", [ramp(s, -1 + i / 10, 1 + i / 7) for i, s in enumerate(shapes[:-1])] + [scale]
    yield "sines", [sine(s, 0.3 + 0.2 * i) for i, s in enumerate(shapes[:-1])] + [scale]
    yield "alternating signs", [alternating(s) for s in shapes[:-1]] + [scale]
    yield "large logits", [8 * ramp(s) for s in shapes[:-1]] + [np.full(shapes[-1], 4.0, np.float32)]
    for i in range(4):
        yield f"random (seed {seed + i})", [rng.standard_normal(s).astype(np.float32) for s in shapes[:-1]] + \
            [np.full(shapes[-1], rng.uniform(0.1, 2.0), np.float32)]


def main(argv: list[str]) -> int:
    if argv:
        so = Path(argv[0])
        print(f"loading {so} through ctypes")
        module = kina.load(so)
    else:
        print("compiling examples/storylm0_kv_step.kina")
        module = kina.compile_file(ROOT / "examples" / "storylm0_kv_step.kina")
    step = module.kv_step
    shapes = [tuple(d.const for d in t.dims) for _, t in step.signature.params]
    try:
        import torch
        torch_note = f"PyTorch {torch.__version__}"
    except ImportError:
        torch = None
        torch_note = "PyTorch is not installed: comparing against NumPy only (pip install -e '.[bench]' adds it)"
    print(f"kv_step{tuple(n for n, _ in step.signature.params)}; {torch_note}\n")
    failures = 0
    print(f"{'inputs':<22}{'k_next':>10}{'v_next':>10}{'context rel.err':>18}{'torch rel.err':>16}  verdict")
    for name, args in patterns(shapes):
        k_next, v_next, context = step(*args)
        rk, rv, rc = reference_numpy(*args)
        k_ok, v_ok = np.array_equal(k_next, rk), np.array_equal(v_next, rv)
        rel = float(np.max(np.abs(context - rc)) / max(np.max(np.abs(rc)), np.finfo(np.float32).tiny))
        ok = k_ok and v_ok and rel <= CONTEXT_RTOL and np.all(np.isfinite(context))
        torch_rel = "-"
        if torch is not None:
            tk, tv, tc = reference_torch(torch, *args)
            trel = float(np.max(np.abs(context - tc)) / max(np.max(np.abs(tc)), np.finfo(np.float32).tiny))
            ok = ok and np.array_equal(k_next, tk) and np.array_equal(v_next, tv) and trel <= CONTEXT_RTOL
            torch_rel = f"{trel:.2e}"
        failures += not ok
        print(f"{name:<22}{'exact' if k_ok else 'DIFFER':>10}{'exact' if v_ok else 'DIFFER':>10}"
              f"{rel:>18.2e}{torch_rel:>16}  {'ok' if ok else 'MISMATCH'}")
    print(f"\n{'all results match' if not failures else f'{failures} input set(s) MISMATCH'} "
          f"(k/v bit-exact, context within {CONTEXT_RTOL:g} relative)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
