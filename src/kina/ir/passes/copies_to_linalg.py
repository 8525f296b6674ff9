"""copies-to-linalg: after bufferization, every `memref.copy` becomes a `linalg.copy`.

    memref.copy %src, %dst : memref<2x3xf32, strided<[?, 1], offset: ?>> to memref<...>
becomes
    linalg.copy ins(%src : memref<...>) outs(%dst : memref<...>)

A copy into a strided subview (what concat's insert_slice becomes) would
otherwise lower to a call to `memrefCopy` from MLIR's C runner library, which the
.so does not link; as a linalg op it lowers to plain loops that LLVM vectorises.
A copy of a buffer onto itself (left by bufferize where a result was computed in
place) is erased.

Guarantees: the .so needs only libc and libm; the copied values are unchanged.
"""
from __future__ import annotations

from mlir.dialects import linalg

from ._util import rewrite_each


def run(module_op) -> None:
    def copy(op, _):
        src, dst = op.operands
        if src != dst:
            linalg.copy(src, outs=[dst])
    rewrite_each(module_op, lambda op: op.name == "memref.copy", copy)
