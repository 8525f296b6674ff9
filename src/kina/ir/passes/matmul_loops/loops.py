"""matmul-loops, what every emitter of a matmul's loops reads: its operands, sizes and types.

In:  a matmul `linalg.generic` on memrefs, the pass's options and its `Choice`.
Out: `Matmul`, built at the insertion point where the loops go: the operands (lhs, rhs,
     acc, and a fused one's slot), the sizes (K, I, N, each batch dim) as index values,
     each operand's batch indices, the vector types, `widen` and `mac` (`widen_and_mac`),
     and the run-time values the row loops test (rhs's row stride, whether its rows are
     short and back to back, where slot rows start).

Guarantees: building it emits only the index arithmetic and metadata reads those values
need, before any loop; nothing here changes the order of the sums.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, memref

from ...irbuild import DYN, index
from .._util import batch_indices, dim, maps_of
from .choose import Choice


def widen_and_mac(elt: ir.Type, fma: bool):
    """(widen, mac) for loops summing in `elt`: widen(v) extends a scalar or a vector
    to `elt` (itself when it is of `elt` already); mac(a, x, y) is a + x * y
    as the reference body has it, fmul then fadd, or with `fma` rounded once (other bits)."""
    def widen(v):
        vt = isinstance(v.type, ir.VectorType)
        if (ir.VectorType(v.type).element_type if vt else v.type) == elt:
            return v
        return arith.ExtFOp(ir.VectorType.get(ir.VectorType(v.type).shape, elt) if vt else elt, v).result
    mac = (lambda a, x, y: math.FmaOp(x, y, a).result) if fma else \
        (lambda a, x, y: arith.AddFOp(a, arith.MulFOp(x, y).result).result)
    return widen, mac


class Matmul:
    """One matmul's operands and the values its loops share (see the module docstring);
    `choice` is its `Choice`, `options` the pass's, `stack_buffer(type)` a buffer on the
    function's stack."""

    def __init__(self, op, options, choice: Choice, stack_buffer):
        self.op, self.options, self.choice, self.stack_buffer = op, options, choice, stack_buffer
        lhs, rhs = list(op.inputs)
        acc, *slot = list(op.outputs)
        slot = slot[0] if slot and choice.copy else None  # a fused matmul's concat slot, written with non-temporal stores
        acc_t = ir.MemRefType(acc.type)
        rank, elt = acc_t.rank, acc_t.element_type
        zero, one = index(0), index(1)
        self.lhs, self.rhs, self.acc, self.slot, self.acc_t, self.elt, self.zero, self.one = \
            lhs, rhs, acc, slot, acc_t, elt, zero, one
        self.sizes = sizes = [dim(acc, a) for a in range(rank)]  # batch..., I, N
        self.K, self.I, self.N = K, I, N = dim(lhs, ir.MemRefType(lhs.type).rank - 1), sizes[-2], sizes[-1]
        # each operand's batch indices from the loops' (a broadcast operand has fewer, or reads 0)
        lhs_batch, rhs_batch = (batch_indices(m, rank - 2, side) for m, side in zip(maps_of(op), ("lhs", "rhs")))
        self.lhs_at = lambda b: [b[p] if p is not None else zero for p in lhs_batch]
        self.rhs_at = lambda b: [b[p] if p is not None else zero for p in rhs_batch]
        self.elt_bytes = elt.width // 8
        self.width, self.line = choice.width, choice.line
        self.vtype = ir.VectorType.get([choice.width], elt)
        # widening (F16 or BF16 operands, F32 sums): each value is extended once, as loaded
        self.narrow = narrow = ir.MemRefType(rhs.type).element_type  # what rhs vectors are loaded as
        self.in_bytes = in_bytes = narrow.width // 8
        self.nvtype = lambda vt: vt if vt is None or narrow == elt else ir.VectorType.get(vt.shape, narrow)
        self.widen, self.mac = widen_and_mac(elt, options.fma)
        self.slot_bytes = in_bytes if slot is not None else self.elt_bytes
        self.use_vectors = acc_t.shape[-1] == DYN or acc_t.shape[-1] >= choice.width
        self.line_vtype = ir.VectorType.get([choice.line], elt)
        self.rhs_k_stride = rhs_k_stride = list(memref.ExtractStridedMetadataOp(rhs).strides)[-2]
        if choice.unroll > 1:  # rhs rows short and nearly back to back: one row at a time streams them best
            row_bytes = arith.MulIOp(N, index(in_bytes)).result
            gap_bytes = arith.MulIOp(arith.SubIOp(rhs_k_stride, N).result, index(in_bytes)).result
            self.short_dense_rows = arith.AndIOp(
                arith.CmpIOp(arith.CmpIPredicate.ule, row_bytes, index(options.row_at_a_time_bytes)).result,
                arith.CmpIOp(arith.CmpIPredicate.ule, gap_bytes, index(options.row_at_a_time_gap_bytes)).result).result
        self.K_last, self.N_last = arith.SubIOp(K, one).result, arith.SubIOp(N, one).result
        if slot is not None:  # where slot rows start, to align the non-temporal stores
            meta = memref.ExtractStridedMetadataOp(slot)
            self.slot_base = memref.ExtractAlignedPointerAsIndexOp(slot).result
            self.slot_offset, self.slot_strides = meta.offset, list(meta.strides)
        if choice.prefetch:  # whole rows of rhs, at least prefetch-bytes and at least one
            stride_bytes = arith.MulIOp(rhs_k_stride, index(in_bytes)).result
            self.rows_ahead = arith.MaxUIOp(arith.DivUIOp(arith.AddIOp(stride_bytes, index(options.prefetch_bytes - 1)).result,
                                                          arith.MaxUIOp(stride_bytes, one).result).result, one).result

    def slot_address(self, indices) -> ir.Value:
        """The byte address of slot[*indices, 0, ...]."""
        lin = self.slot_offset
        for i, stride in zip(indices, self.slot_strides):
            lin = arith.AddIOp(lin, arith.MulIOp(i, stride).result).result
        return arith.AddIOp(self.slot_base, arith.MulIOp(lin, index(self.slot_bytes)).result).result
