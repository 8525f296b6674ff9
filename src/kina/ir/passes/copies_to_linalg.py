"""copies-to-linalg: after bufferization, every `memref.copy` becomes a `linalg.copy`.

    memref.copy %src, %dst : memref<2x3xf32, strided<[?, 1], offset: ?>> to memref<...>
becomes
    linalg.copy ins(%src : memref<...>) outs(%dst : memref<...>)

A copy into a strided subview (what concat's insert_slice becomes) would
otherwise lower to a call to `memrefCopy` from MLIR's C runner library, which the
.so does not link; as a linalg op it lowers to plain loops that LLVM vectorises.
A copy of a buffer onto itself (left by bufferize where a result was computed in
place) is erased, and so is a copy between two views that are the same one made
twice (the same view ops, attributes and operands, from the same buffer):

    %a = memref.subview %out0[0, 0] [8, %S] [1, 1] : ...
    %b = memref.subview %out0[0, 0] [8, %S] [1, 1] : ...
    memref.copy %a, %b                                 // erased: a concat's prefix,
                                                       // already where it goes

In:  any module; after bufferization, when copies are on memrefs.
Out: the same module without `memref.copy`.

Guarantees: the .so needs only libc and libm; the copied values are unchanged.
A copy of an unranked memref cannot be taken (`Unsupported`).
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import linalg, memref

from ._pass import KinaPass, Unsupported
from ._util import VIEWS, apply_patterns


@dataclass(frozen=True)
class CopiesToLinalg(KinaPass):
    name = "copies-to-linalg"
    summary = "memref.copy to linalg.copy (loops, not calls to the memrefCopy runtime); self-copies erased"

    def run(self, module_op) -> None:
        apply_patterns(module_op, {memref.CopyOp: _copy})


def _copy(op, rewriter):
    src, dst = op.operands
    for v in (src, dst):
        if not isinstance(v.type, ir.MemRefType):
            raise Unsupported(op, f"cannot take a copy of '{v.type}': linalg.copy needs ranked memrefs")
    if not same_view(src, dst):
        with rewriter.ip, op.location:
            linalg.copy(src, outs=[dst])
    rewriter.erase_op(op.operation)


def same_view(a: ir.Value, b: ir.Value) -> bool:
    """Whether `a` and `b` are the same memory by construction: one value, or the same
    result of two view ops of one kind with equal attributes whose operands are, in
    turn, the same (index operands: one value, or constants of one value)."""
    if a == b:
        return True
    if not (isinstance(a, ir.OpResult) and isinstance(b, ir.OpResult)) or a.result_number != b.result_number:
        return False
    x, y = a.owner, b.owner
    if x.name != y.name or x.name not in VIEWS | {"arith.constant"} or len(x.operands) != len(y.operands):
        return False
    attrs = lambda op: sorted((name, str(op.attributes[name])) for name in op.attributes)
    return attrs(x) == attrs(y) and str(a.type) == str(b.type) and \
        all(same_view(u, v) for u, v in zip(x.operands, y.operands))
