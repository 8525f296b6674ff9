"""fence-nontemporal: a fence before each return of a function that makes non-temporal stores.

    vector.store %v, %slot[%i, %j] {nontemporal = true} : ...
    return
becomes
    vector.store %v, %slot[%i, %j] {nontemporal = true} : ...
    llvm.fence seq_cst
    return

Non-temporal stores are weakly ordered; the fence makes them visible, like any
other store, to whoever reads the results once the call has returned. It runs
after deallocate, whose analysis rejects the fence op. A function without
non-temporal stores is left as it is.

In:  any module (a function-wide question, so a walk per function, not a pattern).
Out: the same module, with the fences.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import llvm

from ._pass import KinaPass
from ._util import functions


@dataclass(frozen=True)
class FenceNontemporal(KinaPass):
    name = "fence-nontemporal"
    summary = "a fence before each return of a function that makes non-temporal stores"

    def run(self, module_op) -> None:
        for fn in functions(module_op):
            _fence(fn)


def _fence(fn) -> None:
    nontemporal, returns = [], []

    def visit(op):
        if op.name in ("vector.store", "memref.store") and "nontemporal" in op.attributes and \
                isinstance(op.attributes["nontemporal"], ir.BoolAttr) and op.attributes["nontemporal"].value:
            nontemporal.append(op)
        elif op.name == "func.return":
            returns.append(op)
        return ir.WalkResult.ADVANCE

    fn.operation.walk(visit)
    for ret in returns if nontemporal else []:
        with ir.InsertionPoint(ret), ret.location:
            llvm.FenceOp(llvm.AtomicOrdering.seq_cst)
