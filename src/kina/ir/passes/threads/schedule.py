"""threads, its schedule: a function's ops as tasks, in order, and which tasks share parts.

In:  the ops of a function (`tasks_of`), each op planned (`op_kind`, `plan_of`).
Out: `chains(tasks_of(ops))`: a list of tasks, each ("split", [(group, plan), ...]) (a chain
     of ops split into the same parts), ("small", ops) (a run of ops too small to split, or
     other structured ops: one part) or ("fence", [op]) (an op of unknown effects: after
     every task before it and before every task after); and `accesses_of`/`clash`, which say
     when a task must wait for another.

A group is an op with the fill of its output if one comes just before. Consecutive
split ops cut along loops of the same extent, into the same parts, are one task (`fuse`)
when every buffer one of them writes and another touches is cut along the same dim of it
in both (through subviews from 0, reshapes that keep that dim, casts), or, cut into as
many parts of static widths along loops of different extents, when both cut every such
buffer into the same ranges of its elements: a part then runs each op on its range in
turn, and reads only what the same part of the ops before it wrote. A prefill's RMSNorm
(x * x, its mean per row, x times its rsqrt, times the weight) is then one task cut along
the prompt's rows, not four. A StoryLM layer's prefill has 30 tasks so, not 58, and its
decode step 19, not 25 (the small shape; SmolLM's: 30, not 58, and 21, not 27). Ops cut
along a parameter's symbolic leading dim (a batch) are not chained (see `chains`).

A split op that would join the chain before it but for a run of small ops between them
goes ahead of that run when the run neither writes what it reads nor touches what it
writes: a decode step's q, k and v matmuls (and its gate and up) are then one task each,
their sums added after (two threads: a decode step has 13 tasks, not 19 at the small
shape and 21 at SmolLM's; a prefill 27, not 30). A run of small ops that cannot go after
the split op that follows it joins that op's task instead when each op can be cut into
the same number of parts, of static widths, and every buffer one of them writes and
another touches is cut by both into the same ranges of its elements (`_absorb`): a decode
step's split-k sums of gate and up, their silu and product, in the columns of h that the
down projection's part of chunks reads. Each part then sums its columns and multiplies its
chunks at once, where one thread summed all the columns while the others waited
(SmolLM's F16 step: 12 tasks, 0.1 ms a token less, about 1%).

Buffers are told apart by their root (a parameter, or a temporary, through views);
distinct parameters do not overlap (the runtime's rule). Guarantees: the ops a task
moves read and write what they did, so the schedule changes no bits.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import memref

from ...irbuild import DYN
from .._util import VIEWS, buffer_root
from .plan import Skip, extent_key, identity, is_batch, op_kind, parts_of, plan_in, plan_of, prod, walk


def tasks_of(ops, opts: "Threads") -> list[tuple[str, list]]:
    """The function's ops with memory effects as tasks, in order: ("split", [fill?, op]) for an op
    worth splitting (with the fill of its output), ("small", ops) for a run of ops too small to
    split (one thread runs them all), ("fence", [op]) for an op of unknown effects."""
    tasks, i = [], 0
    while i < len(ops):
        op, kind = ops[i], op_kind(ops[i])
        i += 1
        if kind in ("pure", "return", "alloc"):
            continue
        if kind == "other":
            if op.regions and any(o.name == "memref.alloc" for o in walk(op)):
                raise Skip()
            tasks.append(("fence", [op]))
            continue
        group = [op]
        if op.name == "linalg.fill":  # a fill of the next op's output goes with it
            j = i
            while j < len(ops) and op_kind(ops[j]) in ("pure", "alloc"):
                j += 1
            if j < len(ops) and _fills_output(op, ops[j]):
                group = [op, ops[j]]
                i = j + 1
        if kind == "split" and plan_of(group[-1], opts) is not None:
            tasks.append(("split", group))
        elif tasks and tasks[-1][0] == "small":
            tasks[-1][1].extend(group)
        else:
            tasks.append(("small", group))
    return tasks


def chains(tasks, fuse: bool, opts: "Threads") -> list[tuple[str, list]]:
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
        plan = plan_of(group[-1], opts)
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
    width = plan.width
    src, pos = plan.source
    if width is None or any(op.name not in ("linalg.generic", "linalg.fill") for op in small):
        return None
    parts = ir.MemRefType(src.type).shape[pos] // width
    groups, i = [], 0
    while i < len(small):  # a fill goes with the generic after it that writes what it filled
        g = small[i:i + 2] if small[i].name == "linalg.fill" and i + 1 < len(small) and \
            _fills_output(small[i], small[i + 1]) else small[i:i + 1]
        i += len(g)
        p = plan_in(g[-1], parts, opts)
        if p is None or p.width is None or parts_of(p) != parts:
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


def _fusable(g1, plan1, g2, plan2) -> bool:
    """Whether group g2 can run in the same parts as g1, right after it (see chains): both
    cut along loops of the same extent into the same parts, every buffer one writes and the
    other touches cut along the same dim of it; or into as many parts of static widths along
    loops of different extents, every such buffer cut by both into the same ranges of its
    elements (_span; see _absorb)."""
    (src1, pos1), (src2, pos2) = plan1.source, plan2.source
    key, other = extent_key(src1, pos1), extent_key(src2, pos2)
    # keys of one kind only: an MLIR value's == refuses None (and another kind is another extent)
    same_loop = key is not None and type(key) is type(other) and key == other and plan1.width == plan2.width
    if not same_loop and not (plan1.width and plan2.width and parts_of(plan1) == parts_of(plan2)):
        return False
    if is_batch(src1, pos1) or is_batch(src2, pos2):
        return False  # a parameter's symbolic leading dim, a batch: 1 part at decode (see chains)
    if same_loop and plan1.width is not None and plan1.width % max(plan1.align, plan2.align):
        return False  # the static width is not whole lines of the other's output

    first, second = _modes(g1), _modes(g2)
    cuts = [(buffer_root(v), v, p, plan.width) for plan in (plan1, plan2) for _, v, p in plan.where]
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
            rowmajor = [prod(shape[a + 1:]) for a in range(len(shape))]
            offset = op.offsets[0] if len(op.offsets) == 1 else None
            if list(op.static_strides) != rowmajor or offset is None or not (
                    isinstance(offset, ir.OpResult) and offset.owner.name == "memref.extract_strided_metadata"
                    and offset.result_number == 1 and offset.owner.operands[0] == op.source):
                return None
        elif not isinstance(op, (memref.CastOp, memref.ExpandShapeOp, memref.CollapseShapeOp)):
            return None
        root = op.operands[0]
    rt = ir.MemRefType(root.type)
    if not identity(rt) or DYN in rt.shape or prod(rt.shape) != prod(t.shape):
        return None
    return width * prod(t.shape[p + 1:])


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


def _modes(group) -> dict:
    """root -> "r", "rw", ... over the group's ops (accesses_of)."""
    out: dict = {}
    for r, m in (a for o in group for a in accesses_of(o)):
        out[r] = out.get(r, "") + m
    return out


def accesses_of(op) -> list[tuple[ir.Value, str]]:
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


def _conflict(ops1, ops2) -> bool:
    """Whether running ops2 before ops1 could change what either computes (clash)."""
    return clash([a for o in ops1 for a in accesses_of(o)], [a for o in ops2 for a in accesses_of(o)])


def clash(a1, a2) -> bool:
    """Whether two lists of accesses ((root, mode), accesses_of) must keep their order: one
    writes a buffer the other touches, or either touches memory it cannot name (None)."""
    return any(r1 is None or r2 is None or (r1 == r2 and ("w" in m1 or "w" in m2))
               for r1, m1 in a1 for r2, m2 in a2)
