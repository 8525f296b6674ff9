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
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import llvm

from ._util import functions


def run(module_op) -> None:
    for fn in functions(module_op):
        nontemporal, returns = [], []

        def visit(op):
            if op.name in ("vector.store", "memref.store") and "nontemporal" in op.attributes and \
                    ir.BoolAttr(op.attributes["nontemporal"]).value:
                nontemporal.append(op)
            elif op.name == "func.return":
                returns.append(op)
            return ir.WalkResult.ADVANCE

        fn.operation.walk(visit)
        for ret in returns if nontemporal else []:
            with ir.InsertionPoint(ret), ret.location:
                llvm.FenceOp(llvm.AtomicOrdering.seq_cst)
