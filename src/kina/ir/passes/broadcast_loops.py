"""broadcast-loops: an elementwise op with an operand constant along the innermost dim
becomes loops that load that operand once per row.

    linalg.generic {(d0, d1) -> (d0, d1), (d0, d1) -> (d0), (d0, d1) -> (d0, d1); parallel, parallel}
        ins(%s, %m : memref<?x?xf32, strided<[?, 1], offset: ?>>, memref<?xf32, strided<[1], offset: ?>>)
        outs(%s : memref<?x?xf32, strided<[?, 1], offset: ?>>)           // exp(s - m)
becomes
    scf.for %i = 0 to %rows {
      %mi = memref.load %m[%i]                                 // once per row
      scf.for %j = 0 to %cols {
        %e = math.exp(memref.load %s[%i, %j] - %mi)
        memref.store %e, %s[%i, %j]
      }
    }

convert-linalg-to-loops would load %m[%i] inside the inner loop. Where %m and %s may
share memory (the threads pass makes every temporary a view of one workspace), LLVM
can then neither hoist that load past the store nor vectorise the inner loop: a
two-thread prefill of 256 tokens ran softmax's exp one scalar at a time, slower than
the one-thread build, whose temporaries are separate allocations. Here the value is
an SSA scalar in the inner loop, which LLVM vectorises.

In:  any module; after bufferization (and the threads pass, whose parts are views).
Out: the same module with each such generic as loops; other generics are left to
convert-linalg-to-loops.

Guarantees: the same body computes each element from the same operands, so the bits
are unchanged, provided no hoisted input shares memory with an output (each row's
value is read before the row is written, as the op's value semantics has it;
bufferization copies such an operand first, so Kina's programs never pass one).
Taken: generics on ranked memrefs (or scalars) with no results, every iterator
parallel, rank 2 or more, identity output maps, every input map's results dims or 0
(broadcast(...) of a dim of size 1), at least one input that does not index the
innermost dim, a body without `linalg.index` or nested regions.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import linalg, memref

from ..irbuild import index
from ._pass import KinaPass
from ._util import NO_MATCH, apply_patterns, clone_body, dim, iterators_of, loop, maps_of, nest

ZERO = -1  # an indexing result that is the constant 0, not a dim


@dataclass(frozen=True)
class BroadcastLoops(KinaPass):
    name = "broadcast-loops"
    summary = "elementwise ops with an operand constant along the innermost dim: loops loading it once per row"
    optimisation = True

    def run(self, module_op) -> None:
        def generic(op, rewriter):
            dims = _dims_of(op)
            if dims is None:
                return NO_MATCH
            with rewriter.ip, op.location:
                _emit(op, dims)
            rewriter.erase_op(op.operation)
        apply_patterns(module_op, {linalg.GenericOp: generic})


def _dims_of(op) -> list[list[int] | None] | None:
    """Each operand's indexing dims (ZERO for a constant 0 result; None for a scalar operand)
    if this pass takes `op`, else None."""
    iterators = iterators_of(op)
    rank = len(iterators)
    if rank < 2 or any(it != "parallel" for it in iterators) or len(op.results):
        return None
    block = op.regions[0].blocks[0]
    if any(o.operation.name == "linalg.index" or len(o.operation.regions) for o in block.operations):
        return None  # the body is cloned op by op: no index, no nested regions
    dims = []
    for v, m in zip(op.operands, maps_of(op)):
        if not isinstance(v.type, ir.MemRefType):
            if isinstance(v.type, ir.ShapedType):
                return None
            dims.append(None)
            continue
        d = []
        for r in (e.maybe_downcast() for e in m.results):  # a dim, or 0 (a dim of size 1 stretched)
            if isinstance(r, ir.AffineDimExpr):
                d.append(r.position)
            elif isinstance(r, ir.AffineConstantExpr) and r.value == 0:
                d.append(ZERO)
            else:
                return None
        dims.append(d)
    n_in = len(op.inputs)
    if any(d != list(range(rank)) for d in dims[n_in:]):
        return None
    if not any(d is None or rank - 1 not in d for d in dims[:n_in]):
        return None
    return dims


def _emit(op, dims: list[list[int] | None]) -> None:
    block = op.regions[0].blocks[0]
    operands, n_in = list(op.operands), len(op.inputs)
    out = operands[n_in]
    rank = len(dims[n_in])
    sizes = [dim(out, a) for a in range(rank)]
    last, zero = rank - 1, index(0)

    def row(outer):
        # operands constant along the innermost dim: loaded once here (scalars as they are)
        fixed = {}
        for i, (v, d) in enumerate(zip(operands[:n_in], dims[:n_in])):
            if d is None:
                fixed[i] = v
            elif last not in d:
                fixed[i] = memref.LoadOp(v, [zero if a == ZERO else outer[a] for a in d]).result

        def element(j):
            at = [*outer, j]
            mapping = {}
            for i, (arg, v, d) in enumerate(zip(block.arguments, operands, dims)):
                if i in fixed:
                    mapping[arg] = fixed[i]
                elif i < n_in or any(True for _ in arg.uses):  # an output's old value only if read
                    mapping[arg] = memref.LoadOp(v, [zero if a == ZERO else at[a] for a in d]).result
            for v, target in zip(clone_body(block, mapping), operands[n_in:]):
                memref.StoreOp(v, target, at)
        loop(index(0), sizes[last], index(1), element)
    nest(sizes[:last], row)
