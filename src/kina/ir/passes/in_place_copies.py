"""in-place-copies: a copy between two parameters runs only where their memory differs at run time.

    linalg.copy ins(%k_past : memref<1x3x64x?xf32, ...>) outs(%prefix : memref<1x3x64x?xf32, ...>)
becomes (%prefix a view of the out-buffer %out0, %k_past a parameter)
    %same = <%k_past and %prefix: the same first element and the same strides>
    %differ = arith.xori %same, %true : i1
    scf.if %differ {
      linalg.copy ins(%k_past : ...) outs(%prefix : ...)
    }

A concat's prefix is a copy of its first operand into the result's out-buffer. A caller
may pass the same memory as both (kina.models' StoryCache: the filled part of a cache as
the past, the same buffer one position longer as the result, an append in place); the
copy would then rewrite the whole cache onto itself at every step (a grouped-query
layer's Kᵀ and V, whose matmuls are not fused with their concats). It runs after
threads, so each part of a split copy is checked on its own. Copies from or into a
temporary are left as they are: the function's own buffers never alias a parameter.

In:  after bufferization, copies-to-linalg and threads (linalg.copy on memrefs).
Out: the same module, each copy between two parameters' views under its run-time check.

Guarantees: the same results: a copy skipped is one of memory onto itself. Memories
that differ, or that overlap other than exactly, are copied as before.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, scf

from ._pass import KinaPass
from ._util import buffer_root, functions, same_memory


@dataclass(frozen=True)
class InPlaceCopies(KinaPass):
    name = "in-place-copies"
    summary = ("a copy between two parameters' views (a concat's prefix) runs only where they are not the same "
               "memory at run time (a cache appended in place)")
    optimisation = True

    def run(self, module_op) -> None:
        for fn in functions(module_op):
            if not len(fn.regions[0].blocks):  # a declaration (kina_claim, ...)
                continue
            params = list(fn.regions[0].blocks[0].arguments)
            copies = []

            def visit(op):
                if op.name == "linalg.copy" and _between_parameters(op, params):
                    copies.append(op)
                return ir.WalkResult.ADVANCE
            fn.operation.walk(visit)
            for op in copies:
                _guard(op)


def _between_parameters(op, params: list) -> bool:
    src, dst = op.operands[0], op.operands[1]
    if not all(isinstance(v.type, ir.MemRefType) for v in (src, dst)):
        return False
    a, b = ir.MemRefType(src.type), ir.MemRefType(dst.type)
    if a.element_type != b.element_type or a.rank != b.rank:
        return False
    return all(any(buffer_root(v) == p for p in params) for v in (src, dst))


def _guard(op) -> None:
    with ir.InsertionPoint(op), op.location:
        same = same_memory(op.operands[0], op.operands[1])
        differ = arith.XOrIOp(same, arith.ConstantOp(ir.IntegerType.get_signless(1), 1).result).result
        branch = scf.IfOp(differ)
        with ir.InsertionPoint(branch.then_block):
            end = scf.YieldOp([])
    op.move_before(end)
