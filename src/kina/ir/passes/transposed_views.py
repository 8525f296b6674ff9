"""transposed-views: a matmul reads a transposed operand through a view, not a copy.

    %t = memref.alloc(%P) : memref<576x?xf32>
    linalg.transpose ins(%x : memref<?x576xf32, strided<[?, 1], offset: ?>>) outs(%t) permutation = [1, 0]
    linalg.generic {matmul} ins(%w, %t : memref<1536x576xf32, ...>, memref<576x?xf32>) outs(%acc)
becomes
    %t = memref.transpose %x (d0, d1) -> (d1, d0)
        : memref<?x576xf32, strided<[?, 1], offset: ?>> to memref<576x?xf32, strided<[1, ?], offset: ?>>
    linalg.generic {matmul} ins(%w, %t : ..., memref<576x?xf32, strided<[1, ?], offset: ?>>) outs(%acc)

`transpose(w @ transpose(x))` is how a program multiplies by a weight stored [out, in]
(as Hugging Face and llama.cpp store it): w[N, K] @ xᵀ[K, P]. Bufferized, the inner
transpose is a copy of x into a new buffer, and the matmul then reads an rhs that runs
along its columns, which matmul-loops takes as a plain matmul of P columns. Read
through a view, the rhs runs along k, as w's rows do, and matmul-loops takes the
transposed form: dot products of rows, each 16x16 square of w transposed once in
registers for a block of x's rows (scripts/bench_matmul.py has the figures).

A `linalg.transpose` into a temporary is replaced when every other use of that
temporary, after it in the same block, is an input of a matmul, and nothing between
the transpose and the last of them may write the buffer it reads: the matmuls then
read the same values. The temporary is then unused and erased.

In:  after bufferization and copies-to-linalg (transposes on memrefs), before threads.
Out: the same module with such transposes gone.

Guarantees: the matmuls read the same values in the same order of sums: the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import linalg

from ._pass import KinaPass
from ._util import NO_MATCH, VIEWS, apply_patterns, buffer_root, matmul_form, transposed_view

# ops that read or view memory but write none
_READERS = VIEWS | {"memref.dim", "memref.load", "memref.extract_aligned_pointer_as_index",
                    "memref.extract_strided_metadata"}


@dataclass(frozen=True)
class TransposedViews(KinaPass):
    name = "transposed-views"
    summary = "a transposed copy that only matmuls read becomes a memref.transpose view (the matmul's transposed form)"
    optimisation = True

    def run(self, module_op) -> None:
        apply_patterns(module_op, {linalg.TransposeOp: _transpose})


def _may_write(op, root: ir.Value) -> bool:
    """Might `op` write the buffer `root` (through any view of it)?"""
    if op.name in _READERS or op.name.startswith(("arith.", "index.", "math.")):
        return False
    outputs = getattr(op.opview, "outputs", None) if op.name.startswith("linalg.") else None
    if outputs is not None:  # a structured op writes its outputs only
        return any(buffer_root(v) == root for v in outputs)
    return any(isinstance(v.type, ir.MemRefType) and buffer_root(v) == root for v in op.operands) or bool(op.regions)


def _transpose(op, rewriter):
    src, dst = op.operands[0], op.operands[1]
    if not (isinstance(src.type, ir.MemRefType) and isinstance(dst, ir.OpResult) and dst.owner.name == "memref.alloc"):
        return NO_MATCH
    block = op.operation.block
    ops = list(block.operations)
    at = next(i for i, o in enumerate(ops) if o.operation == op.operation)
    readers = [u.owner.operation for u in dst.uses if u.owner.operation != op.operation]
    if not readers:
        return NO_MATCH
    last = at
    for r in readers:
        pos = next((i for i, o in enumerate(ops) if o.operation == r), None)
        if pos is None or pos < at or matmul_form(r) is None or any(v == dst for v in r.opview.outputs):
            return NO_MATCH
        last = max(last, pos)
    root = buffer_root(src)
    if any(_may_write(o.operation, root) for o in ops[at + 1:last]):
        return NO_MATCH
    perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
    with rewriter.ip, op.location:
        view = transposed_view(src, perm)
    dst.replace_all_uses_except(view, op.operation)
    rewriter.erase_op(op.operation)
    rewriter.erase_op(dst.owner.operation)
