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
Here lane l of a vector of partial sums (REDUCTION_BYTES wide) adds the elements
at l, l + L, l + 2L, ... of the row's leading whole vectors; the lanes are then
added pairwise (halves, then quarters, ...), that total is added to the output's
initial value, and the remaining elements follow in order. Pairwise partial sums
are also more accurate than one running sum.

Guarantees: the order is fixed by this code, not by LLVM, and is the same for
every size, static or symbolic, and every target CPU, so static and symbolic
programs give the same bits. It differs from the plain loop order (-O0).
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from ..irbuild import affine_map, index
from ._util import dim, iterators_of, loop, maps_of, nest, rewrite_each

REDUCTION_BYTES = 256  # a sum's vector of partial sums: independent add chains to hide the add latency


def _is_sum(op) -> bool:
    """Is `op` a bufferized `linalg.generic` summing its input over the innermost
    (unit-stride) dim into an output of the other dims, as softmax's sum is?"""
    if op.name != "linalg.generic":
        return False
    ins, outs = list(op.opview.inputs), list(op.opview.outputs)
    if len(ins) != 1 or len(outs) != 1 or not all(isinstance(v.type, ir.MemRefType) for v in ins + outs):
        return False
    src = ir.MemRefType(ins[0].type)
    n = src.rank
    if n < 1 or ir.MemRefType(outs[0].type).rank != n - 1 or src.get_strides_and_offset()[0][-1] != 1:
        return False
    if src.element_type != ir.MemRefType(outs[0].type).element_type:
        return False
    if maps_of(op) != [ir.AffineMap.get_identity(n), affine_map(n, [ir.AffineDimExpr.get(a) for a in range(n - 1)])]:
        return False
    if iterators_of(op) != ["parallel"] * (n - 1) + ["reduction"]:
        return False
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    v, acc = list(block.arguments)
    return [o.name for o in body] == ["arith.addf", "linalg.yield"] and \
        set(body[0].operands) == {v, acc} and list(body[1].operands) == [body[0].result]


def run(module_op, lanes_bytes: int = REDUCTION_BYTES) -> None:
    rewrite_each(module_op, _is_sum, lambda op, _: _emit(op, lanes_bytes))

def _emit(op, lanes_bytes: int) -> None:
    (src,), (dst,) = list(op.opview.inputs), list(op.opview.outputs)
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


