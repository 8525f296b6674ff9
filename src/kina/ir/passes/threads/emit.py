"""threads, its emission: the threaded entry's loops, its workspace, and the functions beside it.

In:  a clone of a function (its body bufferized) and the pass's options.
Out: `rewrite` turns the clone into `<f>_threaded(args..., %tid, %nthreads, %ws)`: each
     task of the schedule (`chains(tasks_of(...))`) as a loop in which this thread claims a
     part (`kina_claim`), runs it on the part's subviews and counts it done (`kina_done`),
     with a wait (`kina_wait`) before a task that reads what an earlier one wrote, or writes
     what it read or wrote; `add_workspace_sizing` and `add_counter_bytes` add `<f>_workspace(args) -> bytes`
     and `<f>_counters() -> bytes`.

Any thread may run any part: each claims a part of a task (an atomic word in the
workspace: the next of its own contiguous range of parts, then the last still free),
runs it, counts it done and claims again until none is left. Nothing waits for a thread
to arrive, so a thread the system has not scheduled yet takes no part and delays no one
(kina_threads.c, linked into the .so, has the three functions). Ops without memory
effects (index arithmetic, views) run on every thread.

Temporaries are shared by all threads: each `memref.alloc` becomes a view of the
workspace `%ws` (two counters per task, each on its own cache line, then every
temporary at a 64-byte boundary, none reused; a `memref.dim` of a temporary, or of a
view that holds the size, first becomes that size), whose size `<f>_workspace`
computes from the same arguments; the caller zeroes its counters (`<f>_counters`
bytes, the first ones) before each call and passes it to every thread. The
temporaries need no zeroing: each is written before it is read, as a fresh
allocation is (a SmolLM layer step's workspace is 450 KB, its counters a few KB).

Guarantees: each output element is computed by exactly one part, by the same op over the
same reduction range as the original; `Skip` when a function cannot be taken (a size not
computable from the arguments, nothing worth splitting).
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, func, memref, scf

from ....abi import CLAIM, DONE, WAIT
from ...irbuild import DYN, index
from .plan import ALIGN_BYTES, Skip, const, dynamic_size, elem_bytes, op_kind, parts_of, plan_in, plan_of
from .schedule import accesses_of, chains, clash, tasks_of

PARTS_PER_THREAD = 2  # a task is cut in up to this many parts per thread, for whichever threads are running


def index_type():
    return ir.IndexType.get()


def rewrite(fn, new_name: str, opts: "Threads") -> tuple[ir.Value, int]:
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
    tasks = chains(tasks_of(list(block.operations), opts), opts.fuse, opts)
    if not any(kind == "split" for kind, _ in tasks):
        raise Skip()  # nothing to share: one thread would run every task while the others wait
    # each split op with its parts (None: sized at run time), known before the allocations go
    tasks = [(kind, [(g, pl.width and parts_of(pl)) for g, pl in group] if kind == "split" else group)
             for kind, group in tasks]
    ops = list(block.operations)
    with ir.InsertionPoint(ops[0]), loc:
        address = memref.extract_aligned_pointer_as_index(ws)
        offset = index(0)
    # the tasks' counters first (claimed, done: a cache line each), then the temporaries:
    # views of the workspace, in order, each on a cache line
    for op in ops:
        if op_kind(op) != "alloc":
            continue
        with ir.InsertionPoint(op), op.location:
            at = _add(index(2 * ALIGN_BYTES * len(tasks)), offset)
            t = ir.MemRefType(op.results[0].type)
            view = memref.view(t, ws, at, list(op.operands))
            dyn = iter(op.operands)
            nbytes = index(elem_bytes(t))
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
                if everything or clash(accesses, theirs):
                    func.call([], ir.FlatSymbolRefAttr.get(WAIT), [counter(k, 1), parts])
                else:
                    keep.append((k, parts, theirs))
        pending = keep

    for k, (kind, group) in enumerate(tasks):
        if kind == "split":  # a chain of groups, each [fill?, op], planned again: the temporaries are views now
            members = [(g, plan_of(g[-1], opts) or plan_in(g[-1], n, opts))
                       for g, n in group]  # (or else a small op _absorb cut into the chain's n parts)
            group = [o for g, _ in members for o in g]
        first, main = group[0], group[-1]
        accesses = [a for o in group for a in accesses_of(o)] if kind != "fence" else [(None, "rw")]
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
                if op_kind(o) == "pure":
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
    align = max(plan.align for _, plan in members)
    if all(plan.static_bytes is not None for _, plan in members):
        nbytes = index(sum(plan.static_bytes for _, plan in members))
    else:
        nbytes = index(0)
        for _, plan in members:
            for _, v, _ in plan.operands:
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
    parts = index(const(extent) // width)
    _claim_parts(members, parts, lambda c, plan: (arith.muli(c, index(plan.width)), plan.width), claimed, done, team)
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
        main, where = group[-1], plan.where
        with ir.InsertionPoint(end_call.operation), main.location:
            if plan.width not in ranges:
                ranges[plan.width] = bounds(body.arguments[0], plan)
            lo, size = ranges[plan.width]
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


def add_counter_bytes(threaded, counters: int, name: str) -> None:
    """`name() -> index`: the bytes of the workspace's task counters, its first bytes: the
    part a caller zeroes before each call (the temporaries after them need no zeroing)."""
    with ir.InsertionPoint(threaded.operation), threaded.location:
        fn = func.FuncOp(name, ([], [index_type()]))
    fn.operation.move_after(threaded.operation)
    fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
    with ir.InsertionPoint(fn.add_entry_block()), threaded.location:
        func.ReturnOp([index(counters)])


def add_workspace_sizing(threaded, total: ir.Value, n_args: int, name: str) -> None:
    """`name(args) -> index`: the workspace bytes, from the ops `total` depends on (no memory effects)."""
    block = threaded.regions[0].blocks[0]
    needed, stack = set(), [total]
    while stack:
        v = stack.pop()
        if not isinstance(v, ir.OpResult):
            if isinstance(v, ir.BlockArgument) and v.arg_number >= n_args:
                raise Skip()
            continue
        op = v.owner.operation if hasattr(v.owner, "operation") else v.owner
        if op in needed:
            continue
        if op_kind(op) != "pure" or op.name == "memref.view":
            raise Skip()
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


def _fold_dims(block) -> None:
    """Replace each `memref.dim` at a constant position of an allocation or a view that
    holds that size as an operand by that operand, so that sizes (of later temporaries,
    of the workspace) are computed from the arguments and not read from views."""
    for op in block.operations:
        if op.name != "memref.dim":
            continue
        a = const(op.operands[1])
        size = dynamic_size(op.operands[0], a) if a is not None else None
        if size is not None:
            op.results[0].replace_all_uses_with(size)


def _mul(a: ir.Value, b: ir.Value) -> ir.Value:
    ca, cb = const(a), const(b)
    if ca is not None and cb is not None:
        return index(ca * cb)
    if ca == 1:
        return b
    if cb == 1:
        return a
    return arith.muli(a, b)


def _add(a: ir.Value, b: ir.Value) -> ir.Value:
    ca, cb = const(a), const(b)
    return index(ca + cb) if ca is not None and cb is not None else arith.addi(a, b)


def _align(v: ir.Value) -> ir.Value:
    """`v` rounded up to a multiple of ALIGN_BYTES."""
    c = const(v)
    if c is not None:
        return index(-(-c // ALIGN_BYTES) * ALIGN_BYTES)
    return arith.muli(arith.ceildivui(v, index(ALIGN_BYTES)), index(ALIGN_BYTES))


def _dim(m: ir.Value, a: int) -> ir.Value:
    n = ir.MemRefType(m.type).shape[a]
    return index(n) if n != DYN else memref.dim(m, index(a))


def _nbytes(m: ir.Value) -> ir.Value:
    t = ir.MemRefType(m.type)
    out = index(elem_bytes(t))
    for a in range(t.rank):
        out = _mul(out, _dim(m, a))
    return out
