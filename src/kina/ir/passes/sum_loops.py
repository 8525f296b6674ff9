"""sum-loops: after bufferization, each innermost-dim sum becomes loops in a fixed order.

    linalg.generic {(d0, d1) -> (d0, d1), (d0, d1) -> (d0); parallel, reduction}
        ins(%x : memref<4x1000xf32, ...>) outs(%s : memref<4xf32>)   // acc + v
becomes, per row,
    %p = scf.for %j = 0 to 960 step 64 iter_args(%p = zeros : vector<64xf32>)   // lane sums
           { %p + vector.load %x[%r, %j] }
    %t = (halves of %p added pairwise down to one lane) + %s[%r]
    %t' = scf.for %j = 960 to 1000 iter_args(%t) { %t + %x[%r, %j] }            // the tail, in order
    memref.store %t', %s[%r]

A sum in loop order is one chain of dependent adds, as slow as the add latency.
Here lane l of a vector of partial sums (`vector-bytes` wide, an option) adds
the elements at l, l + L, l + 2L, ... of the row's leading whole vectors; the
lanes are then added pairwise (halves, then quarters, ...), that total is added
to the output's initial value, and the remaining elements follow in order. Pairwise partial sums
are also more accurate than one running sum.

Guarantees: the order is fixed by this code, not by LLVM, and is the same for
every size, static or symbolic, and every target CPU, so static and symbolic
programs give the same bits. It differs from the plain loop order (-O0).

In:  any module; after bufferization, when sums are on memrefs. Out: the same
module with every such sum as loops; other generics (on tensors, not over the
innermost dim, a non-unit innermost stride, a body other than one addf) are left
to convert-linalg-to-loops.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, linalg, memref, vector

from ..irbuild import affine_map, index
from ._pass import KinaPass, option
from ._util import NO_MATCH, apply_patterns, dim, iterators_of, loop, maps_of, nest, unit_innermost


def _power_of_two(n: int) -> bool:
    return 4 <= n <= 4096 and n & (n - 1) == 0


@dataclass(frozen=True)
class SumLoops(KinaPass):
    name = "sum-loops"
    summary = "innermost-dim sums to vector partial sums added in a fixed order"
    optimisation = True
    vector_bytes: int = option(256, "bytes of the vector of partial sums: independent add chains that hide "
                               "the add latency", check=_power_of_two, expected="a power of two from 4 to 4096")

    def run(self, module_op) -> None:
        def sum_pattern(op, rewriter):
            if not _is_sum(op):
                return NO_MATCH
            with rewriter.ip, op.location:
                _emit(op, self.vector_bytes)
            rewriter.erase_op(op.operation)
        apply_patterns(module_op, {linalg.GenericOp: sum_pattern})


def _is_sum(op) -> bool:
    """Is `op` a bufferized `linalg.generic` summing its input over the innermost
    (unit-stride) dim into an output of the other dims, as softmax's sum is?"""
    ins, outs = list(op.inputs), list(op.outputs)
    if len(ins) != 1 or len(outs) != 1 or not all(isinstance(v.type, ir.MemRefType) for v in ins + outs):
        return False
    src, dst = ins[0].type, outs[0].type
    n = src.rank
    if n < 1 or dst.rank != n - 1 or not unit_innermost(src) or src.element_type != dst.element_type or \
            not isinstance(src.element_type, ir.FloatType):
        return False
    if maps_of(op) != [ir.AffineMap.get_identity(n), affine_map(n, [ir.AffineDimExpr.get(a) for a in range(n - 1)])]:
        return False
    if iterators_of(op) != ["parallel"] * (n - 1) + ["reduction"]:
        return False
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    v, acc = list(block.arguments)
    if len(body) != 2 or not isinstance(body[0], arith.AddFOp):  # the add, the yield
        return False
    add = body[0]
    return {add.lhs, add.rhs} == {v, acc} and add.lhs != add.rhs and list(body[1].operands) == [add.result]


def _emit(op, lanes_bytes: int) -> None:
    (src,), (dst,) = list(op.inputs), list(op.outputs)
    src_t = ir.MemRefType(src.type)
    n, elt = src_t.rank, src_t.element_type
    zero, one = index(0), index(1)
    lanes = max(1, lanes_bytes // (elt.width // 8))
    vtype = ir.VectorType.get([lanes], elt)
    size = [dim(src, a) for a in range(n)]

    def row(outer):
        length = size[-1]
        whole = arith.SubIOp(length, arith.RemUIOp(length, index(lanes)).result).result
        partial = arith.ConstantOp(vtype, ir.DenseElementsAttr.get_splat(vtype, ir.FloatAttr.get(elt, 0.0))).result
        partial, = loop(zero, whole, index(lanes),
                         lambda j, p: [arith.AddFOp(p, vector.LoadOp(vtype, src, [*outer, j]).result).result], [partial])
        width = lanes
        while width > 1:  # pairwise: halves, quarters, ...
            width //= 2
            half = ir.VectorType.get([width], elt)
            lo = vector.ExtractStridedSliceOp(half, partial, [0], [width], [1]).result
            hi = vector.ExtractStridedSliceOp(half, partial, [width], [width], [1]).result
            partial = arith.AddFOp(lo, hi).result
        total = arith.AddFOp(memref.LoadOp(dst, outer).result, vector.ExtractOp(partial, [], [0]).result).result
        total, = loop(whole, length, one,
                       lambda j, t: [arith.AddFOp(t, memref.LoadOp(src, [*outer, j]).result).result], [total])
        memref.StoreOp(total, dst, outer)

    nest(size[:-1], row)


