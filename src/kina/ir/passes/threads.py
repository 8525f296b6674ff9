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

The function's ops that touch memory become tasks, in order. A linalg.generic, fill
or copy that moves at least `min-bytes` per part is split along one parallel loop
that indexes every output (of those that give `parts` parts, the one whose parts
re-read the fewest bytes, then not a parameter's symbolic leading dim, which is a batch
and 1 in a decode step, then the outermost; else the longest), with the fill of its output if
one comes just before: a part is a range of that loop (a subview of every operand it
indexes; the others whole, read by every part), so no reduction is ever
split, and a task has at most 2 parts per thread. A run of ops too small to split,
or other structured ops, is one task of one part; an op of unknown effects is one
too, after every task before it and before every task after. Ops without memory
effects (index arithmetic, views) run on every thread. Any thread may run any part:
each claims a part of a task (`kina_claim`, an atomic word in the workspace: the next
of its own contiguous range of parts, then the last still free), runs it, counts it
done (`kina_done`) and claims again until none is left. Before a task that reads a
buffer an earlier task wrote, or writes one it read or wrote, every thread waits until
that task's parts are all done (`kina_wait`).
Nothing waits for a thread to arrive, so a thread the system has not scheduled yet
takes no part and delays no one (kina_threads.c, linked into the .so, has the three
functions). Consecutive split ops cut along loops of the same extent, into the same parts, are one
task (`fuse`) when every buffer one of them writes and another touches is cut along the
same dim of it in both (through subviews from 0, reshapes that keep that dim, casts), or,
cut into as many parts of static widths along loops of different extents, when both cut
every such buffer into the same ranges of its elements: a part then runs each op on its
range in turn, and reads only what the same part of the ops before it wrote. A prefill's RMSNorm (x * x, its mean per row, x times its rsqrt,
times the weight) is then one task cut along the prompt's rows, not four:

      scf.while (%c = call @kina_claim(task 0, ...)) < %parts {   // rows [%lo, %lo + %n)
        linalg.generic ins(subview %x[0, %lo, 0]) outs(subview %sq[0, %lo, 0])      // x * x
        linalg.fill outs(subview %m[0, %lo])
        linalg.generic ins(subview %sq[0, %lo, 0]) outs(subview %m[0, %lo])         // sums
        linalg.generic ins(subview %x[0, %lo, 0], subview %m[0, %lo]) outs(...)     // x * r
        call @kina_done(task 0)
      }

The parts are whole lines of every op's output cut along its innermost dim (the sums
[1, P]: 16 rows), and sized from all the ops' bytes. A StoryLM layer's prefill has 30
tasks so, not 58, and its decode step 19, not 25 (the small shape; SmolLM's: 30, not 58,
and 21, not 27). Ops cut along a parameter's symbolic leading dim (a batch) are not
chained (see _chains). A split op that would join the chain before it but for a run of
small ops between them goes ahead of that run when the run neither writes what it reads
nor touches what it writes: a decode step's q, k and v matmuls (and its gate and up) are
then one task each, their sums added after (two threads: a decode step has 13 tasks, not
19 at the small shape and 21 at SmolLM's; a prefill 27, not 30). A run of small ops that
cannot go after the split op that follows it joins that op's task instead when each op
can be cut into the same number of parts, of static widths, and every buffer one of them
writes and another touches is cut by both into the same ranges of its elements
(_absorb): a decode step's split-k sums of gate and up, their silu and product, in the
columns of h that the down projection's part of chunks reads. Each part then sums its
columns and multiplies its chunks at once, where one thread summed all the columns while
the others waited (SmolLM's F16 step: 12 tasks, 0.1 ms a token less, about 1%).
Buffers are told apart by their root (a parameter, or a temporary,
through views); distinct parameters do not overlap (the runtime's rule).
Temporaries are shared by all threads: each `memref.alloc` becomes a view of the
workspace `%ws` (two counters per task, each on its own cache line, then every
temporary at a 64-byte boundary, none reused; a `memref.dim` of a temporary, or of a
view that holds the size, first becomes that size), whose size `kina_<f>_workspace`
computes from the same arguments; the caller zeroes its counters (`kina_<f>_counters`
bytes, the first ones) before each call and passes it to every thread. The
temporaries need no zeroing: each is written before it is read, as a fresh
allocation is (a SmolLM layer step's workspace is 450 KB, its counters a few KB).

A function none of whose ops is worth splitting gets no threaded entry (it would only
run on one thread, at the cost of its code). Guarantees: each output element is computed by exactly one part, by the same op
over the same reduction range as the original, so any thread count (and the
original function) gives the same bits. A function this pass cannot take (an
allocation inside a region, an op with memory effects that has results, a size it
cannot compute from the arguments, a name taken) gets no threaded entry; the
runtime then calls the original on one thread.

In:  after bufferization and copies-to-linalg, before the loop passes (matmul-loops,
sum-loops), which then lower the split ops on their subviews.
Out: the same module, plus `<f>_threaded`, `<f>_workspace` and `<f>_counters` per function and the
declarations of `kina_claim`, `kina_done` and `kina_wait` (with copy=false, each
function that got an entry is a call of it on one thread). After to-llvm, team-entries
gives each entry a form that takes its descriptor pointers as one array, the one the
runtime's team of threads calls.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from mlir import ir
from mlir.dialects import arith, func, linalg, memref, scf

from ...abi import CLAIM, COUNTERS, DONE, THREADED, WAIT, WORKSPACE
from ..irbuild import DYN, index
from ._pass import KinaPass, option
from ._util import VIEWS, buffer_root, functions, iterators_of, maps_of

ALIGN_BYTES = 64  # each temporary starts on a cache line, as memref.alloc's alignment gave it
SYMBOLIC_EXTENT = 64  # what a symbolic dim counts as when splits are compared (a prompt's length, say)
_ADDED = (THREADED, WORKSPACE, COUNTERS)  # the functions this pass adds beside each one
PARTS_PER_THREAD = 2  # a task is cut in up to this many parts per thread, for whichever threads are running

# ops with no memory effects: every thread runs them (they compute sizes, bounds and views)
_PURE = VIEWS | {"memref.dim", "memref.view", "memref.extract_aligned_pointer_as_index", "memref.extract_strided_metadata",
                 "affine.apply"}
_PURE_DIALECTS = ("arith.", "index.", "math.")


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


class _Skip(Exception):
    """This function gets no threaded entry."""


def index_type():
    return ir.IndexType.get()


def _kind(op) -> str:
    name = op.name
    if name in _PURE or name.startswith(_PURE_DIALECTS) and not op.regions:
        return "pure"
    if name == "func.return":
        return "return"
    if name == "memref.alloc":
        return "alloc"
    if name in ("linalg.generic", "linalg.fill", "linalg.copy"):
        return "split"
    if name.startswith("linalg.") and not any(isinstance(r.type, ir.MemRefType) for r in op.results):
        return "linalg"  # another structured op: thread 0, reading and writing its memref operands
    return "other"


def _thread(fn, name: str, opts: "Threads") -> bool:
    """Add `<name>_threaded`, `<name>_workspace` and `<name>_counters` beside `fn`; False if it cannot be taken."""
    block = fn.regions[0].blocks[0]
    if len(fn.regions[0].blocks) != 1:
        return False
    for op in block.operations:
        if _kind(op) == "other" and len(op.results):
            return False
        if _kind(op) == "alloc" and not _identity(ir.MemRefType(op.results[0].type)):
            return False
    n_args = len(block.arguments)
    clone = fn.operation.clone(ip=ir.InsertionPoint(fn.operation))
    clone.move_after(fn.operation)
    try:
        with fn.location:
            total, counters = _rewrite(clone.opview, name + THREADED, opts)
            _sizing(clone.opview, total, n_args, name + WORKSPACE)
            _counter_bytes(clone.opview, counters, name + COUNTERS)
    except _Skip:
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


def _dynamic_size(src: ir.Value, a: int) -> ir.Value | None:
    """The value that is dim `a` of `src` when `src` is an allocation or a view that
    holds it as an operand (as memref.dim folds them), following views through; None
    when it is static, or not held."""
    t = ir.MemRefType(src.type)
    if not isinstance(src, ir.OpResult) or t.shape[a] != DYN:
        return None
    op = src.owner.opview
    if isinstance(op, (memref.AllocOp, memref.ViewOp)):
        sizes, static = list(op.dynamicSizes if isinstance(op, memref.AllocOp) else op.sizes), t.shape
    elif isinstance(op, memref.SubViewOp) and len(op.static_sizes) == t.rank:  # not rank-reducing
        sizes, static = list(op.sizes), list(op.static_sizes)
    elif isinstance(op, memref.ExpandShapeOp):
        sizes, static = list(op.output_shape), list(op.static_output_shape)
    else:
        return None
    return sizes[sum(1 for n in static[:a] if n == DYN)]


def _fold_dims(block) -> None:
    """Replace each `memref.dim` at a constant position of an allocation or a view that
    holds that size as an operand by that operand, so that sizes (of later temporaries,
    of the workspace) are computed from the arguments and not read from views."""
    for op in block.operations:
        if op.name != "memref.dim":
            continue
        a = _const(op.operands[1])
        size = _dynamic_size(op.operands[0], a) if a is not None else None
        if size is not None:
            op.results[0].replace_all_uses_with(size)


def _identity(t: ir.MemRefType) -> bool:
    return isinstance(t.layout, ir.AffineMapAttr) and t.layout.value == ir.AffineMap.get_identity(t.rank)


def _accesses(op) -> list[tuple[ir.Value, str]]:
    """(root, "r" / "rw") per memref operand; any op but these three may write all of them."""
    out = []
    if op.name == "linalg.generic":
        g = op.opview
        out += [(buffer_root(v), "r") for v in g.inputs] + [(buffer_root(v), "rw") for v in g.outputs]
    elif op.name in ("linalg.fill", "linalg.copy"):
        *ins, dst = op.operands
        out += [(buffer_root(v), "r") for v in ins if isinstance(v.type, ir.MemRefType)] + [(buffer_root(dst), "rw")]
    else:
        out += [(buffer_root(v), "rw") for v in op.operands if isinstance(v.type, ir.MemRefType)]
    return out


def _elem_bytes(t: ir.MemRefType) -> int:
    width = t.element_type.width if hasattr(t.element_type, "width") else None
    if width is None:
        width = {"f32": 32, "f64": 64, "f16": 16, "bf16": 16}.get(str(t.element_type))
    if width is None:
        raise _Skip()
    return max(1, width // 8)


def _const(v: ir.Value):
    """The integer `v` is when it is an arith.constant, else None."""
    if isinstance(v, ir.OpResult) and v.owner.name == "arith.constant":
        return ir.IntegerAttr(v.owner.attributes["value"]).value
    return None


def _mul(a: ir.Value, b: ir.Value) -> ir.Value:
    ca, cb = _const(a), _const(b)
    if ca is not None and cb is not None:
        return index(ca * cb)
    if ca == 1:
        return b
    if cb == 1:
        return a
    return arith.muli(a, b)


def _add(a: ir.Value, b: ir.Value) -> ir.Value:
    ca, cb = _const(a), _const(b)
    return index(ca + cb) if ca is not None and cb is not None else arith.addi(a, b)


def _align(v: ir.Value) -> ir.Value:
    """`v` rounded up to a multiple of ALIGN_BYTES."""
    c = _const(v)
    if c is not None:
        return index(-(-c // ALIGN_BYTES) * ALIGN_BYTES)
    return arith.muli(arith.ceildivui(v, index(ALIGN_BYTES)), index(ALIGN_BYTES))


def _dim(m: ir.Value, a: int) -> ir.Value:
    n = ir.MemRefType(m.type).shape[a]
    return index(n) if n != DYN else memref.dim(m, index(a))


def _nbytes(m: ir.Value) -> ir.Value:
    t = ir.MemRefType(m.type)
    out = index(_elem_bytes(t))
    for a in range(t.rank):
        out = _mul(out, _dim(m, a))
    return out


def _rewrite(fn, new_name: str, opts: "Threads") -> tuple[ir.Value, int]:
    """Turn the clone `fn` into the threaded entry; returns the workspace bytes (an index
    value) and how many of them, first, are the tasks' counters."""
    fn.attributes["sym_name"] = ir.StringAttr.get(new_name)
    block = fn.regions[0].blocks[0]
    loc = fn.location
    tid = block.add_argument(index_type(), loc)
    nthreads = block.add_argument(index_type(), loc)
    ws = block.add_argument(ir.MemRefType.get([DYN], ir.IntegerType.get_signless(8)), loc)
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    fn.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([*ftype.inputs, tid.type, nthreads.type, ws.type], ftype.results))
    if "arg_attrs" in fn.attributes:
        del fn.attributes["arg_attrs"]

    _fold_dims(block)
    tasks = _chains(_tasks(list(block.operations), opts), opts.fuse, opts)
    if not any(kind == "split" for kind, _ in tasks):
        raise _Skip()  # nothing to share: one thread would run every task while the others wait
    # each split op with its parts (None: sized at run time), known before the allocations go
    tasks = [(kind, [(g, pl[6] and _parts(pl)) for g, pl in group] if kind == "split" else group)
             for kind, group in tasks]
    ops = list(block.operations)
    with ir.InsertionPoint(ops[0]), loc:
        address = memref.extract_aligned_pointer_as_index(ws)
        offset = index(0)
    # the tasks' counters first (claimed, done: a cache line each), then the temporaries:
    # views of the workspace, in order, each on a cache line
    for op in ops:
        if _kind(op) != "alloc":
            continue
        with ir.InsertionPoint(op), op.location:
            at = _add(index(2 * ALIGN_BYTES * len(tasks)), offset)
            t = ir.MemRefType(op.results[0].type)
            view = memref.view(t, ws, at, list(op.operands))
            dyn = iter(op.operands)
            nbytes = index(_elem_bytes(t))
            for n in t.shape:
                nbytes = _mul(nbytes, next(dyn) if n == DYN else index(n))
            offset = _align(_add(offset, nbytes))
        op.results[0].replace_all_uses_with(view)
        op.erase()
    counters = 2 * ALIGN_BYTES * len(tasks)
    with ir.InsertionPoint(ops[-1]), loc:  # before the return
        total = _add(index(counters), offset)

    def counter(k: int, which: int) -> ir.Value:
        return arith.addi(address, index(2 * ALIGN_BYTES * k + ALIGN_BYTES * which))

    pending: list = []  # (task number, its parts, its accesses) not yet waited for

    def wait_for_conflicts(at, accesses, everything=False) -> None:
        nonlocal pending
        keep = []
        with ir.InsertionPoint(at), at.location:
            for k, parts, theirs in pending:
                if everything or _clash(accesses, theirs):
                    func.call([], ir.FlatSymbolRefAttr.get(WAIT), [counter(k, 1), parts])
                else:
                    keep.append((k, parts, theirs))
        pending = keep

    for k, (kind, group) in enumerate(tasks):
        if kind == "split":  # a chain of groups, each [fill?, op], planned again: the temporaries are views now
            members = [(g, _plan(g[-1], opts) or _plan_in(g[-1], n, opts))
                       for g, n in group]  # (or else a small op _absorb cut into the chain's n parts)
            group = [o for g, _ in members for o in g]
        first, main = group[0], group[-1]
        accesses = [a for o in group for a in _accesses(o)] if kind != "fence" else [(None, "rw")]
        wait_for_conflicts(first, accesses, everything=kind == "fence")
        if kind == "split":
            ops = list(block.operations)
            between = ops[_index(ops, first):_index(ops, main)]  # the views and sizes among the chain's ops
            for o in between:
                if not any(o.operation == g.operation for g in group):
                    o.move_before(first)
            with ir.InsertionPoint(first), main.location:
                parts = _split(members, (tid, nthreads), opts.min_bytes, counter(k, 0), counter(k, 1))
        else:  # one part, run by the thread that claims it; the views between move before it
            between = list(block.operations)
            between = between[_index(between, first):_index(between, main)]
            for o in between:
                if _kind(o) == "pure":
                    o.move_before(first)
            with ir.InsertionPoint(first), first.location:
                parts = index(1)
                claimed = func.call([index_type()], ir.FlatSymbolRefAttr.get(CLAIM),
                                    [counter(k, 0), index(1), tid, nthreads])
                branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, claimed, index(0)))
                with ir.InsertionPoint(branch.then_block):
                    end_call = func.call([], ir.FlatSymbolRefAttr.get(DONE), [counter(k, 1)])
                    scf.YieldOp([])
            for o in group:
                o.move_before(end_call.operation)
        pending.append((k, parts, accesses))
    return total, counters


def _index(ops, op) -> int:
    return next(i for i, o in enumerate(ops) if o.operation == op.operation)


def _tasks(ops, opts: "Threads") -> list[tuple[str, list]]:
    """The function's ops with memory effects as tasks, in order: ("split", [fill?, op]) for an op
    worth splitting (with the fill of its output), ("small", ops) for a run of ops too small to
    split (one thread runs them all), ("fence", [op]) for an op of unknown effects."""
    tasks, i = [], 0
    while i < len(ops):
        op, kind = ops[i], _kind(ops[i])
        i += 1
        if kind in ("pure", "return", "alloc"):
            continue
        if kind == "other":
            if op.regions and any(o.name == "memref.alloc" for o in _walk(op)):
                raise _Skip()
            tasks.append(("fence", [op]))
            continue
        group = [op]
        if op.name == "linalg.fill":  # a fill of the next op's output goes with it
            j = i
            while j < len(ops) and _kind(ops[j]) in ("pure", "alloc"):
                j += 1
            if j < len(ops) and _fills_output(op, ops[j]):
                group = [op, ops[j]]
                i = j + 1
        if kind == "split" and _plan(group[-1], opts) is not None:
            tasks.append(("split", group))
        elif tasks and tasks[-1][0] == "small":
            tasks[-1][1].extend(group)
        else:
            tasks.append(("small", group))
    return tasks


def _chains(tasks, fuse: bool, opts: "Threads") -> list[tuple[str, list]]:
    """The tasks with each run of consecutive split ones that can share their parts as one
    task: ("split", [(group, plan), ...]). A group joins the chain before it when it is
    split along a loop of the same extent
    (the same static size, or the same symbolic one) into the same static width or both
    sized at run time, and when every buffer one of them writes and another touches is cut
    along the same dim of it in both; or into as many parts of static widths, every such
    buffer cut into the same ranges of its elements by both (_fusable): part c of it then
    reads only what part c of the chain's earlier ops wrote, which the same thread has
    just run. Not along a
    parameter's symbolic leading dim: that is a batch, 1 in a decode step, so the chain
    would be one part, and the Section 19 step (every op cut along B) took 0.35 ms so on
    two threads against 0.29 as separate tasks of one part each (measured, not explained:
    on one thread the two forms run alike). A split group whose chain is the task before
    last, with a run of small ops between, moves ahead of that run (the run's ops move
    after it) when the two conflict nowhere (_conflict): the run runs after the chain,
    as one thread would run it anyway, and the other threads stream the group's weights
    on without a wait. Else the run joins the group's task, each of its ops cut into the
    group's parts, when they can be (_absorb). The same bits: the moved ops read and write
    what they did."""
    out: list = []
    for kind, group in tasks:
        if kind == "small" and out and out[-1][0] == "small":
            out[-1][1].extend(group)  # two runs of small ops that a moved split op had parted
            continue
        if kind != "split":
            out.append((kind, group))
            continue
        plan = _plan(group[-1], opts)
        if fuse and len(out) >= 2 and out[-1][0] == "small" and out[-2][0] == "split" and \
                all(_fusable(g, pl, group, plan) for g, pl in out[-2][1]) and \
                not _conflict(out[-1][1], group):
            # the small ops before it neither touch what it writes nor write what it reads:
            # they run after it, and it joins the chain before them
            small = out[-1][1]
            for o in reversed(small):
                o.move_after(group[-1])
            out[-2][1].append((group, plan))
            continue
        chain = out[-1][1] if fuse and out and out[-1][0] == "split" else []
        if chain and all(_fusable(g, pl, group, plan) for g, pl in chain):
            out[-1][1].append((group, plan))
            continue
        absorbed = _absorb(out[-1][1], group, plan, opts) if fuse and out and out[-1][0] == "small" else None
        if absorbed:  # the small ops before it, cut into its parts: one task, no wait between them
            out[-1] = ("split", [*absorbed, (group, plan)])
        else:
            out.append(("split", [(group, plan)]))
    return out


def _absorb(small, group, plan, opts: "Threads") -> list | None:
    """The run of small ops `small` as split groups [(group, plan)] cut into the same parts
    as `group` (split by `plan`, in parts of a static width), when each can be and each
    part of the chain they make then reads only what the same part wrote before it
    (_fusable): a decode step's split-k sums of gate and up, their silu and
    product, cut into the columns of h that the down projection's part of split-k
    chunks reads:

        h[1, 1, 1536] = silu(sum(gate_partials[8, 1, 1536])) * sum(...)  // columns [768c, 768c + 768)
        down_partials = reinterpret(h)[8, 1, 192] @ w_down[8, 192, 576]  // chunks [4c, 4c + 4)

    None when an op cannot be so cut, or the parts are not static."""
    width = plan[6]
    src, pos = plan[2]
    if width is None or any(op.name not in ("linalg.generic", "linalg.fill") for op in small):
        return None
    parts = ir.MemRefType(src.type).shape[pos] // width
    groups, i = [], 0
    while i < len(small):  # a fill goes with the generic after it that writes what it filled
        g = small[i:i + 2] if small[i].name == "linalg.fill" and i + 1 < len(small) and \
            _fills_output(small[i], small[i + 1]) else small[i:i + 1]
        i += len(g)
        p = _plan_in(g[-1], parts, opts)
        if p is None or p[6] is None or _parts(p) != parts:
            return None
        groups.append((g, p))
    members = [*groups, (group, plan)]
    for k, (g2, p2) in enumerate(members):
        if not all(_fusable(g1, p1, g2, p2) for g1, p1 in members[:k]):
            return None
    return groups


def _fills_output(fill, op) -> bool:
    """Whether `fill` fills the output of `op`, a generic (the two are then one group)."""
    return op.name == "linalg.generic" and fill.operands[-1] in list(op.opview.outputs)


def _plan_in(op, parts: int, opts: "Threads"):
    """`_plan` of `op` into `parts` parts however few bytes it moves (_absorb)."""
    return _plan(op, replace(opts, min_bytes=1, parts=parts))


def _conflict(ops1, ops2) -> bool:
    """Whether running ops2 before ops1 could change what either computes (_clash)."""
    return _clash([a for o in ops1 for a in _accesses(o)], [a for o in ops2 for a in _accesses(o)])


def _clash(a1, a2) -> bool:
    """Whether two lists of accesses ((root, mode), _accesses) must keep their order: one
    writes a buffer the other touches, or either touches memory it cannot name (None)."""
    return any(r1 is None or r2 is None or (r1 == r2 and ("w" in m1 or "w" in m2))
               for r1, m1 in a1 for r2, m2 in a2)


def _extent_key(src: ir.Value, pos: int):
    """What identifies the extent of dim `pos` of `src` for _chains: its static size, or
    the value or argument dim that holds the symbolic one; None when unknown."""
    n = ir.MemRefType(src.type).shape[pos]
    if n != DYN:
        return n
    size = _dynamic_size(src, pos)
    if size is None:
        return ("arg", src.arg_number, pos) if isinstance(src, ir.BlockArgument) else None
    if isinstance(size, ir.OpResult) and size.owner.name == "memref.dim" and \
            isinstance(size.owner.operands[0], ir.BlockArgument) and _const(size.owner.operands[1]) is not None:
        return ("arg", size.owner.operands[0].arg_number, _const(size.owner.operands[1]))
    return size


def _fusable(g1, plan1, g2, plan2) -> bool:
    """Whether group g2 can run in the same parts as g1, right after it (see _chains): both
    cut along loops of the same extent into the same parts, every buffer one writes and the
    other touches cut along the same dim of it; or into as many parts of static widths along
    loops of different extents, every such buffer cut by both into the same ranges of its
    elements (_span; see _absorb)."""
    (src1, pos1), (src2, pos2) = plan1[2], plan2[2]
    key, other = _extent_key(src1, pos1), _extent_key(src2, pos2)
    # keys of one kind only: an MLIR value's == refuses None (and another kind is another extent)
    same_loop = key is not None and type(key) is type(other) and key == other and plan1[6] == plan2[6]
    if not same_loop and not (plan1[6] and plan2[6] and _parts(plan1) == _parts(plan2)):
        return False
    if _batch(src1, pos1) or _batch(src2, pos2):
        return False  # a parameter's symbolic leading dim, a batch: 1 part at decode (see _chains)
    if same_loop and plan1[6] is not None and plan1[6] % max(plan1[3], plan2[3]):
        return False  # the static width is not whole lines of the other's output

    first, second = _modes(g1), _modes(g2)
    cuts = [(buffer_root(v), v, p, plan[6]) for plan in (plan1, plan2) for _, v, p in plan[1]]
    for r in first.keys() & second.keys():
        if "w" not in first[r] + second[r]:
            continue  # read by both: any parts may
        if r is None:
            return False
        dims = {_root_dim(v, p) for root, v, p, _ in cuts if root == r}
        if same_loop and len(dims) == 1 and None not in dims:
            continue
        ranges = {_span(v, p, width) for root, v, p, width in cuts if root == r}
        if len(ranges) != 1 or None in ranges:
            return False
    return True


def _parts(plan) -> int:
    """The parts of a plan of a static width."""
    src, pos = plan[2]
    return ir.MemRefType(src.type).shape[pos] // plan[6]


def _span(v: ir.Value, p, width) -> int | None:
    """The elements of v's buffer each part covers when `v` is cut along dim `p` in parts
    `width` long, if those parts are consecutive ranges of the buffer from its start: `v`
    views all of it in row-major order (through casts, reshapes, and reinterpret_casts to
    row-major strides at the source's own offset), with only 1s before `p`. Else None."""
    t = ir.MemRefType(v.type)
    if p is None or width is None or DYN in t.shape or any(n != 1 for n in t.shape[:p]):
        return None
    root = v
    while isinstance(root, ir.OpResult) and root.owner.name in VIEWS:
        op = root.owner.opview
        if isinstance(op, memref.ReinterpretCastOp):
            shape = list(op.static_sizes)
            rowmajor = [_prod(shape[a + 1:]) for a in range(len(shape))]
            offset = op.offsets[0] if len(op.offsets) == 1 else None
            if list(op.static_strides) != rowmajor or offset is None or not (
                    isinstance(offset, ir.OpResult) and offset.owner.name == "memref.extract_strided_metadata"
                    and offset.result_number == 1 and offset.owner.operands[0] == op.source):
                return None
        elif not isinstance(op, (memref.CastOp, memref.ExpandShapeOp, memref.CollapseShapeOp)):
            return None
        root = op.operands[0]
    rt = ir.MemRefType(root.type)
    if not _identity(rt) or DYN in rt.shape or _prod(rt.shape) != _prod(t.shape):
        return None
    return width * _prod(t.shape[p + 1:])


def _modes(group) -> dict:
    """root -> "r", "rw", ... over the group's ops (_accesses)."""
    out: dict = {}
    for r, m in (a for o in group for a in _accesses(o)):
        out[r] = out.get(r, "") + m
    return out


def _root_dim(v: ir.Value, p) -> int | None:
    """The dim of v's buffer (buffer_root) that dim `p` of the view `v` is, from index 0
    and with a unit step, so that a range of v along p is the same range of the buffer
    along it; None if it is not such a dim (or p is None)."""
    while p is not None and isinstance(v, ir.OpResult) and v.owner.name in VIEWS:
        op = v.owner.opview
        if isinstance(op, memref.SubViewOp):
            if len(op.static_sizes) != ir.MemRefType(op.source.type).rank or \
                    op.static_offsets[p] != 0 or op.static_strides[p] != 1:
                return None
        elif isinstance(op, (memref.ExpandShapeOp, memref.CollapseShapeOp)):  # p's group, all else 1s
            groups = [[ir.IntegerAttr(i).value for i in g] for g in op.reassociation]
            wide = ir.MemRefType((v if isinstance(op, memref.ExpandShapeOp) else op.src).type).shape
            if isinstance(op, memref.ExpandShapeOp):
                g = next(k for k, group in enumerate(groups) if p in group)
                p = g if all(wide[a] == 1 for a in groups[g] if a != p) else None
            else:
                rest = [a for a in groups[p] if wide[a] != 1]
                p = rest[0] if len(rest) == 1 else groups[p][0] if not rest else None
        elif v.owner.name != "memref.cast":
            return None
        v = v.owner.operands[0]
    return p


def _walk(op):
    for region in op.regions:
        for b in region.blocks:
            for o in b.operations:
                yield o
                yield from _walk(o)


def _operands_and_maps(op):
    """(operand index, memref value, its indexing map) for a generic, fill or copy."""
    if op.name == "linalg.generic":
        maps = maps_of(op)
        g = op.opview
        values = [*g.inputs, *g.outputs]
        first = len(op.operands) - len(values)
        return [(first + k, v, m) for k, (v, m) in enumerate(zip(values, maps)) if isinstance(v.type, ir.MemRefType)]
    out = []
    for k, v in enumerate(op.operands):
        if isinstance(v.type, ir.MemRefType):
            out.append((k, v, ir.AffineMap.get_identity(ir.MemRefType(v.type).rank)))
    return out


def _loop_dims(op) -> tuple[int, list[str]]:
    if op.name == "linalg.generic":
        its = iterators_of(op)
        return len(its), its
    rank = ir.MemRefType(op.operands[-1].type).rank
    return rank, ["parallel"] * rank


def _plan(op, opts: "Threads"):
    """How to split `op`: (loop dim, [(operand index, value, result position or None)], extent source,
    align, bytes known statically or None); None to run it on thread 0 alone."""
    # a loop whose index the body reads (linalg.index) is not cut: a part would see its own
    # indices from 0 (a fused quantized matmul reads only its reduction loops' indices)
    indexed = {ir.IntegerAttr(o.attributes["dim"]).value for o in _walk(op) if o.name == "linalg.index"} \
        if op.name == "linalg.generic" else set()
    n_loops, iterators = _loop_dims(op)
    operands = _operands_and_maps(op)
    if any(0 in ir.MemRefType(v.type).shape for _, v, _ in operands):
        return None  # no elements (and a subview at offset 0 of a dim of size 0 does not verify)
    outs = operands[-1:] if op.name != "linalg.generic" else operands[len(list(op.opview.inputs)):]
    if not outs:
        return None
    candidates = []
    for d in range(n_loops):
        if iterators[d] != "parallel" or d in indexed:
            continue
        where, ok = [], True
        for k, v, m in operands:
            exprs = [e.maybe_downcast() for e in m.results]
            pos = [q for q, e in enumerate(exprs) if isinstance(e, ir.AffineDimExpr) and e.position == d]
            uses = sum(str(e).count(f"d{d}") for e in exprs)  # d inside a compound expression cannot be cut
            if uses != len(pos) or len(pos) > 1:
                ok = False
                break
            where.append((k, v, pos[0] if pos else None))
        if not ok or any(p is None for k, v, p in where if any(k == k2 for k2, _, _ in outs)):
            continue
        k0, v0, p0 = next(w for w in where if w[2] is not None)
        extent = ir.MemRefType(v0.type).shape[p0]
        if extent == 1:
            continue
        candidates.append((d, where, (v0, p0), extent))
    if not candidates:
        return None
    _, out_value, _ = outs[0]
    out_t = ir.MemRefType(out_value.type)

    def align_of(where) -> int:  # parts of the output's innermost dim are whole lines
        out_pos = next(p for k, v, p in where if k == outs[0][0])
        return max(1, ALIGN_BYTES // _elem_bytes(out_t)) if out_pos == out_t.rank - 1 else 1
    # the loops that give `parts` parts (a symbolic one may), and of those the one whose parts
    # re-read the fewest bytes (an operand it does not index is read whole by every part: a
    # prefill matmul's weight, when cut along its rows; a decode attention's probabilities,
    # cut along the head width rather than the heads), then not a batch (a parameter's symbolic
    # leading dim, 1 in a decode step: the Section 19 step's B), the outermost of equals
    big = [c for c in candidates if c[3] == DYN or c[3] // align_of(c[1]) >= opts.parts]
    d, where, source, extent = min(big, key=lambda c: (_reread_bytes(c[1]), _batch(*c[2]))) if big else \
        max(candidates, key=lambda c: c[3])
    align = align_of(where)
    shapes = [ir.MemRefType(v.type) for _, v, _ in operands]
    # the bytes it moves at the least: exactly when every size is static, else with each
    # symbolic dim at 1
    least = sum(_elem_bytes(t) * _prod([1 if n == DYN else n for n in t.shape]) for t in shapes)
    static = least if all(DYN not in t.shape for t in shapes) else None
    width = None
    if extent != DYN and (static is not None or least >= 2 * opts.min_bytes):  # parts sized now
        chunks = -(-extent // align)
        most = min(chunks, least // opts.min_bytes, opts.parts)
        if most <= 1:
            return None
        # equal parts of a static width where they exist (the loop passes then see static
        # sizes along the split: a prefill matmul's columns, however long the prompt)
        if extent % align == 0:
            parts = next((n for n in range(most, 1, -1) if chunks % n == 0), 0)
            if parts:
                width = extent // parts
    if static is None and width is None and not opts.symbolic:
        return None  # parts sized at run time, which the options rule out
    return d, where, source, align, static, operands, width


def _batch(src: ir.Value, pos: int) -> bool:
    """Whether dim `pos` of `src` is a parameter's symbolic leading dim (a batch)."""
    key = _extent_key(src, pos)
    return isinstance(key, tuple) and key[2] == 0


def _reread_bytes(where) -> int:
    """The bytes of the operands a split along one loop does not index (each part reads
    them whole), a symbolic dim counted as SYMBOLIC_EXTENT."""
    return sum(_elem_bytes(t) * _prod([n if n != DYN else SYMBOLIC_EXTENT for n in t.shape])
               for t in (ir.MemRefType(v.type) for _, v, p in where if p is None))


def _prod(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def _split(members, team, min_bytes: int, claimed: ir.Value, done: ir.Value) -> ir.Value:
    """Emit the loop in which this thread (`team`: the entry's %tid and %nthreads) claims
    parts of a chain's range and runs each of its groups (`members`: (group, plan)) on the
    part's subviews, in order (at the insertion point); returns the number of parts. Parts
    of a symbolic extent: up to PARTS_PER_THREAD per thread of whole `align` chunks (the
    most of the chain's), none under `min_bytes` (the chain's bytes)."""
    _, _, (src, pos), _, _, _, width = members[0][1]
    extent = _dim(src, pos)
    if width is not None:
        return _split_static(members, extent, width, claimed, done, team)
    align = max(plan[3] for _, plan in members)
    if all(plan[4] is not None for _, plan in members):
        nbytes = index(sum(plan[4] for _, plan in members))
    else:
        nbytes = index(0)
        for _, plan in members:
            for _, v, _ in plan[5]:
                nbytes = arith.addi(nbytes, _nbytes(v))
    chunks = arith.ceildivui(extent, index(align)) if align > 1 else extent
    most = arith.muli(team[1], index(PARTS_PER_THREAD))
    parts = arith.minui(arith.minui(chunks, arith.maxui(arith.divui(nbytes, index(min_bytes)), index(1))), most)

    def bounds(c):
        lo = arith.minui(extent, arith.muli(arith.divui(arith.muli(chunks, c), parts), index(align)))
        hi = arith.minui(extent, arith.muli(arith.divui(arith.muli(chunks, arith.addi(c, index(1))), parts),
                                            index(align)))
        return lo, arith.subi(hi, lo)
    _claim_parts(members, parts, lambda c, plan: bounds(c), claimed, done, team)
    return parts


def _split_static(members, extent, width: int, claimed, done, team) -> ir.Value:
    """`_split` for a static extent in equal parts `width` long: part c is [c * width, (c + 1) * width)
    (of each member's own width, in a chain of members cut along loops of different extents)."""
    parts = index(_const(extent) // width)
    _claim_parts(members, parts, lambda c, plan: (arith.muli(c, index(plan[6])), plan[6]), claimed, done, team)
    return parts


def _claim_parts(members, parts: ir.Value, bounds, claimed: ir.Value, done: ir.Value, team) -> None:
    """The loop in which a thread (`team`: %tid, %nthreads) claims a part of the chain until none is left:
    `bounds(c, plan)` gives part c's start and size along a member's loop (an index value,
    or an int when static); each group runs in turn with each operand its plan marks as
    its subview there; the part is counted done after."""
    loop = scf.WhileOp([index_type()], [])
    before = loop.before.blocks.append()
    with ir.InsertionPoint(before):
        c = func.call([index_type()], ir.FlatSymbolRefAttr.get(CLAIM), [claimed, parts, *team])
        scf.ConditionOp(arith.cmpi(arith.CmpIPredicate.ult, c, parts), [c])
    body = loop.after.blocks.append(index_type())
    with ir.InsertionPoint(body):
        end_call = func.call([], ir.FlatSymbolRefAttr.get(DONE), [done])
        scf.YieldOp([])
    ranges = {}  # a member's width (None: sized at run time) -> its part's start and size
    for group, plan in members:
        main, where = group[-1], plan[1]
        with ir.InsertionPoint(end_call.operation), main.location:
            if plan[6] not in ranges:
                ranges[plan[6]] = bounds(body.arguments[0], plan)
            lo, size = ranges[plan[6]]
            views = {}
            for k, v, p in where:
                if p is None:
                    continue
                if v not in views:
                    views[v] = _subview(v, p, lo, size)
                main.operands[k] = views[v]
            for o in group[:-1]:  # the fill: its output is the main op's
                o.operands[len(o.operands) - 1] = views[o.operands[len(o.operands) - 1]]
        for o in group:
            o.move_before(end_call.operation)


def _subview(v: ir.Value, p: int, lo: ir.Value, size) -> ir.Value:
    """`v` along dim `p` from `lo`, `size` long (an int: a static size)."""
    t = ir.MemRefType(v.type)
    strides, _ = t.get_strides_and_offset()
    shape = list(t.shape)
    shape[p] = size if isinstance(size, int) else DYN
    layout = ir.StridedLayoutAttr.get(DYN, strides)
    result = ir.MemRefType.get(shape, t.element_type, layout, t.memory_space)
    offsets = [0] * t.rank
    sizes = [n if n != DYN else memref.dim(v, index(a)) for a, n in enumerate(t.shape)]
    offsets[p], sizes[p] = lo, size
    return memref.subview(v, offsets, sizes, [1] * t.rank, result_type=result)


def _counter_bytes(threaded, counters: int, name: str) -> None:
    """`name() -> index`: the bytes of the workspace's task counters, its first bytes: the
    part a caller zeroes before each call (the temporaries after them need no zeroing)."""
    with ir.InsertionPoint(threaded.operation), threaded.location:
        fn = func.FuncOp(name, ([], [index_type()]))
    fn.operation.move_after(threaded.operation)
    fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
    with ir.InsertionPoint(fn.add_entry_block()), threaded.location:
        func.ReturnOp([index(counters)])


def _sizing(threaded, total: ir.Value, n_args: int, name: str) -> None:
    """`name(args) -> index`: the workspace bytes, from the ops `total` depends on (no memory effects)."""
    block = threaded.regions[0].blocks[0]
    needed, stack = set(), [total]
    while stack:
        v = stack.pop()
        if not isinstance(v, ir.OpResult):
            if isinstance(v, ir.BlockArgument) and v.arg_number >= n_args:
                raise _Skip()
            continue
        op = v.owner.operation if hasattr(v.owner, "operation") else v.owner
        if op in needed:
            continue
        if _kind(op) != "pure" or op.name == "memref.view":
            raise _Skip()
        needed.add(op)
        stack.extend(op.operands)
    ftype = ir.FunctionType(ir.TypeAttr(threaded.attributes["function_type"]).value)
    with ir.InsertionPoint(threaded.operation), threaded.location:
        sizing = func.FuncOp(name, (list(ftype.inputs)[:n_args], [index_type()]))
    sizing.operation.move_after(threaded.operation)
    sizing.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
    entry = sizing.add_entry_block()
    mapping = {block.arguments[a]: entry.arguments[a] for a in range(n_args)}
    with ir.InsertionPoint(entry):
        for op in block.operations:
            if op.operation in needed:
                new = op.operation.clone()
                for k, v in enumerate(op.operands):
                    new.operands[k] = mapping.get(v, v)
                for old, fresh in zip(op.results, new.results):
                    mapping[old] = fresh
        if isinstance(total, ir.OpResult):
            result = mapping[total]
        else:
            result = total
        with threaded.location:
            func.ReturnOp([result])
