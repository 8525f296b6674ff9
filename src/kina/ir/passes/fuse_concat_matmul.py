"""fuse-concat-matmul: a one-row matmul that reads a concat also writes that concat.

In a decode step, `k_next = concat(k_past, k_new)` then `scores = q @ k_next` reads
the cache twice: once to copy it, once to multiply. When the matmul's lhs has one
row and the concat runs along the rhs's column (last) or contraction (second to
last) axis, the matmul is split along that axis into one `linalg.generic` per
concat operand, which reads the operand once and yields both its product and its
copy into the concat's slot:

    %e = tensor.empty() : tensor<4x3xf32>
    %c0 = tensor.insert_slice %a into %e[0, 0] [4, 2] [1, 1]
    %c = tensor.insert_slice %b into %c0[0, 2] [4, 1] [1, 1]
    %mm = linalg.generic {matmul} ins(%q, %c : tensor<1x4xf32>, tensor<4x3xf32>) outs(%zero : tensor<1x3xf32>)
becomes, along the column axis,
    %s0 = tensor.extract_slice %e[0, 0] [4, 2] [1, 1]
    %z0 = tensor.extract_slice %zero[0, 0] [1, 2] [1, 1]
    %p0:2 = linalg.generic {matmul + copy} ins(%q, %a) outs(%z0, %s0)   // yields acc + x * y, y
    %c0 = tensor.insert_slice %p0#1 into %e[0, 0] [4, 2] [1, 1]
    %r0 = tensor.insert_slice %p0#0 into %zero[0, 0] [1, 2] [1, 1]
    ... the same for %b at column 2 ...
and every use of %c and %mm takes the new concat and product. Along the
contraction axis the lhs is sliced instead and the parts accumulate in turn.

Guarantees: each output element still sums over k in ascending order with the same
body (`irbuild.mac`), so fused and unfused results are bit-identical. A concat is
fused into at most one matmul, the first that reads it, and only when every other
use of it comes later in the block (where the fused value dominates).

In:  any module; before bufferization (on tensors). Out: the same module with
each such matmul and concat fused; anything else is left as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import linalg, tensor

from ..irbuild import DYN, generic, mac, matmul_maps, slice_args
from ._pass import KinaPass
from ._util import NO_MATCH, apply_patterns, matmul_form


@dataclass(frozen=True)
class FuseConcatMatmul(KinaPass):
    name = "fuse-concat-matmul"
    summary = ("a one-row matmul that reads a concat along its column or contraction axis "
               "also writes the concat: one pass over each operand")
    optimisation = True

    def run(self, module_op) -> None:
        apply_patterns(module_op, {linalg.GenericOp: _pattern})


def _pattern(op, rewriter):
    found = _fusable(op)
    if not found:
        return NO_MATCH
    _fuse(op, rewriter, *found)


def _mixed(op, name: str) -> list:
    """An offset/size list of a slice op: ints where static, index values where not."""
    static = ir.DenseI64ArrayAttr(op.attributes[f"static_{name}"])
    dynamic = iter(getattr(op.opview, name))
    return [next(dynamic) if v == DYN else v for v in static]


def _concat_parts(value: ir.Value):
    """The insert_slice ops (first to last) and the tensor.empty that build `value`, if it is a concat."""
    parts = []
    while isinstance(value, ir.OpResult) and isinstance(value.owner, tensor.InsertSliceOp):
        parts.append(value.owner)
        value = value.owner.operands[1]  # the destination
    if not parts or not isinstance(value, ir.OpResult) or not isinstance(value.owner, tensor.EmptyOp):
        return None
    return parts[::-1], value.owner


def _axis(parts, rank: int) -> int | None:
    """The one axis along which the parts sit side by side, unit-strided and in order."""
    axes = set()
    for p in parts:
        if any(s != 1 for s in ir.DenseI64ArrayAttr(p.attributes["static_strides"])):
            return None
        axes |= {a for a, o in enumerate(_mixed(p, "offsets")) if o != 0}
    if len(axes) > 1:
        return None
    axis = axes.pop() if axes else rank - 1
    offset = 0
    for p in parts:  # each part starts where the previous ended
        if _mixed(p, "offsets")[axis] != offset:
            return None
        size = _mixed(p, "sizes")[axis]
        offset = offset + size if isinstance(offset, int) and isinstance(size, int) else size if offset == 0 else None
    return axis


def _fusable(op):
    if matmul_form(op) != "plain":
        return None
    lhs, rhs = list(op.inputs)
    if not isinstance(lhs.type, ir.RankedTensorType) or lhs.type.shape[-2] != 1 or lhs == rhs:
        return None
    if not all(_mac_type(v.type.element_type) == op.outputs[0].type.element_type for v in (lhs, rhs)):
        return None  # the fused body is `irbuild.mac`: it must give the accumulator's type
    found = _concat_parts(rhs)
    if found is None:
        return None
    parts, empty = found
    rank = lhs.type.rank
    if any(p.operands[0].type.rank != rank for p in parts):  # a rank-reducing insert_slice
        return None
    axis = _axis(parts, rank)
    if axis not in (rank - 1, rank - 2):
        return None
    links = [p.result for p in parts[:-1]] + [empty.result]  # the chain's inner values: used by the chain alone
    if any(len(list(v.uses)) != 1 for v in links):
        return None
    block = op.operation.block
    for use in rhs.uses:  # every other reader of the concat must come after the matmul
        user = use.owner
        user = getattr(user, "operation", user)
        if user != op.operation and (user.block != block or not op.operation.is_before_in_block(user)):
            return None
    return parts, empty, axis


def _mac_type(t: ir.Type) -> ir.Type:
    """The type `irbuild.mac` multiplies in for operands of type `t` (f16 and bf16 widen to f32)."""
    return t if isinstance(t, (ir.F32Type, ir.F64Type)) else ir.F32Type.get()


def _slice(source: ir.Value, offsets, sizes) -> ir.Value:
    t = ir.RankedTensorType.get([s if isinstance(s, int) else DYN for s in sizes], source.type.element_type)
    return tensor.ExtractSliceOp(t, source, *slice_args(offsets, sizes)).result


def _fuse(op, rewriter, parts, empty, axis: int) -> None:
    lhs, _ = list(op.inputs)
    acc = list(op.outputs)[0]
    rank = lhs.type.rank
    maps, iterators = matmul_maps(rank)
    concat = empty.result
    with rewriter.ip:
        for part in parts:
            offsets, sizes = _mixed(part, "offsets"), _mixed(part, "sizes")
            with part.location:
                slot = _slice(concat, offsets, sizes)
            with op.location:
                if axis == rank - 1:  # columns: this part's columns of the product
                    at, size = [0] * (rank - 1) + [offsets[-1]], sizes[:-2] + [1, sizes[-1]]
                    acc_part, lhs_part = _slice(acc, at, size), lhs
                else:  # contraction: this part's columns of the lhs
                    at, size = [0] * (rank - 1) + [offsets[-2]], sizes[:-2] + [1, sizes[-2]]
                    acc_part, lhs_part = acc, _slice(lhs, at, size)
                product, copied = generic([lhs_part, part.operands[0]], [acc_part, slot], maps, iterators,
                                          lambda x, y, a, _: [mac(x, y, a), y])
            with part.location:
                concat = tensor.InsertSliceOp(copied, concat, *slice_args(offsets, sizes)).result
            with op.location:
                acc = tensor.InsertSliceOp(product, acc, *slice_args(at, size)).result \
                    if axis == rank - 1 else product
    rewriter.replace_op(op, [acc])
    rewriter.replace_op(parts[-1], [concat])
    for part in reversed(parts[:-1]):  # the rest of the old chain, read by nothing now
        rewriter.erase_op(part.operation)
