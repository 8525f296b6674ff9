"""matmul-loops, its choice: which loops a matmul gets, and their static parameters.

In:  a matmul `linalg.generic` (after bufferization, on memrefs) and the pass's options.
Out: a `Choice`, or None for a matmul these loops do not take. Its `strategy` is one of
     `STRATEGIES`; the pass stamps it on the loops it emits (`kina.matmul_strategy`), so
     `kinac opt` output shows which one ran:

    linalg.generic {matmul} ins(%x, %w : memref<32x576xf32>, memref<576x1536xf32>) ...
becomes
    scf.for %k0 = ... { ... } {kina.matmul_strategy = "register-tiles"}

The choice is made from what is known when the pass runs: the matmul's form, its
element types and static sizes, and the options. Within a strategy some choices wait for
the run (see each one's line in STRATEGIES): rhs rows short and nearly back to back go one
at a time, longer or farther-apart ones `unroll` at a time; a symbolic row length takes
the sums-in-registers case that fits it; a fused matmul whose slot is rhs's own memory
skips its copy.

Guarantees: only matmuls on memrefs of floats with a unit innermost stride whose
operands share the sums' element type, or are narrower, both or one (fused: both, the
slot of their type), are taken; the choice changes the loops, never the order of the sums.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from ...irbuild import DYN
from .._util import ONE_ROW_AT_A_TIME, matmul_form, stride_of, unit_innermost

NT_ALIGN = 64  # bytes: what a non-temporal vector store needs (a cache line), not a tuning choice

STRATEGY_ATTR = "kina.matmul_strategy"
STRATEGIES = {
    "register-tiles": "rows in tiles of `tile-rows`, their sums in vector registers while k runs over a block of "
                      "rhs that every tile reads from cache; the rows past the last whole tile as `rows` does",
    "group-rows": "a few static rows (2 to `group-rows`) together: each rhs vector loaded once for all of them",
    "rows-in-registers": "each row's sums (a static length of at most `register-row-bytes`) in registers while k runs",
    "unroll-and-jam": "each row alone, `unroll` rhs rows read side by side per pass over j; rhs rows short and "
                      "nearly back to back (checked at run time) one at a time; a symbolic row length that "
                      "fits, its sums in registers",
    "row-at-a-time": "each row alone, one rhs row (or `step-rows`) at a time, prefetched ahead (split-k's chunks, "
                     "marked kina.one_row_at_a_time)",
    "dot-rows": "rhs runs along k as lhs does (a transposed view): dot products of rows, a block of `lanes` rows "
                "transposed in registers against `transposed-columns` of the other side",
    "fused-copy": "the matmul also copies rhs into a concat's slot: one row at a time, the copy with non-temporal "
                  "stores; where the slot is rhs's own memory (checked at run time), the loops of a plain one",
}


@dataclass(frozen=True)
class Choice:
    """The loops of one matmul. For the row strategies: `unroll` rhs rows a pass reads side
    by side where rows are long or far apart (1: one at a time always); `copy`, the fused
    copy into the slot; each vector step covers `width` elements, and `line` elements are
    one 64-byte line of what its vector stores write; rows whose sums are `register_vectors`
    lines long (one of them: a run-time switch) keep them in registers, at most `most` lines
    a row; `step_rows` rhs rows a step of the one-at-a-time loops adds, which `prefetch`;
    `tiles`: whole register tiles of rows first; `group`: that many static rows together.
    For fused-copy, `plain` and `fused` are the choices of its two branches; for dot-rows,
    `blocked` is the side whose rows go in blocks ("i": lhs's, "j": rhs's; None: the
    longer, decided at run time)."""

    strategy: str
    unroll: int = 1
    copy: bool = False
    width: int = 0
    line: int = 0
    register_vectors: tuple[int, ...] = ()
    most: int = 0
    step_rows: int = 1
    prefetch: bool = False
    tiles: bool = False
    group: int = 0
    plain: "Choice | None" = None
    fused: "Choice | None" = None
    blocked: str | None = None


def choose(op, options) -> Choice | None:
    """The loops of matmul `op` under the pass's `options`; None if it is not one these take."""
    form = form_of(op)
    if form is None:
        return None
    if form == "transposed":
        acc_t = ir.MemRefType(op.outputs[0].type)
        n_static, i_static = acc_t.shape[-1], acc_t.shape[-2]
        if DYN not in (n_static, i_static):
            blocked = "j" if n_static > i_static else "i"
        elif (n_static == DYN) != (i_static == DYN):  # the static side (a weight's rows) in blocks
            blocked = "i" if n_static == DYN else "j"
        else:
            blocked = None
        return Choice("dot-rows", blocked=blocked)
    unroll = 1 if ONE_ROW_AT_A_TIME in op.attributes else options.unroll
    if form == "fused":  # the copy only where the slot is not rhs's own memory
        return Choice("fused-copy", plain=_rows(op, options, unroll, copy=False), fused=_rows(op, options, 1, copy=True))
    return _rows(op, options, unroll, copy=False)


def _rows(op, options, unroll: int, copy: bool) -> Choice:
    """The choice of a matmul that goes row by row (or in tiles of rows); `copy`: a fused
    one's copy into its slot (then one row a step, each row of the slot aligned)."""
    acc_t = ir.MemRefType(op.outputs[0].type)
    elt = acc_t.element_type
    elt_bytes = elt.width // 8
    narrow = ir.MemRefType(op.inputs[1].type).element_type  # what rhs vectors are loaded as
    width = max(1, options.vector_bytes // elt_bytes)
    # elements in one cache line of what the non-temporal stores write (the slot, of rhs's
    # type; a whole line per store), or of the sums; a widening fused matmul's vectors
    # cover at least a whole line of its narrow slot
    line = max(1, NT_ALIGN // (narrow.width // 8 if copy else elt_bytes))
    if copy and width % line:
        width = -(-width // line) * line
    # the row lengths (in lines) whose sums stay in registers: when N is symbolic, one line
    # or whole vectors (a run-time switch, a case each), up to the most that fit
    most, n_static = options.register_row_bytes // (line * elt_bytes), acc_t.shape[-1]
    if n_static == DYN:
        register_vectors = sorted({1, *range(width // line, most + 1, width // line)} & set(range(1, most + 1)))
    else:
        register_vectors = [n_static // line] if n_static % line == 0 and 0 < n_static // line <= most else []
    # a fused matmul's slot rows each start at their own alignment: one row per step
    step_rows = options.step_rows if narrow == elt and not copy else 1
    # only steps of one row prefetch (several side by side are streams the hardware follows)
    prefetch = options.prefetch_bytes > 0 and not copy and step_rows == 1
    rows = acc_t.shape[-2]
    tiles = options.tile_rows > 1 and not copy and (rows == DYN or rows >= options.tile_rows)
    group = rows if not tiles and rows != DYN and 1 < rows <= options.group_rows else 0
    if tiles:
        strategy = "register-tiles"
    elif group:
        strategy = "group-rows"
    elif n_static != DYN and register_vectors and not copy:
        strategy = "rows-in-registers"
    else:
        strategy = "row-at-a-time" if unroll == 1 else "unroll-and-jam"
    return Choice(strategy, unroll, copy, width, line, tuple(register_vectors), most, step_rows, prefetch, tiles, group)


def form_of(op) -> str | None:
    """The matmul form of `op` (`matmul_form`) if these loops can take it: on memrefs
    of float element types, either all of one type or operands narrower (F16, BF16)
    than the sums they go into, both or one (mixed: F32 x against F16 W; fused, both:
    an F16 model's attention, its slot of rhs's type); "transposed" when lhs and rhs
    are both unit-strided along k (not fused), else each unit-strided along its
    innermost dim (the loops load whole vectors along it), "widening" if narrower
    (and not fused)."""
    form = matmul_form(op)
    if form is None:
        return None
    operands = list(op.operands)
    if not all(isinstance(v.type, ir.MemRefType) and isinstance(v.type.element_type, ir.FloatType) for v in operands):
        return None
    lhs, rhs, acc = (v.type.element_type for v in operands[:3])
    narrower = all(t == acc or t.width < acc.width for t in (lhs, rhs))
    if not (lhs == rhs == acc or (narrower and (form != "fused" or lhs == rhs == operands[3].type.element_type))):
        return None
    rhs_t = ir.MemRefType(operands[1].type)
    if form != "fused" and unit_innermost(operands[0].type) and stride_of(rhs_t, rhs_t.rank - 2) == 1 and \
            (not unit_innermost(rhs_t) or rhs_t.shape[-1] == 1):
        return "transposed"  # rhs columns run along k, as lhs rows do: dot products of rows
    if not all(unit_innermost(v.type) for v in operands):
        return None
    return form if lhs == rhs == acc or form == "fused" else "widening"
