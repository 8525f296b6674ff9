#!/usr/bin/env python3
"""Validate the compiled Section 19 KV-cache step against NumPy (and PyTorch if present).

    python scripts/validate_kv_cache.py [build/storylm0_kv_step.so]

With no argument it compiles examples/storylm0_kv_step.kina first. The .so is
loaded through ctypes (kina.load) and fed patterned finite F32 tensors: ramps,
sines, alternating signs, and seeded random ones. k_next and v_next must match
NumPy bit for bit; context must be within 1e-6 relative (max error over max |ref|).

Then the same step in BF16 (src/kina/models/seed/kv_step.kina, the step generic in its
element type, compiled with T = BF16 at the example's dims), on the
same patterns rounded to `ml_dtypes.bfloat16`: k_next and v_next must again be exact,
and context within 2^-5 relative of the F32 reference computed from the same
bf16-valued inputs (eight units of bf16 roundoff; see README, Python API), and of
PyTorch's own bfloat16 step. Exits non-zero on any mismatch.
"""
from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

import kina
from kina.runtime import LoadError

ROOT = Path(__file__).resolve().parent.parent
CONTEXT_RTOL = 1e-6
BF16_RTOL = 2 ** -5  # 8 units of bf16 roundoff (2^-8): the step rounds 4 times, logits amplify the error


def reference_numpy(q, k_past, k_new, v_past, v_new, scale):
    k_next = np.concatenate([k_past, k_new], axis=3)
    v_next = np.concatenate([v_past, v_new], axis=2)
    scores = np.matmul(q, k_next) * scale
    e = np.exp(scores - scores.max(axis=3, keepdims=True))
    return k_next, v_next, np.matmul(e / e.sum(axis=3, keepdims=True), v_next)


def reference_torch(torch, q, k_past, k_new, v_past, v_new, scale):
    t = [_to_torch(torch, x) for x in (q, k_past, k_new, v_past, v_new, scale)]
    k_next, v_next = torch.cat([t[1], t[2]], dim=3), torch.cat([t[3], t[4]], dim=2)
    probs = torch.softmax(torch.matmul(t[0], k_next) * t[5], dim=3)
    return tuple(_to_numpy(torch, x) for x in (k_next, v_next, torch.matmul(probs, v_next)))


def _to_torch(torch, x):  # torch.from_numpy knows no ml_dtypes.bfloat16: share the bits as int16
    return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) if x.dtype == ml_dtypes.bfloat16 \
        else torch.from_numpy(x)


def _to_numpy(torch, t):
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()


def relative_error(got, want) -> float:
    """max |got - want| / max |want|, in float64."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), np.finfo(np.float32).tiny))


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


def check(step, dtype, rtol: float, torch) -> int:
    """Print one row per input set; return the number of mismatching sets."""
    shapes = [tuple(d.const for d in t.dims) for _, t in step.signature.params]
    failures = 0
    print(f"{'inputs':<22}{'k_next':>10}{'v_next':>10}{'context rel.err':>18}{'torch rel.err':>16}  verdict")
    for name, args in patterns(shapes):
        args = [a.astype(dtype) for a in args]
        k_next, v_next, context = step(*args)
        rk, rv, rc = reference_numpy(*[a.astype(np.float32) for a in args])  # F32, from the same values
        k_ok, v_ok = np.array_equal(k_next, rk.astype(dtype)), np.array_equal(v_next, rv.astype(dtype))
        rel = relative_error(context, rc)
        ok = k_ok and v_ok and rel <= rtol and np.all(np.isfinite(context.astype(np.float32)))
        torch_rel = "-"
        if torch is not None:
            tk, tv, tc = reference_torch(torch, *args)
            trel = relative_error(context, tc)
            ok = ok and np.array_equal(k_next, tk) and np.array_equal(v_next, tv) and trel <= rtol
            torch_rel = f"{trel:.2e}"
        failures += not ok
        print(f"{name:<22}{'exact' if k_ok else 'DIFFER':>10}{'exact' if v_ok else 'DIFFER':>10}"
              f"{rel:>18.2e}{torch_rel:>16}  {'ok' if ok else 'MISMATCH'}")
    print(f"{'all results match' if not failures else f'{failures} input set(s) MISMATCH'} "
          f"(k/v bit-exact, context within {rtol:g} relative)\n")
    return failures


def main(argv: list[str]) -> int:
    source = ROOT / "examples" / "storylm0_kv_step.kina"
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv:
        so = Path(argv[0])
        print(f"loading {so} through ctypes")
        try:
            module = kina.load(so)
        except LoadError as e:
            print(f"validate_kv_cache: error: {e}", file=sys.stderr)
            return 2
    else:
        print(f"compiling {source.relative_to(ROOT)}")
        module = kina.compile_file(source)
    step = module.kv_step
    try:
        import torch
        torch_note = f"PyTorch {torch.__version__}"
    except ImportError:
        torch = None
        torch_note = "PyTorch is not installed: comparing against NumPy only (pip install -e '.[bench]' adds it)"
    print(f"kv_step{tuple(n for n, _ in step.signature.params)}; {torch_note}\n")
    failures = check(step, np.float32, CONTEXT_RTOL, torch)
    generic = ROOT / "src" / "kina" / "models" / "seed" / "kv_step.kina"
    print(f"BF16: compiling {generic.relative_to(ROOT)} (the same step, generic in T) with T = BF16 at the "
          "example's dims; inputs rounded to bfloat16")
    try:
        bf16 = kina.compile_file(generic, dtypes={"T": "BF16"}, dims=dict(B=1, H=2, Dh=2, S=3))
    except LoadError as e:
        print(f"BF16: MISMATCH: the compiled step cannot be loaded: {e}")
        return 1
    failures += check(bf16.kv_step, ml_dtypes.bfloat16, BF16_RTOL, torch)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
