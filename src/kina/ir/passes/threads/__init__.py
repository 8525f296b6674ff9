"""threads: give each exported function a threaded entry that every thread of a call runs.

    func.func @kina_f(%x: memref<1x1x576xf32, ...>, %w: memref<576x1536xf32, ...>,
                      %out0: memref<1x1x1536xf32, ...>) {
      %t = memref.alloc() : memref<1x1x576xf32>
      linalg.generic ... ins(%x) outs(%t)                    // small: 4.5 KiB
      linalg.fill ins(%zero) outs(%out0)
      linalg.generic {matmul} ins(%t, %w) outs(%out0)        // 3.5 MiB
    }
gains, beside it (the original is kept as it is; with copy=false it becomes a call of
the entry on one thread, shown below),
    func.func @kina_f_threaded(%x, %w, %out0, %tid: index, %nthreads: index, %ws: memref<?xi8>) {
      %t = memref.view %ws[%c256][] : memref<?xi8> to memref<1x1x576xf32>
      scf.if (call @kina_claim(task 0, 1, %tid, %nthreads) == 0) {   // one part: whoever claims it
        linalg.generic ... ins(%x) outs(%t)
        call @kina_done(task 0)
      }
      call @kina_wait(task 0, 1)                             // %t is read next
      %parts = min(96 lines of 64 bytes, 3.5 MiB / min-bytes, 2 * %nthreads)
      scf.while (%c = call @kina_claim(task 1, %parts, %tid, %nthreads)) < %parts {  // until none is left
        %lo, %hi = part %c's columns: whole 64-byte lines
        linalg.fill ins(%zero) outs(subview %out0[0, 0, %lo] [1, 1, %hi - %lo])
        linalg.generic {matmul} ins(%t, subview %w[0, %lo] [576, %hi - %lo])
                                outs(subview %out0[0, 0, %lo] [1, 1, %hi - %lo])
        call @kina_done(task 1)
      }
    }
    func.func @kina_f_workspace(%x, %w, %out0) -> index    // bytes %ws needs: 256 + 2304

(`%tid` is the thread's number, 0 for the caller: it claims the parts of its own range
first.) With copy=false the original is
    func.func @kina_f(%x, %w, %out0) {
      %ws = memref.alloc(call @kina_f_workspace(%x, %w, %out0)) : memref<?xi8>
      linalg.fill ins(%c0_i8) outs(view %ws[0][] : memref<256xi8>)   // the two tasks' counters
      call @kina_f_threaded(%x, %w, %out0, %c0, %c1, %ws)
    }
so the loops are compiled once, not twice: a SmolLM-size storylm.kina builds in 8.4 s
rather than 15.4 s. One thread then runs the parts' loops, which read a weight's rows
in strided pieces, not the whole op's, which reads them back to back: a decode step
takes 7% longer and a prefill of 32 tokens 30% (docs/performance.md, "Compile time").

The function's ops that touch memory become tasks, in order (plan.py: which ops are
split, along which loop, into which parts; schedule.py: the tasks, and which ones share
their parts; emit.py: the entry's loops and its workspace). Any thread may run any part
of a task; a task that reads what an earlier one wrote first waits for its parts.

A function none of whose ops is worth splitting gets no threaded entry (it would only
run on one thread, at the cost of its code).

Guarantees: each output element is computed by exactly one part, by the same op over
the same reduction range as the original, so any thread count (and the original
function) gives the same bits. A function this pass cannot take (an allocation inside a
region, an op with memory effects that has results, a size it cannot compute from the
arguments, a name taken) gets no threaded entry; the runtime then calls the original on
one thread.

In:  after bufferization and copies-to-linalg, before the loop passes (matmul-loops,
sum-loops), which then lower the split ops on their subviews.
Out: the same module, plus `<f>_threaded`, `<f>_workspace` and `<f>_counters` per function and the
declarations of `kina_claim`, `kina_done` and `kina_wait` (with copy=false, each
function that got an entry is a call of it on one thread). After to-llvm, team-entries
gives each entry a form that takes its descriptor pointers as one array, the one the
runtime's team of threads calls.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, func, linalg, memref

from ....abi import CLAIM, COUNTERS, DONE, THREADED, WAIT, WORKSPACE
from ...irbuild import DYN, index
from .._pass import KinaPass, option
from .._util import functions
from .emit import add_counter_bytes, add_workspace_sizing, index_type, rewrite
from .plan import ALIGN_BYTES, Skip, identity, op_kind

_ADDED = (THREADED, WORKSPACE, COUNTERS)  # the functions this pass adds beside each one


def _positive(n: int) -> bool:
    return n >= 1


@dataclass(frozen=True)
class Threads(KinaPass):
    name = "threads"
    summary = ("a threaded entry per function: each op's output range in parts that threads claim, waits only "
               "on the tasks read, temporaries in one shared workspace; the same bits for any thread count")
    optimisation = True
    min_bytes: int = option(65536, "bytes an op must move per part to be split (smaller ones are one part)",
                            check=_positive, expected="an integer >= 1")
    parts: int = option(4, "the most parts an op is cut into along a static loop (equal ones where its size "
                        "allows), when it moves enough even at symbolic sizes of 1 (a build for this machine: "
                        "one per core, at least 2)",
                        check=_positive, expected="an integer >= 1")
    symbolic: bool = option(True, "split ops with symbolic sizes too (in up to 2 parts per thread, sized at run time)")
    fuse: bool = option(True, "run consecutive ops split the same way, each part reading only what the same "
                        "part of the ones before wrote, as one task: one wait for the run, not one per op")
    copy: bool = option(True, "keep the original function's body beside its threaded entry (false: the original "
                        "becomes a call of the entry on one thread: half the code to compile, the same bits, but "
                        "one thread runs the parts' loops, slower than the whole op's)")

    def run(self, module_op) -> None:
        body = module_op.regions[0].blocks[0]
        names = {ir.StringAttr(f.sym_name).value for f in functions(module_op)}
        made = False
        for fn in functions(module_op):
            name = ir.StringAttr(fn.sym_name).value
            if "llvm.emit_c_interface" not in fn.attributes or fn.is_external:
                continue
            if any(f"{name}{s}" in names for s in _ADDED) or name.endswith(_ADDED):
                continue
            made |= _thread(fn, name, self)
        if made:
            with ir.InsertionPoint.at_block_begin(body), ir.Location.unknown():
                for callee, params, results in ((CLAIM, 4, 1), (DONE, 1, 0), (WAIT, 2, 0)):
                    if callee not in names:
                        decl = func.FuncOp(callee, ([index_type()] * params, [index_type()] * results))
                        decl.attributes["sym_visibility"] = ir.StringAttr.get("private")


def _thread(fn, name: str, opts: "Threads") -> bool:
    """Add `<name>_threaded`, `<name>_workspace` and `<name>_counters` beside `fn`; False if it cannot be taken."""
    block = fn.regions[0].blocks[0]
    if len(fn.regions[0].blocks) != 1:
        return False
    for op in block.operations:
        if op_kind(op) == "other" and len(op.results):
            return False
        if op_kind(op) == "alloc" and not identity(ir.MemRefType(op.results[0].type)):
            return False
    n_args = len(block.arguments)
    clone = fn.operation.clone(ip=ir.InsertionPoint(fn.operation))
    clone.move_after(fn.operation)
    try:
        with fn.location:
            total, counters = rewrite(clone.opview, name + THREADED, opts)
            add_workspace_sizing(clone.opview, total, n_args, name + WORKSPACE)
            add_counter_bytes(clone.opview, counters, name + COUNTERS)
    except Skip:
        clone.erase()
        return False
    if not opts.copy and not ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value).results:
        _one_thread(fn, name, counters)
    return True


def _one_thread(fn, name: str, counters: int) -> None:
    """Replace `fn`'s body by a call of its threaded entry on one thread, with a workspace
    of its own whose task counters start at zero (the temporaries need no zeroing: each
    is written before it is read, as a fresh allocation would be)."""
    block = fn.regions[0].blocks[0]
    for op in reversed(list(block.operations)):
        op.erase()
    args = list(block.arguments)
    i8 = ir.IntegerType.get_signless(8)
    with ir.InsertionPoint(block), fn.location:
        nbytes = func.call([index_type()], ir.FlatSymbolRefAttr.get(name + WORKSPACE), args)
        ws = memref.alloc(ir.MemRefType.get([DYN], i8), [nbytes], [], alignment=ir.IntegerAttr.get(
            ir.IntegerType.get_signless(64), ALIGN_BYTES))
        head = memref.view(ir.MemRefType.get([counters], i8), ws, index(0), [])
        linalg.fill(arith.constant(i8, 0), outs=[head])
        func.call([], ir.FlatSymbolRefAttr.get(name + THREADED), [*args, index(0), index(1), ws])
        func.ReturnOp([])
