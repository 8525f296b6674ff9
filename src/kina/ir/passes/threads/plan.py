"""threads, its plan: which ops a threaded entry splits, along which loop, into which parts.

In:  one op of a function the threads pass takes (after bufferization: memrefs), and the
     pass's options.
Out: `op_kind(op)`, what the op is to the pass ("pure": no memory effects, run by every
     thread; "alloc"; "split": a linalg.generic, fill or copy; "linalg": another
     structured op; "other": unknown effects; "return"); and `plan_of(op, opts)`, a `Plan`
     of how to split a "split" op, or None to run it in one part.

A linalg.generic, fill or copy that moves at least `min-bytes` per part is split along
one parallel loop that indexes every output (of those that give `parts` parts, the one
whose parts re-read the fewest bytes, then not a parameter's symbolic leading dim, which
is a batch and 1 in a decode step, then the outermost; else the longest): a part is a
range of that loop (a subview of every operand it indexes; the others whole, read by
every part), so no reduction is ever split. The parts are whole 64-byte lines of the
output where the loop runs along its innermost dim. Where the loop's extent is static
the parts are equal and of a static width when it divides (the loop passes then see
static sizes along the split); else they are sized at run time (`symbolic`), up to 2 per
thread.

Guarantees: a plan cuts only parallel loops that index every output, each operand by
at most one of its dims, and never a loop whose index the body reads (`linalg.index`: a part
would see its own indices from 0); an op with no elements gets none.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from mlir import ir
from mlir.dialects import memref

from ...irbuild import DYN
from .._util import VIEWS, iterators_of, maps_of


ALIGN_BYTES = 64  # each temporary starts on a cache line, as memref.alloc's alignment gave it
SYMBOLIC_EXTENT = 64  # what a symbolic dim counts as when splits are compared (a prompt's length, say)

# ops with no memory effects: every thread runs them (they compute sizes, bounds and views)
_PURE = VIEWS | {"memref.dim", "memref.view", "memref.extract_aligned_pointer_as_index", "memref.extract_strided_metadata",
                 "affine.apply"}
_PURE_DIALECTS = ("arith.", "index.", "math.")


class Plan(NamedTuple):
    """How to split one op: along loop `loop`; `where` is (operand index, value, its dim
    that the loop indexes, or None: read whole by every part) per memref operand;
    `source` the (value, dim) whose size is the loop's extent; parts are whole multiples
    of `align` elements; `static_bytes` the bytes it moves, when every size is static;
    `operands` (index, value, map) of every memref operand; `width` the static width of
    each part, or None when the parts are sized at run time."""
    loop: int
    where: list
    source: tuple
    align: int
    static_bytes: int | None
    operands: list
    width: int | None


class Skip(Exception):
    """This function gets no threaded entry."""


def op_kind(op) -> str:
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


def walk(op):
    for region in op.regions:
        for b in region.blocks:
            for o in b.operations:
                yield o
                yield from walk(o)


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


def plan_of(op, opts: "Threads"):
    """How to split `op`: (loop dim, [(operand index, value, result position or None)], extent source,
    align, bytes known statically or None); None to run it on thread 0 alone."""
    # a loop whose index the body reads (linalg.index) is not cut: a part would see its own
    # indices from 0 (a fused quantized matmul reads only its reduction loops' indices)
    indexed = {ir.IntegerAttr(o.attributes["dim"]).value for o in walk(op) if o.name == "linalg.index"} \
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
        return max(1, ALIGN_BYTES // elem_bytes(out_t)) if out_pos == out_t.rank - 1 else 1
    # the loops that give `parts` parts (a symbolic one may), and of those the one whose parts
    # re-read the fewest bytes (an operand it does not index is read whole by every part: a
    # prefill matmul's weight, when cut along its rows; a decode attention's probabilities,
    # cut along the head width rather than the heads), then not a batch (a parameter's symbolic
    # leading dim, 1 in a decode step: the Section 19 step's B), the outermost of equals
    big = [c for c in candidates if c[3] == DYN or c[3] // align_of(c[1]) >= opts.parts]
    d, where, source, extent = min(big, key=lambda c: (_reread_bytes(c[1]), is_batch(*c[2]))) if big else \
        max(candidates, key=lambda c: c[3])
    align = align_of(where)
    shapes = [ir.MemRefType(v.type) for _, v, _ in operands]
    # the bytes it moves at the least: exactly when every size is static, else with each
    # symbolic dim at 1
    least = sum(elem_bytes(t) * prod([1 if n == DYN else n for n in t.shape]) for t in shapes)
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
    return Plan(d, where, source, align, static, operands, width)


def plan_in(op, parts: int, opts: "Threads"):
    """`plan_of` of `op` into `parts` parts however few bytes it moves (_absorb)."""
    return plan_of(op, replace(opts, min_bytes=1, parts=parts))


def parts_of(plan) -> int:
    """The parts of a plan of a static width."""
    src, pos = plan.source
    return ir.MemRefType(src.type).shape[pos] // plan.width


def is_batch(src: ir.Value, pos: int) -> bool:
    """Whether dim `pos` of `src` is a parameter's symbolic leading dim (a batch)."""
    key = extent_key(src, pos)
    return isinstance(key, tuple) and key[2] == 0


def _reread_bytes(where) -> int:
    """The bytes of the operands a split along one loop does not index (each part reads
    them whole), a symbolic dim counted as SYMBOLIC_EXTENT."""
    return sum(elem_bytes(t) * prod([n if n != DYN else SYMBOLIC_EXTENT for n in t.shape])
               for t in (ir.MemRefType(v.type) for _, v, p in where if p is None))


def extent_key(src: ir.Value, pos: int):
    """What identifies the extent of dim `pos` of `src` for chains: its static size, or
    the value or argument dim that holds the symbolic one; None when unknown."""
    n = ir.MemRefType(src.type).shape[pos]
    if n != DYN:
        return n
    size = dynamic_size(src, pos)
    if size is None:
        return ("arg", src.arg_number, pos) if isinstance(src, ir.BlockArgument) else None
    if isinstance(size, ir.OpResult) and size.owner.name == "memref.dim" and \
            isinstance(size.owner.operands[0], ir.BlockArgument) and const(size.owner.operands[1]) is not None:
        return ("arg", size.owner.operands[0].arg_number, const(size.owner.operands[1]))
    return size


def dynamic_size(src: ir.Value, a: int) -> ir.Value | None:
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


def identity(t: ir.MemRefType) -> bool:
    return isinstance(t.layout, ir.AffineMapAttr) and t.layout.value == ir.AffineMap.get_identity(t.rank)


def elem_bytes(t: ir.MemRefType) -> int:
    width = t.element_type.width if hasattr(t.element_type, "width") else None
    if width is None:
        width = {"f32": 32, "f64": 64, "f16": 16, "bf16": 16}.get(str(t.element_type))
    if width is None:
        raise Skip()
    return max(1, width // 8)


def const(v: ir.Value):
    """The integer `v` is when it is an arith.constant, else None."""
    if isinstance(v, ir.OpResult) and v.owner.name == "arith.constant":
        return ir.IntegerAttr(v.owner.attributes["value"]).value
    return None


def prod(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out
