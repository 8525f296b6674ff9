"""team-entries: beside each function's C interface, forms that take its arguments as one array.

    llvm.func @_mlir_ciface_kina_f(%x: !llvm.ptr, %w: !llvm.ptr, %out0: !llvm.ptr)
    llvm.func @_mlir_ciface_kina_f_threaded(%x: !llvm.ptr, %w: !llvm.ptr, %out0: !llvm.ptr,
                                            %tid: i64, %n: i64, %ws: !llvm.ptr)
gain
    llvm.func @kina_f_packed(%args: !llvm.ptr) {
      %0 = llvm.load %args : !llvm.ptr -> !llvm.ptr                      // &x's descriptor
      %1 = llvm.getelementptr %args[1] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
      %2 = llvm.load %1 : !llvm.ptr -> !llvm.ptr                         // &w's
      %3 = llvm.getelementptr %args[2] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
      %4 = llvm.load %3 : !llvm.ptr -> !llvm.ptr                         // &out0's
      llvm.call @_mlir_ciface_kina_f(%0, %2, %4) : (...) -> ()
      llvm.return
    }
    llvm.func @kina_f_team(%args: !llvm.ptr, %tid: i64, %n: i64, %ws: !llvm.ptr) {
      ... the same loads ...
      llvm.call @_mlir_ciface_kina_f_threaded(%0, %2, %4, %tid, %n, %ws) : (...) -> ()
      llvm.return
    }

The C interfaces take a pointer to each argument's memref descriptor, so their arity
is the function's. C code that runs whichever function it is handed calls every one
alike through these forms, with `args` the caller's array of the descriptor pointers,
in the function's order: a thread of the runtime's team (kina_threads.c's
kina_team_work) calls `kina_<f>_team(args, tid, n, ws)`, and a run of prepared calls
in one host entry (kina_run_sequence) calls `kina_<f>_packed(args)` on one thread.

In:  the LLVM dialect (after to-llvm): each function's `_mlir_ciface_kina_<f>` (no
     results, descriptor pointers only) and the threads pass's
     `_mlir_ciface_kina_<f>_threaded` (those, then tid, n and the workspace's).
Out: the same module, plus `kina_<f>_packed` and `kina_<f>_team` for those; a function
     whose form exists already, or whose parameters are not these, is left as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import llvm

from ...abi import PACKED, TEAM, THREADED, c_interface, exported
from ._pass import KinaPass

PREFIX = c_interface("")  # the C interfaces of functions and of threaded entries


@dataclass(frozen=True)
class TeamEntries(KinaPass):
    name = "team-entries"
    summary = ("beside each function, kina_<f>_packed(args), and beside each threaded entry, kina_<f>_team(args, "
               "tid, n, ws): their descriptor pointers as one array")

    def run(self, module_op) -> None:
        body = module_op.regions[0].blocks[0]
        names = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in body.operations
                 if op.operation.name == "llvm.func"}
        for name, entry in names.items():
            if not name.startswith(PREFIX) or not entry.regions[0].blocks:
                continue
            f = name[len(PREFIX):]
            if f.endswith(THREADED):
                form, extra = exported(f.removesuffix(THREADED), TEAM), ["i64", "i64", "ptr"]  # tid, n, the workspace
            else:
                form, extra = exported(f, PACKED), []
            if form not in names:
                _array_form(entry, form, extra)


def _array_form(entry, name: str, extra: list[str]) -> None:
    """`name`(args, *extra) beside `entry`, calling it with the descriptor pointers in `args`
    and its own trailing parameters; nothing if entry's parameters are not descriptor
    pointers followed by `extra`, or it has a result."""
    params = [a.type for a in entry.regions[0].blocks[0].arguments]
    ptr = llvm.PointerType.get()
    wanted = [ir.Type.parse(f"!llvm.{t}" if t == "ptr" else t) for t in extra]
    n = len(params) - len(extra)
    fn_type = ir.TypeAttr(entry.attributes["function_type"]).value
    if n < 0 or params[n:] != wanted or any(p != ptr for p in params[:n]) or not str(fn_type).startswith("!llvm.func<void "):
        return
    with ir.InsertionPoint(entry.operation), entry.location:
        form = llvm.LLVMFuncOp(name, ir.TypeAttr.get(ir.Type.parse(f"!llvm.func<void ({', '.join(['ptr', *extra])})>")))
    form.operation.move_after(entry.operation)
    block = form.body.blocks.append(ptr, *wanted, arg_locs=[entry.location] * (1 + len(extra)))
    args, *rest = block.arguments
    with ir.InsertionPoint(block), entry.location:
        pointers = []
        for k in range(n):
            slot = args if k == 0 else llvm.getelementptr(ptr, args, [], [k], ptr, 0)
            pointers.append(llvm.load(ptr, slot))
        llvm.call(None, [*pointers, *rest], [], [],
                  callee=ir.FlatSymbolRefAttr.get(ir.StringAttr(entry.attributes["sym_name"]).value))
        llvm.return_()
