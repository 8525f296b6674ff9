"""Helpers shared by Kina's passes: walking and rewriting ops, recognising the
linalg forms `kina.ir.lower` emits, and building loops. No pass logic lives here."""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, scf

from ..irbuild import DYN, index, matmul_maps


def rewrite_each(module_op, match, rewrite) -> int:
    """For every op under `module_op` that `match(op)` gives a truthy answer, build
    `rewrite(op, answer)` in its place (at its location), then erase the op.
    Returns how many were rewritten."""
    found = []

    def visit(op):
        answer = match(op)
        if answer:
            found.append((op, answer))
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    for op, answer in found:
        with ir.InsertionPoint(op), op.location:
            rewrite(op, answer)
        op.erase()
    return len(found)


def maps_of(op) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]


def iterators_of(op) -> list[str]:
    """A linalg.generic's iterator types as "parallel" / "reduction"."""
    return [str(a).removeprefix("#linalg.iterator_type<").removesuffix(">") for a in op.attributes["iterator_types"]]


def _is_mac(block, x, y, acc) -> bool:
    """Is `block`'s body `yield acc + x * y` as `irbuild.mac` builds it (x, y extended when narrow)?"""
    body = list(block.operations)
    names = [o.name for o in body]
    if names == ["arith.extf", "arith.extf", "arith.mulf", "arith.addf", "linalg.yield"]:
        ex, ey, mul, add = body[:4]
        if list(ex.operands) != [x] or list(ey.operands) != [y]:
            return False
        x, y, body = ex.result, ey.result, body[2:]
    elif names != ["arith.mulf", "arith.addf", "linalg.yield"]:
        return False
    mul, add = body[0], body[1]
    return list(mul.operands) == [x, y] and list(add.operands) == [acc, mul.result] and \
        list(body[2].operands)[0] == add.result


def matmul_form(op) -> str | None:
    """"plain" for a linalg.generic exactly as `lower` emits a matmul (ins (b..., i, k)
    and (b..., k, j), out (b..., i, j), body `irbuild.mac`), on tensors or memrefs;
    "broadcast" for the same with broadcast batch dims (`lower.broadcast_matmul_maps`:
    an operand's batch dims each read a batch index or 0, `batch_indices`);
    "fused" for a plain one with a second out (b..., k, j) that receives y, as
    fuse-concat-matmul makes it; None for anything else."""
    if op.name != "linalg.generic":
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


def functions(module_op) -> list:
    """The func.func ops at the top of `module_op`."""
    return [op for op in module_op.regions[0].blocks[0].operations if op.operation.name == "func.func"]


# -- loops -------------------------------------------------------------------------

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
