"""Helpers shared by Kina's passes: applying rewrite patterns, recognising the
linalg forms `kina.ir.lower` emits (structurally: indexing maps, iterator types,
and a body's op kinds and wiring), and building loops. No pass logic lives here."""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, func, linalg, memref, scf
from mlir.rewrite import RewritePatternSet, walk_and_apply_patterns

from ..irbuild import DYN, index, matmul_maps


# What a pattern returns when it does not match: the bindings map a truthy return
# to a failed match (LogicalResult failure) and None to a rewrite.
NO_MATCH = True


def apply_patterns(module_op, patterns: dict) -> None:
    """Apply rewrite patterns to every op under `module_op` in one walk (the bindings'
    `walk_and_apply_patterns`: no fixpoint, no folding, so nothing but the matched ops
    changes). `patterns` maps an op class (`linalg.GenericOp`) to `fn(op, rewriter)`,
    which gets the op as that class and either returns `NO_MATCH` or rewrites it
    through the `PatternRewriter` (building at `rewriter.ip`, then `replace_op` or
    `erase_op`) and returns None."""
    patterns_set = RewritePatternSet()
    for root, fn in patterns.items():
        patterns_set.add(root, fn)
    walk_and_apply_patterns(module_op, patterns_set.freeze())


def maps_of(op) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]


def iterators_of(op) -> list[str]:
    """A linalg.generic's iterator types as "parallel" / "reduction"."""
    return [str(a).removeprefix("#linalg.iterator_type<").removesuffix(">") for a in op.attributes["iterator_types"]]


def _defining(value: ir.Value, kind):
    """The op of class `kind` (an OpView class) that defines `value`, or None."""
    if not isinstance(value, ir.OpResult):
        return None
    op = value.owner.opview
    return op if isinstance(op, kind) else None


def _same_pair(got, want) -> bool:
    """Are the two operands `got` the values `want`, in either order (the op commutes exactly)?"""
    got = list(got)
    return got == list(want) or got == list(want)[::-1]


def _is_mac(block, x, y, acc) -> bool:
    """Is `block` `yield acc + x * y` (x and y each widened by an `arith.extf` when
    narrow, as `irbuild.mac` builds it: both, or one in a mixed matmul), and nothing
    else? Read from the op kinds and how they are wired: the yield's first value is an
    addf of `acc` and a mulf, whose operands are x and y, or their extf's. IEEE add and
    mul commute exactly, so either operand order is the same sum."""
    ops = list(block.operations)
    yielded = list(ops[-1].operands)
    add = _defining(yielded[0], arith.AddFOp) if yielded else None
    if add is None or acc not in (add.lhs, add.rhs):
        return False
    mul = _defining(add.rhs if add.lhs == acc else add.lhs, arith.MulFOp)
    if mul is None or not _same_pair([add.lhs, add.rhs], [acc, mul.result]):
        return False
    factors, extfs = [], 0
    for v in (mul.lhs, mul.rhs):
        ext = _defining(v, arith.ExtFOp)
        factors.append(ext.in_ if ext is not None else v)
        extfs += ext is not None
    return _same_pair(factors, [x, y]) and len(ops) == 3 + extfs  # the extf's, mulf, addf, yield


def matmul_form(op) -> str | None:
    """"plain" for a linalg.generic that is a matmul as `lower` emits it, recognised
    from its structure (ins (b..., i, k) and (b..., k, j), out (b..., i, j), iterators
    (parallel..., parallel, reduction, parallel), a body that is `acc + x * y` by op
    kinds and wiring, `_is_mac`), on tensors or memrefs;
    "broadcast" for the same with broadcast batch dims (`lower.broadcast_matmul_maps`:
    an operand's batch dims each read a batch index or 0, `batch_indices`);
    "fused" for a plain one with a second out (b..., k, j) that receives y, as
    fuse-concat-matmul makes it; None for anything else."""
    if not isinstance(op.opview, linalg.GenericOp):
        return None
    ins, outs = list(op.opview.inputs), list(op.opview.outputs)
    if len(ins) != 2 or len(outs) not in (1, 2):
        return None
    rank = outs[0].type.rank
    if rank < 2:
        return None
    maps, iterators = matmul_maps(rank)
    if iterators_of(op) != iterators:
        return None
    got = maps_of(op)
    broadcast = len(outs) == 1 and got != maps[:3] and got[2] == maps[2] and \
        batch_indices(got[0], rank - 2, "lhs") is not None and batch_indices(got[1], rank - 2, "rhs") is not None
    if got != maps[:2 + len(outs)] and not broadcast:
        return None
    block = op.regions[0].blocks[0]
    x, y, acc = list(block.arguments)[:3]
    if not _is_mac(block, x, y, acc):
        return None
    yielded = list(list(block.operations)[-1].operands)
    if len(outs) == 1:
        return ("broadcast" if broadcast else "plain") if len(yielded) == 1 else None
    return "fused" if yielded[1:] == [y] else None


def batch_indices(m: ir.AffineMap, nb: int, side: str) -> list[int | None] | None:
    """For the map of a matmul's `side` ("lhs" or "rhs") over (b_0, ..., b_{nb-1}, i, k, j):
    the batch loop that indexes each of its batch dims, None where it reads index 0 (a
    broadcast dim of size 1); None unless its last two results are (i, k) or (k, j)."""
    exprs = [e.maybe_downcast() for e in m.results]
    dims = [e.position if isinstance(e, ir.AffineDimExpr) else None for e in exprs]
    if dims[-2:] != ([nb, nb + 1] if side == "lhs" else [nb + 1, nb + 2]):
        return None
    out = []
    for e, d in zip(exprs[:-2], dims):
        if d is not None and d < nb:
            out.append(d)
        elif isinstance(e, ir.AffineConstantExpr) and e.value == 0:
            out.append(None)
        else:
            return None
    return out


def unit_innermost(t: ir.Type) -> bool:
    """Is `t` a ranked memref with a strided layout whose innermost stride is 1?"""
    if not isinstance(t, ir.MemRefType) or t.rank == 0:
        return False
    try:
        return t.get_strides_and_offset()[0][-1] == 1
    except RuntimeError:  # a layout that is not strided
        return False


# a unit attribute on a matmul generic: read its rhs rows one at a time (the rows are back to back),
# so matmul-loops builds only that loop for it (split-k marks its chunks' matmuls so)
ONE_ROW_AT_A_TIME = "kina.one_row_at_a_time"

# ops whose result views its first operand's memory (no copy, no effect of their own)
VIEWS = frozenset({"memref.subview", "memref.expand_shape", "memref.collapse_shape", "memref.cast",
                   "memref.reinterpret_cast", "memref.transpose"})


def buffer_root(v: ir.Value) -> ir.Value:
    """The buffer `v` views: a parameter or a temporary, through subviews, reshapes, casts
    and transposes."""
    while isinstance(v, ir.OpResult) and v.owner.name in VIEWS:
        v = v.owner.operands[0]
    return v


def transposed_view(m: ir.Value, perm: list[int]) -> ir.Value:
    """`m` with its dims permuted (dim a of the view is dim perm[a] of `m`): a
    memref.transpose, whose strided layout is `m`'s strides permuted."""
    t = ir.MemRefType(m.type)
    strides, offset = t.get_strides_and_offset()
    view = ir.MemRefType.get([t.shape[p] for p in perm], t.element_type,
                             ir.StridedLayoutAttr.get(offset, [strides[p] for p in perm]), t.memory_space)
    return memref.TransposeOp(view, m, ir.AffineMapAttr.get(ir.AffineMap.get_permutation(perm))).result


def stride_of(t: ir.Type, a: int) -> int | None:
    """The static stride of dim `a` of memref `t` (None when it is dynamic or the layout is not strided)."""
    if not isinstance(t, ir.MemRefType) or t.rank == 0:
        return None
    try:
        stride = t.get_strides_and_offset()[0][a]
    except RuntimeError:  # a layout that is not strided
        return None
    return None if stride == ir.ShapedType.get_dynamic_stride_or_offset() else stride


def functions(module_op) -> list:
    """The func.func ops at the top of `module_op`."""
    return [op for op in module_op.regions[0].blocks[0].operations if isinstance(op, func.FuncOp)]


# -- loops -------------------------------------------------------------------------

def same_memory(a: ir.Value, b: ir.Value) -> ir.Value:
    """An i1, true at run time when memrefs `a` and `b` (of one element type and rank) are
    views of the same memory: the same address of their first element and the same
    strides (so the same elements, their sizes being equal). A caller's buffers may be
    such views: a cache's filled part passed both as the past and as its own prefix."""
    bytes_ = ir.MemRefType(a.type).element_type.width // 8
    (ma, pa), (mb, pb) = ((memref.ExtractStridedMetadataOp(m), memref.ExtractAlignedPointerAsIndexOp(m).result)
                          for m in (a, b))
    first = [arith.AddIOp(p, arith.MulIOp(m.offset, index(bytes_)).result).result for m, p in ((ma, pa), (mb, pb))]
    same = arith.CmpIOp(arith.CmpIPredicate.eq, *first).result
    for sa, sb in zip(ma.strides, mb.strides):
        same = arith.AndIOp(same, arith.CmpIOp(arith.CmpIPredicate.eq, sa, sb).result).result
    return same


def dim(m: ir.Value, a: int) -> ir.Value:
    """Dim `a` of memref `m` as an index value (a constant when static)."""
    n = ir.MemRefType(m.type).shape[a]
    return index(n) if n != DYN else memref.DimOp(m, index(a)).result


def loop(lo, hi, step, body, carried=()) -> list:
    """scf.for from lo to hi by step; `body(iv, *carried)` returns the next carried values
    (None when nothing is carried). Returns the final carried values."""
    op = scf.ForOp(lo, hi, step, list(carried))
    with ir.InsertionPoint(op.body):
        scf.YieldOp(body(op.induction_variable, *op.inner_iter_args) or [])
    return list(op.results)


def nest(sizes, body, outer=()) -> None:
    """Loops over every index of `sizes`, outermost first, calling `body(indices)` inside."""
    if len(outer) == len(sizes):
        body(list(outer))
    else:
        loop(index(0), sizes[len(outer)], index(1), lambda iv: nest(sizes, body, (*outer, iv)))


def clone_body(block, mapping: dict) -> list[ir.Value]:
    """Clone a linalg body's ops (all but its yield) at the insertion point, with each
    block argument replaced as `mapping` says; returns the values its yield gives."""
    mapping = dict(mapping)
    ops = list(block.operations)
    for inner in ops[:-1]:
        clone = inner.clone()
        for i, v in enumerate(clone.operands):
            clone.operands[i] = mapping.get(v, v)
        mapping.update(zip(inner.results, clone.results))
    return [mapping.get(v, v) for v in ops[-1].operands]
