"""copies-to-linalg: after bufferization, every `memref.copy` becomes a `linalg.copy`.

    memref.copy %src, %dst : memref<2x3xf32, strided<[?, 1], offset: ?>> to memref<...>
becomes
    linalg.copy ins(%src : memref<...>) outs(%dst : memref<...>)

A copy into a strided subview (what concat's insert_slice becomes) would
otherwise lower to a call to `memrefCopy` from MLIR's C runner library, which the
.so does not link; as a linalg op it lowers to plain loops that LLVM vectorises.
A copy of a buffer onto itself (left by bufferize where a result was computed in
place) is erased.

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
from ._util import apply_patterns


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
    if src != dst:
        with rewriter.ip, op.location:
            linalg.copy(src, outs=[dst])
    rewriter.erase_op(op.operation)
