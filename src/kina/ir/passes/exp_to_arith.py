"""exp-to-arith: every f32 `math.exp` becomes plain arith ops (`exp_f32`).

    %e = math.exp %x : f32
becomes
    %k = (%x * log2(e) + 1.5 * 2**23) - 1.5 * 2**23       // round to nearest
    %r = %x - %k * ln2 (in two parts)
    %p = polynomial(%r)                                   // Cephes' expf, degree 7
    %e = %p * 2**(%k/2) * 2**(%k - %k/2)                  // exponent bits, two halves
    (with selects for NaN, underflow to 0 and overflow to inf)

libm's expf is a call that blocks vectorisation; a vector math library would give
the vectorised body and the scalar tail of a loop different bits. These are the
same IEEE operations whether LLVM runs them on vectors or one at a time.

In:  any module. Out: the same module with every scalar f32 `math.exp` expanded;
other `math.exp` (f16, bf16, f64, vectors) are left as they are.

Guarantees: <= 1 ulp from the exact e**x on every f32 (scripts/exp_accuracy.py
checks all of [-104, 88.72]: max 0.982 ulp); e**-inf = 0, e**inf = inf, NaN stays
NaN; every element gets the same bits for any size and target CPU. Without this
pass (-O0) exp is libm's expf, which may differ by an ulp.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, math

from ._pass import KinaPass
from ._util import NO_MATCH, apply_patterns


@dataclass(frozen=True)
class ExpToArith(KinaPass):
    name = "exp-to-arith"
    summary = "f32 math.exp to arith ops (<= 1 ulp), the same bits vectorised or not"
    optimisation = True

    def run(self, module_op) -> None:
        apply_patterns(module_op, {math.ExpOp: _exp})


def _exp(op, rewriter):
    if op.results[0].type != ir.F32Type.get():
        return NO_MATCH  # f16, bf16, f64 and vectors stay libm's
    with rewriter.ip, op.location:
        rewriter.replace_op(op, [exp_f32(op.operands[0])])


def exp_f32(x: ir.Value) -> ir.Value:
    """e**x for an f32 `x`, as plain arith ops: the same IEEE operations whether LLVM
    runs them on vectors or one at a time, so every element gets the same bits
    wherever it sits, for any size, static or symbolic, and any target CPU (libm's
    expf is a call that blocks vectorisation; a vector math library would give the
    vectorised body and the scalar tail of a loop different bits).

    Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, with ln2 split in two so that
    k * C1 is exact; e**r by the degree-7 polynomial of Cephes' expf; then the two
    halves of 2**k multiplied in, so that results in the subnormal range round once.
    Measured error <= 1 ulp against float64 over every f32 in [-104, 88.7]
    (tests/test_lowering.py); e**-inf = 0, e**inf = inf, NaN stays NaN.
    """
    f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
    c = lambda v: arith.ConstantOp(f32, v).result
    i = lambda v: arith.ConstantOp(i32, v).result
    mul = lambda a, b: arith.MulFOp(a, b).result
    add = lambda a, b: arith.AddFOp(a, b).result
    cmp = lambda pred, a, b: arith.CmpFOp(pred, a, b).result
    sel = lambda cond, a, b: arith.SelectOp(cond, a, b).result
    lo, hi = -104.0, 88.72283935546875  # beyond them e**x is 0 and inf in f32
    nan = cmp(arith.CmpFPredicate.UNO, x, x)
    xs = sel(nan, c(0.0), arith.MinimumFOp(arith.MaximumFOp(x, c(lo)).result, c(hi)).result)
    # round to nearest even by adding and taking away 1.5 * 2**23 (exact for |x| < 2**22):
    # math.roundeven would be a libm call, not vectorised, on CPUs without SSE4.1
    magic = c(12582912.0)
    k = arith.SubFOp(add(mul(xs, c(1.44269504088896341)), magic), magic).result
    r = add(add(xs, mul(k, c(-0.693359375))), mul(k, c(2.12194440e-4)))
    y = c(1.9875691500e-4)
    for coeff in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        y = add(mul(y, r), c(coeff))
    y = add(add(mul(y, mul(r, r)), r), c(1.0))
    ki = arith.FPToSIOp(i32, k).result
    half = arith.ShRSIOp(ki, i(1)).result
    scale = lambda n: arith.BitcastOp(f32, arith.ShLIOp(arith.AddIOp(n, i(127)).result, i(23)).result).result
    y = mul(mul(y, scale(half)), scale(arith.SubIOp(ki, half).result))
    y = sel(cmp(arith.CmpFPredicate.OLT, x, c(lo)), c(0.0), y)
    y = sel(cmp(arith.CmpFPredicate.OGT, x, c(hi)), c(float("inf")), y)
    return sel(nan, x, y)


