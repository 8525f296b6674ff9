"""team-entries: beside each threaded entry, one that takes its arguments as one array.

    llvm.func @_mlir_ciface_kina_f_threaded(%x: !llvm.ptr, %w: !llvm.ptr, %out0: !llvm.ptr,
                                            %tid: i64, %n: i64, %ws: !llvm.ptr)
gains
    llvm.func @kina_f_team(%args: !llvm.ptr, %tid: i64, %n: i64, %ws: !llvm.ptr) {
      %0 = llvm.load %args : !llvm.ptr -> !llvm.ptr                      // &x's descriptor
      %1 = llvm.getelementptr %args[1] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
      %2 = llvm.load %1 : !llvm.ptr -> !llvm.ptr                         // &w's
      %3 = llvm.getelementptr %args[2] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
      %4 = llvm.load %3 : !llvm.ptr -> !llvm.ptr                         // &out0's
      llvm.call @_mlir_ciface_kina_f_threaded(%0, %2, %4, %tid, %n, %ws) : (...) -> ()
      llvm.return
    }

The threaded entry (the threads pass) takes a pointer to each argument's memref
descriptor, so its arity is the function's. A thread of the runtime's team
(kina_threads.c's kina_team_work) calls whichever entry it is handed; through
`kina_<f>_team` it calls every one alike, `fn(args, tid, n, ws)`, with `args` the
caller's array of the descriptor pointers, in the entry's order.

In:  the LLVM dialect (after to-llvm): the threads pass's `_mlir_ciface_kina_<f>_threaded`.
Out: the same module, plus `kina_<f>_team` per threaded entry; a module without one is
left as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import llvm

from ._pass import KinaPass

PREFIX, SUFFIX = "_mlir_ciface_", "_threaded"  # the C interface of the threads pass's entries


@dataclass(frozen=True)
class TeamEntries(KinaPass):
    name = "team-entries"
    summary = "beside each threaded entry, kina_<f>_team(args, tid, n, ws): its descriptor pointers as one array"

    def run(self, module_op) -> None:
        body = module_op.regions[0].blocks[0]
        names = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in body.operations
                 if op.operation.name == "llvm.func"}
        for name, entry in names.items():
            if name.startswith(PREFIX) and name.endswith(SUFFIX):
                team = name[len(PREFIX):-len(SUFFIX)] + "_team"
                if team not in names:
                    _team_entry(entry, team)


def _team_entry(entry, name: str) -> None:
    params = [a.type for a in entry.regions[0].blocks[0].arguments]
    ptr, i64 = llvm.PointerType.get(), ir.IntegerType.get_signless(64)
    if params[-3:] != [i64, i64, ptr] or any(p != ptr for p in params[:-3]):
        return  # not the threads pass's entry: descriptor pointers, then tid, n and the workspace's
    with ir.InsertionPoint(entry.operation), entry.location:
        team = llvm.LLVMFuncOp(name, ir.TypeAttr.get(ir.Type.parse("!llvm.func<void (ptr, i64, i64, ptr)>")))
    team.operation.move_after(entry.operation)
    block = team.body.blocks.append(ptr, i64, i64, ptr, arg_locs=[entry.location] * 4)
    args, tid, n, ws = block.arguments
    with ir.InsertionPoint(block), entry.location:
        pointers = []
        for k in range(len(params) - 3):
            slot = args if k == 0 else llvm.getelementptr(ptr, args, [], [k], ptr, 0)
            pointers.append(llvm.load(ptr, slot))
        llvm.call(None, [*pointers, tid, n, ws], [], [],
                  callee=ir.FlatSymbolRefAttr.get(ir.StringAttr(entry.attributes["sym_name"]).value))
        llvm.return_()
