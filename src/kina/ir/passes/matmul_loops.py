"""matmul-loops: after bufferization, each matmul `linalg.generic` becomes explicit loops.

    linalg.generic {matmul maps} ins(%q, %k : memref<1x4xf32, ...>, memref<4x8xf32, ...>)
                                 outs(%acc : memref<1x8xf32, ...>)   // acc + x * y
becomes, for each (batch..., i) and each block of `unroll` consecutive k (an option, 8),
    scf.for %j = ... step 32 {                       // explicit vector<32xf32>
      %a = vector.load %acc[%i, %j]
      %y0 = vector.load %k[%k0, %j]  ...  %y7 = vector.load %k[%k7, %j]
      %a' = ((%a + %x0 * %y0) + %x1 * %y1) ... + %x7 * %y7
      vector.store %a', %acc[%i, %j]
    }
then vector<16xf32> steps (one 64-byte line each) and a scalar tail, or, for short
output rows, the whole row of sums carried in vector registers through the k loop.

convert-linalg-to-loops would give (batch..., i, k, j) loops whose j loop streams
one rhs row at a time. Here one j loop reads `unroll` rows side by side (several
read streams at once) and adds their products to the accumulator in the order
k, k+1, ...: every output element still sums over k in ascending order, as fmul
then fadd, so results are bit-identical to the plain loops. Works for any static
or symbolic sizes and any outer strides.

Which of the two is decided at run time from the rhs: rows of at most
`row-at-a-time-bytes` whose gap to the next row is at most `row-at-a-time-gap-bytes`
go one row of k at a time, a single read stream over nearly contiguous memory,
with the row of sums in L1 (each vector of sums loaded, then `step-rows` rows added
to it in k order, then stored: fewer loads and stores of sums per weight); longer or
farther-apart rows take `unroll` at a time.
Short rows nearly back to back read fastest as one stream; with a gap, or long
rows, several streams at once win (scripts/bench_k_layout.py measures it; the
figures and the thresholds they gave: docs/performance.md, "The Kᵀ layout").
The order of the sums is the same either way. Where a step adds one row (step-rows=1,
a widening matmul), each vector step also prefetches its lines the
whole rows ahead that cover `prefetch-bytes` (a decode projection x[1, K] @ W[K, N]
read one row at a time is one stream, which the hardware prefetchers alone left at
70-80% of a contiguous read; docs/performance.md, "Decode at the weight-bandwidth
floor"). A step of several rows reads that many streams side by side, which the
hardware keeps ahead of: there the prefetches only cost (on the Zen 5 VM, weights in
huge pages: 0-26% of a projection's time, 10-17% of a SmolLM F32 decode step;
docs/performance.md, "Prefetches only for one row a step"), so those steps have none.
The prefetches fill L2 (`prefetch-level=2`, prefetcht1), not L1: on two threads an F16
projection's row read 11% faster so (docs/performance.md, "Prefetches into L2").
The `unroll` rows read side by side (long rows, or rows far apart) are prefetched along
themselves: each vector step also prefetches each row's lines `side-prefetch-bytes`
further on, clamped to the row's last element (a short row's prefetch is then a line it
reads anyway). A tied head, x[1, 576] @ head[576, 49152] in F16, rows of 96 KiB, read
14.8 -> 16.1 GB/s on one thread and 25.4 -> 29.1 on two so, on the Intel VM: the hardware
prefetchers stop at each 4 KiB page of each of the 8 streams (docs/performance.md,
"Long rows read side by side, prefetched along").

A matmul with at least `tile-rows` rows (prefill, x[P, K] @ W[K, N]) takes its rows in
register tiles first: for each block of `tile-k-rows` rhs rows and each block of
columns (`tile-row-bytes` of sums per row), every tile of rows in turn, so that block
of rhs is read from cache by all of them (from a copy on the stack with its rows back
to back, `pack`, where its rows are a multiple of 4 KiB apart, checked at run time: they
would share a few cache sets and evict each other, and 256x512x4096 ran at half the
rate; elsewhere copying cost more than it saved. The copy is in the sums' type, so F16
or BF16 weights are always copied, widened once, not once per tile of rows; F16 or BF16 rows of
lhs likewise go to a small F32 copy, a tile's rows of the block, before its k loop);
the tile's sums stay in vector registers
while k runs over the block, each rhs vector loaded once per k for all the tile's
rows. Between blocks of k the sums go to acc and come back (exact), so each element
still sums in k order. The last block of columns, partial, uses masked loads and
stores; the rows past the last whole tile go one by one as above.

A matmul marked `kina.one_row_at_a_time` (split-k's chunks, whose rows are a weight's,
back to back) goes one row at a time (prefetched when a step is one row), and no other loop is built
for it.

A fused matmul (fuse-concat-matmul: it also copies its rhs into a concat's slot)
goes one row at a time and writes the copy with non-temporal stores: the copy is
not read again here, so it need not be read into the cache before it is written,
nor evict what is there. Those are aligned whole lines: each row's j loop starts
with plain scalar steps up to the first NT_ALIGN-byte boundary of the slot row,
then takes aligned vectors (`vector-bytes`, then one line at a time) and ends with
plain scalars for the last partial line (all counted in the slot's elements: a
widening fused matmul, an F16 or BF16 model's attention, copies F16 rows, and its
vector steps cover whole lines of them). So every cache line of the slot is written
one way only (a line written partly both ways is slower than either), and none by
scalar non-temporal stores (each is a partial-line write to memory; the costs of
both: docs/performance.md, "Non-temporal stores"). fence-nontemporal then orders them before the function returns.
Where the slot is rhs's own memory (checked at run time: the same first element and
strides), the copy is left out and the matmul runs as a plain one: a cache held in
one buffer, its filled part passed as the past and the same buffer one position
longer as the concat (kina.models' StoryCache), is appended in place:

    scf.if (same_memory(%k_past, %slot)) { <the plain matmul's loops> }
    else { <the fused loops above> }

A matmul whose output rows are short (a whole number of 64-byte lines, at most
`register-row-bytes`, like one attention head's values; checked at run time when the
length is symbolic) keeps the whole output row in vector registers while k runs,
in the same k order: each rhs row costs its loads (and, fused, its non-temporal
stores) and nothing else. A fused one needs every slot row to start on an
NT_ALIGN boundary, checked at run time (the slot is a caller's buffer); a
misaligned slot takes the row-at-a-time loops.

A matmul of a few static rows (2 to `group-rows`) too few for a register tile, such as
a grouped-query head's G query rows against its cache (q[1, Hk, G, Dh] @ Kᵀ[1, Hk, Dh, S],
then probs @ V), takes them together: each step loads the sums of every row, then each
rhs vector once, added into every row's sums in k order:

    %a0 = vector.load %acc[%b, 0, %j]   %a1 = vector.load %acc[%b, 1, %j]   ...
    %y0 = vector.load %k[%k0, %j]
    %a0' = %a0 + %x00 * %y0             %a1' = %a1 + %x10 * %y0             ...

so the cache is read once for the group, not once per row (the same bits: each row's
sums keep their k order). Rows in registers count their sums in 64-byte lines then, the
group's at most twice one row's most.

A matmul whose batch dims broadcast (`x[B, S, 512] @ W[512, N]`, or a batch dim of
size 1 stretched) runs the same loops, reading each operand at its own batch
indices (index 0 along a stretched dim): the same order, the same bits.

A matmul whose rhs runs along k as its lhs does (a transposed view: a tied head's
table[V, D] @ xᵀ, or x @ W[N, K]ᵀ) is dot products of rows. The side with more rows
goes `lanes` of them at a time (one 64-byte line of sums, 16 for F32):

    scf.for %k0 = 0 to K step 16 iter_args(%sums = <acc[i0..i0+15, j]>) {
      memref.prefetch %t[%i0 + 16 + r, %k0]  ...               // the next block's lines
      %r0 = vector.load %t[%i0, %k0] ... %r15 = vector.load %t[%i0 + 15, %k0]
      %c0, ..., %c15 = 4 rounds of 16 vector.shuffle's of %r0..%r15   // the square, transposed
      %sums' = ((%sums + %c0 * x[%k0]) + %c1 * x[%k0 + 1]) ... + %c15 * x[%k0 + 15]
    }

so lane r sums row r in k order, as the plain loops do; the last k and rows go one
at a time. A block of rows takes `transposed-columns` (16) columns of the other side
at once (a prompt's rows: each square is transposed once for all of them, each column
with its own vector of sums), then the rest in groups a quarter as wide. When one side's
size is static and the other's symbolic (a weight against a prompt), the static side's
rows are the blocked ones; when both are symbolic, the longer side, chosen at run time.
F16/BF16 rows are widened as loaded, the other side once into an F32 copy.

A widening matmul (F16 or BF16 operands, F32 sums: the reference body extends x and
y) runs the same loops, each loaded vector (and each lhs scalar) extended once, then
the F32 multiply and add (register tiles widen into their copies instead: the packed
block of rhs, and a tile's rows of lhs for each block of columns); it reads half the
bytes of an F32 one. A mixed one (F32
activations against F16 or BF16 weights, or the other way round: only the narrow
operand is extended) runs them too, each operand loaded as its own type.

In:  any module; after bufferization, when matmuls are on memrefs. Out: the same
module with every matmul it can take as loops.

Guarantees: only matmuls on memrefs of floats with a unit innermost stride whose
operands share the sums' element type, or are narrower, both or one (fused: both, the
slot of their type), are rewritten; the others (on tensors, a non-strided layout) are left to
convert-linalg-to-loops. The options change the loops, never the order of the sums
(each element's adds stay in k order, by construction): any values give the same
bits, except `fma=true`, which rounds each multiply-add once (faster where the loops
are compute-bound, and no longer the bits of -O0; off by default).
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, linalg, math, memref, scf, vector

from ..irbuild import DYN, index
from ._pass import KinaPass, option
from ._util import NO_MATCH, ONE_ROW_AT_A_TIME, apply_patterns, batch_indices, dim, loop, maps_of, matmul_form, nest, \
    same_memory, stride_of, transposed_view, unit_innermost

NT_ALIGN = 64  # bytes: what a non-temporal vector store needs (a cache line), not a tuning choice
PACK_ALIAS_BYTES = 4096  # rhs rows a multiple of this apart share cache sets: a register tile reads a copy
# the most bytes of a widened block of rhs (F16/BF16 weights copied as F32 for the register
# tiles): tile-k-rows shrinks to fit half the Intel VM's 48 KiB L1D, beside the narrow rows
# it is copied from (128 rows of 96 columns, 48 KiB, took 58.8 ms for SmolLM's all-F16
# prefill of 32 on two threads; 64 rows, 52.5 ms; docs/performance.md, "Widened blocks
# of half the L1")
WIDENED_BLOCK_BYTES = 24 << 10
# rows taken together (group-rows) keep their sums in registers while those total at most this
# many times one row's most (register-row-bytes)
MULTI_ROW_REGISTERS = 2


def _at_least_1(n: int) -> bool:
    return 1 <= n <= 64


def _whole_lines(n: int) -> bool:
    return 0 < n <= 4096 and n % NT_ALIGN == 0


def _non_negative(n: int) -> bool:
    return n >= 0


@dataclass(frozen=True)
class MatmulLoops(KinaPass):
    name = "matmul-loops"
    summary = ("matmul generics to register tiles (many rows), prefetched or unroll-and-jammed vector loops, "
               "short rows in registers, fused copies with non-temporal stores; F16/BF16 widened as loaded; "
               "same summation order")
    optimisation = True
    unroll: int = option(8, "rhs rows one pass over j reads side by side (unroll-and-jam over k)",
                         check=_at_least_1, expected="an integer from 1 to 64")
    vector_bytes: int = option(128, "bytes of a row one vector step covers", check=_whole_lines,
                               expected=f"a multiple of {NT_ALIGN} up to 4096")
    register_row_bytes: int = option(512, "output rows up to this long keep their sums in registers (0: never)",
                                     check=_non_negative, expected="an integer >= 0")
    row_at_a_time_bytes: int = option(16 << 10, "rhs rows up to this long, nearly back to back, go one at a time",
                                      check=_non_negative, expected="an integer >= 0")
    row_at_a_time_gap_bytes: int = option(256, "the gap to the next rhs row that still counts as back to back",
                                          check=_non_negative, expected="an integer >= 0")
    prefetch_bytes: int = option(2048, "how far ahead, in bytes of rhs (whole rows, at least one), the "
                                 "one-row-at-a-time loops prefetch in steps of one row (0: never)",
                                 check=_non_negative, expected="an integer >= 0")
    side_prefetch_bytes: int = option(512, "how far ahead along its row each rhs row read side by side (unroll: long "
                                      "rows, a tied head's) is prefetched, clamped to the row's end (0: never)",
                                      check=_non_negative, expected="an integer >= 0")
    prefetch_level: int = option(2, "the cache those prefetches fill: 1 (L1 and out, prefetcht0), 2 (L2 and out, "
                                 "prefetcht1) or 3 (the last level, prefetcht2)",
                                 check=lambda n: 1 <= n <= 3, expected="1, 2 or 3")
    tile_rows: int = option(4, "output rows a register tile holds: a matmul's rows in whole tiles, the rest one by one "
                            "(1: no tiles)", check=_at_least_1, expected="an integer from 1 to 64")
    tile_row_bytes: int = option(384, "the sums of one row of a register tile", check=_whole_lines,
                                 expected=f"a multiple of {NT_ALIGN} up to 4096")
    tile_k_rows: int = option(128, "rhs rows per block of a register tile's k loop (the block of rhs cached while "
                              "every tile of rows reads it)", check=lambda n: n >= 1, expected="an integer >= 1")
    pack: bool = option(True, "register tiles read each block of rhs from a copy with its rows back to back "
                        "where rhs is narrower than the sums or its rows are a multiple of 4 KiB apart")
    fma: bool = option(False, "fused multiply-adds (one rounding per k): faster GEMMs, but not the bits of -O0")
    step_rows: int = option(4, "rhs rows one step of the one-row-at-a-time loops adds, in order, into its "
                            "vector of sums, loaded and stored once for all of them (a widening matmul: one, "
                            "the widening bounds it and more rows spill registers; a fused one: one)",
                            check=_at_least_1, expected="an integer from 1 to 64")
    group_rows: int = option(8, "a matmul of at most this many static rows and no register tile (a grouped-query "
                             "head's queries against its cache) takes them together, each rhs vector loaded once "
                             "for all (1: one at a time)", check=_at_least_1, expected="an integer from 1 to 64")
    transposed_columns: int = option(16, "columns of the other side a block of rows of the transposed form takes at "
                                     "once (each square transposed once for all of them, their sums in registers)",
                                     check=_at_least_1, expected="an integer from 1 to 64")

    def run(self, module_op) -> None:
        buffers: dict = {}  # (function, type) -> its stack buffer of that type

        def stack_buffer(op, t: ir.MemRefType) -> ir.Value:
            """A buffer of type `t` on the stack of `op`'s function, allocated once at its entry
            and shared by every matmul there that wants one (they run one after another; each
            thread of a threaded entry has its own): a function of many matmuls, or a threaded
            entry's loop that claims part after part, would otherwise keep one per matmul or per
            part (48 KiB each, 192 at tile-k-rows=512) until it returns, and overflow the stack."""
            fn = op.operation
            while fn.name != "func.func":
                fn = fn.parent
            key = (fn, str(t))
            if key not in buffers:
                with ir.InsertionPoint.at_block_begin(fn.regions[0].blocks[0]), fn.location:
                    buffers[key] = memref.AllocaOp(t, [], []).result
            return buffers[key]

        def matmul(op, rewriter):
            kind = _kind(op)
            if kind is None:
                return NO_MATCH
            with rewriter.ip, op.location:
                buffer = lambda t: stack_buffer(op, t)
                plain_unroll = 1 if ONE_ROW_AT_A_TIME in op.attributes else self.unroll
                if kind == "transposed":
                    _emit_transposed(op, self)
                elif kind == "fused":  # the copy only where the slot is not rhs's own memory
                    if_op = scf.IfOp(same_memory(op.inputs[1], op.outputs[1]), has_else=True)
                    with ir.InsertionPoint(if_op.then_block):
                        _emit(op, self, plain_unroll, buffer, copy=False)
                        scf.YieldOp([])
                    with ir.InsertionPoint(if_op.else_block):
                        _emit(op, self, 1, buffer)
                        scf.YieldOp([])
                else:
                    _emit(op, self, plain_unroll, buffer)
            rewriter.erase_op(op.operation)
        apply_patterns(module_op, {linalg.GenericOp: matmul})


def _kind(op) -> str | None:
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


def _widen_and_mac(elt: ir.Type, fma: bool):
    """(widen, mac) for loops summing in `elt`: widen(v) extends a scalar or a vector
    to `elt` (itself when it is of `elt` already); mac(a, x, y) is a + x * y
    as the reference body has it, fmul then fadd, or with `fma` rounded once (other bits)."""
    def widen(v):
        vt = isinstance(v.type, ir.VectorType)
        if (ir.VectorType(v.type).element_type if vt else v.type) == elt:
            return v
        return arith.ExtFOp(ir.VectorType.get(ir.VectorType(v.type).shape, elt) if vt else elt, v).result
    mac = (lambda a, x, y: math.FmaOp(x, y, a).result) if fma else \
        (lambda a, x, y: arith.AddFOp(a, arith.MulFOp(x, y).result).result)
    return widen, mac


def transpose_in_registers(rows: list[ir.Value]) -> list[ir.Value]:
    """The columns of the square block whose rows are `rows` (n vectors of n lanes, n a
    power of two): column c's lane r is row r's lane c. log2(n) rounds of two-source
    shuffles, each swapping the off-diagonal h x h blocks of every 2h x 2h block, for
    h = n/2, ..., 1; values are moved, never computed."""
    n = len(rows)
    h = n // 2
    while h >= 1:
        low = [c if not c & h else n + c - h for c in range(n)]   # row i takes row i+h's low half of each 2h
        high = [c + h if not c & h else n + c for c in range(n)]  # row i+h takes row i's high half
        out = list(rows)
        for i in (i for i in range(n) if not i & h):
            out[i] = vector.ShuffleOp(rows[i], rows[i + h], low).result
            out[i + h] = vector.ShuffleOp(rows[i], rows[i + h], high).result
        rows, h = out, h // 2
    return rows


def _emit_transposed(op, options: MatmulLoops) -> None:
    """acc[b, i, j] += sum over k of lhs[b, i, k] * rhs[b, k, j] where both run along k
    (rhs a transposed view: a tied head's table @ xᵀ, or x @ Wᵀ), as dot products of
    k-contiguous rows, each summed in k order. The rows of the longer side (lhs's, or
    rhs's columns when there are more of them; the static side when only one size is;
    decided at run time when both are symbolic) go a block of `lanes` (one line of
    sums) at a time, against `transposed-columns` of the other side's at once: each step of
    k loads `lanes` consecutive k of every row of the block (one line of each, read side
    by side, prefetching the next block's), transposes that square in registers, and
    adds its columns to the block's vector of sums one k after another, each times the
    other side's value at that k: lane r holds row r's sum in k order, as the plain
    loops have it. The remaining k, and the rows past the last whole block, go one
    element at a time."""
    lhs, rhs = list(op.inputs)
    acc = list(op.outputs)[0]
    acc_t = ir.MemRefType(acc.type)
    rank, elt = acc_t.rank, acc_t.element_type
    cst, zero, one = index, index(0), index(1)
    sizes = [dim(acc, a) for a in range(rank)]
    K, I, N = dim(lhs, ir.MemRefType(lhs.type).rank - 1), sizes[-2], sizes[-1]
    k_static = ir.MemRefType(lhs.type).shape[-1]
    lhs_batch, rhs_batch = (batch_indices(m, rank - 2, side) for m, side in zip(maps_of(op), ("lhs", "rhs")))
    lhs_at = lambda b: [b[p] if p is not None else zero for p in lhs_batch]
    rhs_at = lambda b: [b[p] if p is not None else zero for p in rhs_batch]
    lanes = max(2, NT_ALIGN // (elt.width // 8))
    vt = ir.VectorType.get([lanes], elt)
    widen, mac = _widen_and_mac(elt, options.fma)
    rest = lambda n, w: arith.SubIOp(n, arith.RemUIOp(n, cst(w)).result).result  # n rounded down to w's multiple
    k_main = rest(K, lanes)

    def rows_of_rhs():
        """rhs as rows along k: a view with its last two dims swapped."""
        rank = ir.MemRefType(rhs.type).rank
        return transposed_view(rhs, [*range(rank - 2), rank - 1, rank - 2])

    def blocked(along: str):
        """The loops with the rows of lhs ("i") or of rhs_rows ("j") in blocks."""
        if along == "i":  # rows r of lhs, other side c a column of rhs
            rows_of, rows_at, R, C = lhs, lhs_at, I, N
            other = lambda b, k, c: memref.LoadOp(rhs, [*rhs_at(b), k, c]).result
            at = lambda b, r, c: [*b, r, c]
            c_static = acc_t.shape[-1]
        else:  # rows r of rhs (its columns), other side c a row of lhs
            rows_of, rows_at, R, C = rows_of_rhs(), rhs_at, N, I
            other = lambda b, k, c: memref.LoadOp(lhs, [*lhs_at(b), c, k]).result
            at = lambda b, r, c: [*b, c, r]
            c_static = acc_t.shape[-2]
        # what the rows are loaded as (widened as loaded), and the other side's type
        nvt = ir.VectorType.get([lanes], ir.MemRefType(rows_of.type).element_type)
        other_elt = ir.MemRefType((rhs if along == "i" else lhs).type).element_type
        r_main, R_last = rest(R, lanes), arith.SubIOp(R, one).result
        prefetch = options.prefetch_bytes > 0

        def block(b, r0, c0, ys, width=1):
            """The block of rows from r0 against the `width` columns c0, c0 + 1, ...: each
            square is transposed once for all of them, each column with its own sums."""
            rows = [r0] + [arith.AddIOp(r0, cst(r)).result for r in range(1, lanes)]
            cs = [c0] + [arith.AddIOp(c0, cst(c)).result for c in range(1, width)]
            y_at = lambda k, c: vector.BroadcastOp(vt, memref.LoadOp(ys, [k, c]).result if ys is not None else
                                                   other(b, k, c)).result
            ahead = [arith.MinUIOp(arith.AddIOp(r, cst(lanes)).result, R_last).result for r in rows]

            def square(k0, *sums):
                if prefetch:  # the next block's same lines: each of its rows one stream ahead
                    for r in ahead:
                        memref.PrefetchOp(rows_of, [*rows_at(b), r, k0], False, 3, True)
                cols = transpose_in_registers(
                    [widen(vector.LoadOp(nvt, rows_of, [*rows_at(b), r, k0]).result) for r in rows])
                sums = list(sums)
                for k, col in enumerate(cols):
                    kk = arith.AddIOp(k0, cst(k)).result if k else k0
                    sums = [mac(a, col, y_at(kk, c)) for a, c in zip(sums, cs)]
                return sums

            def single_k(k, *sums):
                col = widen(vector.FromElementsOp(nvt, [memref.LoadOp(rows_of, [*rows_at(b), r, k]).result
                                                        for r in rows]).result)
                return [mac(a, col, y_at(k, c)) for a, c in zip(sums, cs)]
            starts = [vector.FromElementsOp(vt, [memref.LoadOp(acc, at(b, r, c)).result for r in rows]).result
                      for c in cs]
            sums = loop(zero, k_main, cst(lanes), square, starts)
            sums = loop(k_main, K, one, single_k, sums)
            for a, c in zip(sums, cs):
                for lane, r in enumerate(rows):
                    memref.StoreOp(vector.ExtractOp(a, [], [lane]).result, acc, at(b, r, c))

        def single_row(b, r, c):
            def add(k, a):
                x = widen(memref.LoadOp(rows_of, [*rows_at(b), r, k]).result)
                return [mac(a, x, widen(other(b, k, c)))]
            total = loop(zero, K, one, add, [memref.LoadOp(acc, at(b, r, c)).result])[0]
            memref.StoreOp(total, acc, at(b, r, c))

        def per_batch(b):
            ys = None
            if other_elt != elt:  # the other side widened once (every block reads all of it); deallocate frees it
                dyn = [v for v, n in ((K, k_static), (C, c_static)) if n == DYN]
                ys = memref.AllocOp(ir.MemRefType.get([k_static, c_static], elt), dyn, []).result
                nest([K, C], lambda kc: memref.StoreOp(widen(other(b, *kc)), ys, kc))
            # a block of rows against the c's, `transposed-columns` at a time, the rest in
            # groups a quarter as wide (down to one: halving groups built 1.5x slower, for
            # little): the block is read from memory once, from cache for the later c's;
            # with C static, only the groups that run are emitted
            widths, w = [], options.transposed_columns
            while w > 1:
                widths.append(w)
                w //= 4
            widths.append(1)
            if c_static != DYN:
                left, runs = c_static, []
                for w in widths:
                    runs.append((w, left // w))
                    left %= w
                widths = [w for w, n in runs if n]

            def against_columns(r0):
                start = zero
                for w in widths:
                    end = arith.AddIOp(start, rest(arith.SubIOp(C, start).result, w)).result if w > 1 else C
                    loop(start, end, cst(w), lambda c0, w=w: block(b, r0, c0, ys, w))
                    start = end
            loop(zero, r_main, cst(lanes), against_columns)
            loop(r_main, R, one, lambda r: loop(zero, C, one, lambda c: single_row(b, r, c)))

        nest(sizes[:-2], per_batch)

    n_static, i_static = acc_t.shape[-1], acc_t.shape[-2]
    if DYN not in (n_static, i_static):
        return blocked("j" if n_static > i_static else "i")
    if (n_static == DYN) != (i_static == DYN):  # the static side (a weight's rows) in blocks, the other in groups
        return blocked("i" if n_static == DYN else "j")
    if_op = scf.IfOp(arith.CmpIOp(arith.CmpIPredicate.ugt, N, I).result, has_else=True)
    for where, along in ((if_op.then_block, "j"), (if_op.else_block, "i")):
        with ir.InsertionPoint(where):
            blocked(along)
            scf.YieldOp([])


def _emit(op, options: MatmulLoops, unroll: int, stack_buffer, copy: bool = True) -> None:
    """The loops of matmul `op` (see the module docstring), `unroll` rhs rows at a time
    where they are long or far apart; a fused one's copy into its slot only with `copy`."""
    vector_bytes = options.vector_bytes
    lhs, rhs = list(op.inputs)
    acc, *slot = list(op.outputs)
    slot = slot[0] if slot and copy else None  # a fused matmul's concat slot, written with non-temporal stores
    acc_t = ir.MemRefType(acc.type)
    rank, elt = acc_t.rank, acc_t.element_type
    cst, zero, one = index, index(0), index(1)
    sizes = [dim(acc, a) for a in range(rank)]  # batch..., I, N
    K, I, N = dim(lhs, ir.MemRefType(lhs.type).rank - 1), sizes[-2], sizes[-1]
    # each operand's batch indices from the loops' (a broadcast operand has fewer, or reads 0)
    lhs_batch, rhs_batch = (batch_indices(m, rank - 2, side) for m, side in zip(maps_of(op), ("lhs", "rhs")))
    lhs_at = lambda b: [b[p] if p is not None else zero for p in lhs_batch]
    rhs_at = lambda b: [b[p] if p is not None else zero for p in rhs_batch]
    elt_bytes = elt.width // 8
    width = max(1, vector_bytes // elt_bytes)
    vtype = ir.VectorType.get([width], elt)
    # widening (F16 or BF16 operands, F32 sums): each value is extended once, as loaded
    narrow = ir.MemRefType(rhs.type).element_type  # what rhs vectors are loaded as (lhs: scalars, each widened; tiles: copies)
    in_bytes = narrow.width // 8
    nvtype = lambda vt: vt if vt is None or narrow == elt else ir.VectorType.get(vt.shape, narrow)
    widen, mac = _widen_and_mac(elt, options.fma)
    # elements in one cache line of what the non-temporal stores write (the slot, of rhs's
    # type; a whole line per store), or of the sums; a widening fused matmul's vectors
    # cover at least a whole line of its narrow slot
    slot_bytes = in_bytes if slot is not None else elt_bytes
    line = max(1, NT_ALIGN // slot_bytes)
    if slot is not None and width % line:
        width = -(-width // line) * line
        vtype = ir.VectorType.get([width], elt)
    use_vectors = acc_t.shape[-1] == DYN or acc_t.shape[-1] >= width
    # the row lengths (in lines: vectors of `line`) whose sums stay in registers: when N is
    # symbolic, one line or whole vectors (a run-time switch, a case each), up to the most that fit
    line_vtype = ir.VectorType.get([line], elt)
    most, n_static = options.register_row_bytes // (line * elt_bytes), acc_t.shape[-1]
    if n_static == DYN:
        register_vectors = sorted({1, *range(width // line, most + 1, width // line)} & set(range(1, most + 1)))
    else:
        register_vectors = [n_static // line] if n_static % line == 0 and 0 < n_static // line <= most else []
    rhs_k_stride = list(memref.ExtractStridedMetadataOp(rhs).strides)[-2]
    if unroll > 1:  # rhs rows short and nearly back to back: one row at a time streams them best
        row_bytes = arith.MulIOp(N, cst(in_bytes)).result
        gap_bytes = arith.MulIOp(arith.SubIOp(rhs_k_stride, N).result, cst(in_bytes)).result
        short_dense_rows = arith.AndIOp(
            arith.CmpIOp(arith.CmpIPredicate.ule, row_bytes, cst(options.row_at_a_time_bytes)).result,
            arith.CmpIOp(arith.CmpIPredicate.ule, gap_bytes, cst(options.row_at_a_time_gap_bytes)).result).result
    K_last, N_last = arith.SubIOp(K, one).result, arith.SubIOp(N, one).result
    if slot is not None:  # where slot rows start, to align the non-temporal stores
        meta = memref.ExtractStridedMetadataOp(slot)
        slot_base = memref.ExtractAlignedPointerAsIndexOp(slot).result
        slot_offset, slot_strides = meta.offset, list(meta.strides)

    def slot_address(indices):
        """The byte address of slot[*indices, 0, ...]."""
        lin = slot_offset
        for i, stride in zip(indices, slot_strides):
            lin = arith.AddIOp(lin, arith.MulIOp(i, stride).result).result
        return arith.AddIOp(slot_base, arith.MulIOp(lin, cst(slot_bytes)).result).result

    def rows(outer, k0, count, prefetch=False, side=False):
        """acc[b, i, :] += lhs[b, i, k] * rhs[b, k, :] for each row i of outer = (b, [i, ...])
        and k = k0, ..., k0+count-1, in order, each rhs vector loaded once for all the rows
        (and slot[b, k, :] = rhs[b, k, :], with non-temporal stores, when fused); with
        `prefetch` (one row a step), each vector step also prefetches its lines
        `rows_ahead` rows past it; with `side` (rows side by side), each row's lines
        `side-prefetch-bytes` further along it (N - 1 at most)."""
        b, ii = outer
        ks = [k0] + [arith.AddIOp(k0, cst(u)).result for u in range(1, count)]
        xs = [[widen(memref.LoadOp(lhs, [*lhs_at(b), i, k]).result) for k in ks] for i in ii]
        if prefetch:  # the row's lines `rows_ahead` rows past it (the last row at most)
            assert count == 1, "only steps of one row prefetch"
            aheads = [arith.MinUIOp(arith.AddIOp(k0, rows_ahead).result, K_last).result]

        def step(j, vt, nontemporal):
            """One step at j: a vector of type `vt`, or one element if vt is None; the
            slot copy with non-temporal stores if `nontemporal`, else plain ones."""
            if vt is not None:
                load = lambda m, ix: vector.LoadOp(vt, m, ix).result
                rhs_load = lambda t, ix: vector.LoadOp(t, rhs, ix).result
                store = lambda v, m, ix: vector.StoreOp(v, m, ix)
                xv = [[vector.BroadcastOp(vt, x).result for x in row] for row in xs]
            else:
                load = lambda m, ix: memref.LoadOp(m, ix).result
                rhs_load = lambda t, ix: memref.LoadOp(rhs, ix).result
                store = lambda v, m, ix: memref.StoreOp(v, m, ix)
                xv = xs
            sums = [load(acc, [*b, i, j]) for i in ii]
            if prefetch and vt is not None:  # every line of the step: rows are back to back, the lines aligned or not
                for ahead in aheads:
                    for off in range(0, vt.shape[0], NT_ALIGN // in_bytes):
                        memref.PrefetchOp(rhs, [*rhs_at(b), ahead, arith.AddIOp(j, cst(off)).result], False,
                                          4 - options.prefetch_level, True)
            if side and vt is not None:  # each row's lines of the step, further along the row
                ahead = [arith.MinUIOp(arith.AddIOp(j, cst(off + options.side_prefetch_bytes // in_bytes)).result,
                                       N_last).result for off in range(0, vt.shape[0], NT_ALIGN // in_bytes)]
                for k in ks:
                    for jp in ahead:
                        memref.PrefetchOp(rhs, [*rhs_at(b), k, jp], False, 4 - options.prefetch_level, True)
            for u, k in enumerate(ks):
                y = rhs_load(nvtype(vt), [*rhs_at(b), k, j])
                wide = widen(y)
                sums = [mac(a, row[u], wide) for a, row in zip(sums, xv)]
                if slot is not None and vt is not None and nontemporal:
                    vector.StoreOp(y, slot, [*b, k, j], nontemporal=True, alignment=NT_ALIGN)
                elif slot is not None:
                    memref.StoreOp(y, slot, [*b, k, j])
            for i, a in zip(ii, sums):
                store(a, acc, [*b, i, j])

        def steps(lo, hi, w, vt, nontemporal=False):
            """Steps of w elements from lo while a whole one fits below hi; returns where they end."""
            w = cst(w)
            end = arith.AddIOp(lo, arith.SubIOp(arith.SubIOp(hi, lo).result,
                                                arith.RemUIOp(arith.SubIOp(hi, lo).result, w).result).result).result
            loop(lo, end, w, lambda j: step(j, vt, nontemporal))
            return end

        start = zero
        if slot is not None and use_vectors:  # plain steps up to the slot row's first NT_ALIGN boundary (at most N)
            addr = slot_address([*b, ks[0]])
            gap = arith.RemUIOp(arith.SubIOp(cst(NT_ALIGN), arith.RemUIOp(addr, cst(NT_ALIGN)).result).result,
                                cst(NT_ALIGN)).result
            start = arith.MinUIOp(arith.DivUIOp(gap, cst(slot_bytes)).result, N).result
            loop(zero, start, one, lambda j: step(j, None, False))
        end = start
        if use_vectors:
            end = steps(start, N, width, vtype, nontemporal=True)
            if line < width:  # the tail's whole lines (slot-aligned, so non-temporal too)
                end = steps(end, N, line, ir.VectorType.get([line], elt), nontemporal=True)
        loop(end, N, one, lambda j: step(j, None, False))

    def rows_in_registers(outer, n_vectors):
        """acc[b, i, :] += lhs[b, i, k] * rhs[b, k, :] for each row i of outer = (b, [i, ...])
        (and, fused, slot[b, k, :] = rhs[b, k, :]) for every k, in order, with the rows of
        sums (`n_vectors` lines each) carried in registers, each rhs vector loaded once."""
        b, ii = outer
        js = [cst(v * line) for v in range(n_vectors)]
        at = [(i, j) for i in ii for j in js]  # the carried sums' places, row by row

        def add_row(k, *sums):
            xs = {i: vector.BroadcastOp(line_vtype, widen(memref.LoadOp(lhs, [*lhs_at(b), i, k]).result)).result
                  for i in ii}
            new = list(sums)
            for j in js:
                y = vector.LoadOp(nvtype(line_vtype), rhs, [*rhs_at(b), k, j]).result
                wide = widen(y)
                for n, (i, jj) in enumerate(at):
                    if jj is j:
                        new[n] = mac(sums[n], xs[i], wide)
                if slot is not None:
                    vector.StoreOp(y, slot, [*b, k, j], nontemporal=True, alignment=NT_ALIGN)
            return new
        sums = loop(zero, K, one, add_row, [vector.LoadOp(line_vtype, acc, [*b, i, j]).result for i, j in at])
        for (i, j), a in zip(at, sums):
            vector.StoreOp(a, acc, [*b, i, j])

    def vectors_in_registers(outer):
        """N / line if the row of sums is a whole number of lines and, when fused, every
        slot row starts on an NT_ALIGN boundary; 0 if not."""
        bad = arith.RemUIOp(N, cst(line)).result
        if slot is not None:
            row = arith.MulIOp(slot_strides[-2], cst(slot_bytes)).result
            for misaligned in (slot_address(outer[0]), row):
                bad = arith.OrIOp(bad, arith.RemUIOp(misaligned, cst(NT_ALIGN)).result).result
        ok = arith.CmpIOp(arith.CmpIPredicate.eq, bad, zero).result
        return arith.SelectOp(ok, arith.DivUIOp(N, cst(line)).result, zero).result

    def in_blocks(outer, unroll, prefetch=False, side=False):
        """Every k, `unroll` rows of rhs per pass over j, then the last ones alone;
        `prefetch` with one row a step only."""
        if unroll == 1:
            return loop(zero, K, one, lambda k: rows(outer, k, 1, prefetch))
        u = cst(unroll)
        k_main = arith.SubIOp(K, arith.RemUIOp(K, u).result).result
        loop(zero, k_main, u, lambda k: rows(outer, k, unroll, side=side))
        loop(k_main, K, one, lambda k: rows(outer, k, 1))

    # a fused matmul's slot rows each start at their own alignment: one row per step
    step_rows = options.step_rows if narrow == elt and slot is None else 1
    # only steps of one row prefetch (several side by side are streams the hardware follows)
    prefetch = options.prefetch_bytes > 0 and slot is None and step_rows == 1
    if prefetch:  # whole rows of rhs, at least prefetch-bytes and at least one
        stride_bytes = arith.MulIOp(rhs_k_stride, cst(in_bytes)).result
        rows_ahead = arith.MaxUIOp(arith.DivUIOp(arith.AddIOp(stride_bytes, cst(options.prefetch_bytes - 1)).result,
                                                 arith.MaxUIOp(stride_bytes, one).result).result, one).result

    def rows_one_at_a_time(outer):
        if unroll == 1:
            return in_blocks(outer, step_rows, prefetch)

        def then():
            in_blocks(outer, step_rows, prefetch)
            scf.YieldOp([])

        def otherwise():
            in_blocks(outer, unroll, side=options.side_prefetch_bytes > 0 and slot is None)
            scf.YieldOp([])
        if_op = scf.IfOp(short_dense_rows, has_else=True)
        with ir.InsertionPoint(if_op.then_block):
            then()
        with ir.InsertionPoint(if_op.else_block):
            otherwise()

    def per_row(outer):
        """The rows of outer = (b, [i, ...]) together: sums in registers where they fit."""
        fits = [n for n in register_vectors if n * len(outer[1]) <= max(1, most) * MULTI_ROW_REGISTERS]
        if not fits:
            return rows_one_at_a_time(outer)

        def case(switch, i, n_vectors):
            rows_in_registers(outer, n_vectors)
            scf.YieldOp([])

        def default(switch):
            rows_one_at_a_time(outer)
            scf.YieldOp([])
        scf.IndexSwitchOp([], vectors_in_registers(outer), fits, case, default)

    # a register tile's vectors: `vector-bytes`, or one row of the tile if that is shorter
    # (tile-row-bytes=64, a target without AVX-512: 4 rows x 1 vector<16xf32> of sums are 8
    # of AVX2's 16 registers)
    t_bytes = min(vector_bytes, options.tile_row_bytes)
    t_width = max(1, t_bytes // elt_bytes)
    t_vtype, t_nv = ir.VectorType.get([t_width], elt), max(1, options.tile_row_bytes // t_bytes)

    def tile(b, i0, mr, jb, nv, masked, k_lo, k_hi, packed):
        """acc[b, i0:i0+mr, jb:jb+nv*t_width] += lhs[b, i0:i0+mr, k_lo:k_hi] @ rhs[b, k_lo:k_hi, jb:jb+nv*t_width],
        each element in k order, with the mr x nv vectors of sums in registers while k runs;
        `masked`: the columns from N on are neither read nor written; rhs's block read from
        `packed` (its copy, rows back to back) if given."""
        rows = [i0] + [arith.AddIOp(i0, cst(r)).result for r in range(1, mr)]
        js = [jb] + [arith.AddIOp(jb, cst(v * t_width)).result for v in range(1, nv)]
        mask_t = ir.VectorType.get([t_width], ir.IntegerType.get_signless(1))
        masks = [vector.CreateMaskOp(mask_t, [arith.SubIOp(N, j).result]).result for j in js] if masked else []
        pads = {t: arith.ConstantOp(t, ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(t.element_type, 0.0))).result
                for t in dict.fromkeys((t_vtype, nvtype(t_vtype)))} if masked else {}  # in order: the same IR each run

        def load(t, m, ix, v):
            if not masked:
                return vector.LoadOp(t, m, ix).result
            return vector.MaskedLoadOp(t, m, ix, masks[v], pads[t]).result

        offsets = [cst(v * t_width) for v in range(nv)]  # columns of the packed block
        if lhs_buffer is not None:  # the tile's rows of a narrow lhs, widened once for all its columns
            for r, i in enumerate(rows):
                widen_lhs_row(b, i, r, k_lo, k_hi)
            buffer_rows = [cst(r) for r in range(mr)]

        def add_row(k, *sums):
            if packed is not None:
                row = arith.SubIOp(k, k_lo).result
                ys = [vector.LoadOp(t_vtype, packed, [row, o]).result for o in offsets]  # widened when packed
            else:
                ys = [widen(load(nvtype(t_vtype), rhs, [*rhs_at(b), k, j], v)) for v, j in enumerate(js)]
            new = []
            for r, i in enumerate(rows):
                x = memref.LoadOp(lhs_buffer, [buffer_rows[r], arith.SubIOp(k, k_lo).result]).result if lhs_buffer is not None \
                    else widen(memref.LoadOp(lhs, [*lhs_at(b), i, k]).result)
                x = vector.BroadcastOp(t_vtype, x).result
                new += [mac(sums[r * nv + v], x, y) for v, y in enumerate(ys)]
            return new
        at = [(i, v, j) for i in rows for v, j in enumerate(js)]
        sums = loop(k_lo, k_hi, one, add_row, [load(t_vtype, acc, [*b, i, j], v) for i, v, j in at])
        for a, (i, v, j) in zip(sums, at):
            if masked:
                vector.MaskedStoreOp(acc, [*b, i, j], masks[v], a)
            else:
                vector.StoreOp(a, acc, [*b, i, j])

    def widen_lhs_row(b, i, r, k_lo, k_hi):
        """lhs_buffer[r, :k_hi - k_lo] = lhs[b, i, k_lo:k_hi] widened: vectors of 16 (one F32 line), then
        the last elements one by one (no masked load: a BF16 one needs a libcall on some x86)."""
        x_t, row = ir.VectorType.get([line], lhs_elt), cst(r)
        n = arith.SubIOp(k_hi, k_lo).result
        whole = arith.SubIOp(n, arith.RemUIOp(n, cst(line)).result).result
        loop(zero, whole, cst(line), lambda c: vector.StoreOp(
            widen(vector.LoadOp(x_t, lhs, [*lhs_at(b), i, arith.AddIOp(k_lo, c).result]).result), lhs_buffer, [row, c]))
        loop(whole, n, one, lambda c: memref.StoreOp(
            widen(memref.LoadOp(lhs, [*lhs_at(b), i, arith.AddIOp(k_lo, c).result]).result), lhs_buffer, [row, c]))

    def tiles(b, rows_end):
        """Rows 0 to rows_end (a multiple of `tile-rows`) of batch b in register tiles: for
        each block of `tile-k-rows` rows of rhs (k in order: the sums go to acc and come
        back between blocks) and each block of its columns, every tile of rows, so that
        block of rhs stays in cache; the last block of columns, partial, masked."""
        mr, nv = options.tile_rows, t_nv
        bw, step, kc = cst(nv * t_width), cst(mr), cst(pack_rows)
        full = arith.SubIOp(N, arith.RemUIOp(N, bw).result).result
        mask_t = ir.VectorType.get([t_width], ir.IntegerType.get_signless(1))
        pad = arith.ConstantOp(nvtype(t_vtype), ir.DenseElementsAttr.get_splat(nvtype(t_vtype), ir.FloatAttr.get(narrow, 0.0)))
        zeros = arith.ConstantOp(t_vtype, ir.DenseElementsAttr.get_splat(t_vtype, ir.FloatAttr.get(elt, 0.0))) if bf16 else None

        def pack(jb, masked, k_lo, k_hi):
            js = [arith.AddIOp(jb, cst(v * t_width)).result for v in range(nv)]
            masks = [vector.CreateMaskOp(mask_t, [arith.SubIOp(N, j).result]).result for j in js] if masked else []
            offsets = [cst(v * t_width) for v in range(nv)]

            def copy_row(k):
                row = arith.SubIOp(k, k_lo).result
                for v, (j, o) in enumerate(zip(js, offsets)):
                    ix = [*rhs_at(b), k, j]
                    if masked and bf16:  # zeros, then the columns below N one by one
                        vector.StoreOp(zeros.result, packed, [row, o])
                        loop(j, arith.MinUIOp(arith.AddIOp(j, cst(t_width)).result, N).result, one, lambda c, j=j, o=o:
                             memref.StoreOp(widen(memref.LoadOp(rhs, [*rhs_at(b), k, c]).result), packed,
                                            [row, arith.AddIOp(o, arith.SubIOp(c, j).result).result]))
                        continue
                    y = vector.MaskedLoadOp(nvtype(t_vtype), rhs, ix, masks[v], pad.result).result if masked else \
                        vector.LoadOp(nvtype(t_vtype), rhs, ix).result
                    vector.StoreOp(widen(y), packed, [row, o])
            loop(k_lo, k_hi, one, copy_row)
        packed = pack_buffer

        def k_block(k_lo):
            k_hi = arith.MinUIOp(arith.AddIOp(k_lo, kc).result, K).result
            for lo, hi, masked in ((zero, full, False), (full, N, True)):
                def column_block(jb, masked=masked):
                    def tiles_from(src):  # src: the block's copy (packed first), or None for rhs in place
                        if src is not None:
                            pack(jb, masked, k_lo, k_hi)
                        loop(zero, rows_end, step, lambda i: tile(b, i, mr, jb, nv, masked, k_lo, k_hi, src))
                    if packed is None or pack_aliased is None:
                        tiles_from(packed)
                    else:  # copied only where the rows are a multiple of PACK_ALIAS_BYTES apart
                        if_op = scf.IfOp(pack_aliased, has_else=True)
                        for block, src in ((if_op.then_block, packed), (if_op.else_block, None)):
                            with ir.InsertionPoint(block):
                                tiles_from(src)
                                scf.YieldOp([])
                loop(lo, hi, bw, column_block)
        loop(zero, K, kc, k_block)

    use_tiles = options.tile_rows > 1 and slot is None and (acc_t.shape[-2] == DYN or acc_t.shape[-2] >= options.tile_rows)
    # a block of rhs copied rows back to back, on the stack (one buffer per function and type): rhs rows a
    # power of two apart (N = 512, 4096) would otherwise fall into a few cache sets and
    # evict each other while the row tiles read the block
    k_static = ir.MemRefType(rhs.type).shape[-2]
    pack_rows = options.tile_k_rows if k_static == DYN else max(1, min(options.tile_k_rows, k_static))
    if narrow != elt:
        pack_rows = max(1, min(pack_rows, WIDENED_BLOCK_BYTES // (t_nv * t_width * elt_bytes)))
    # in the sums' type: a narrow rhs (F16, BF16 weights) is widened once as it is copied, not
    # once per tile of rows that reads it
    pack_type = ir.MemRefType.get([pack_rows, t_nv * t_width], elt)
    # BF16 is always packed, its last partial block copied element by element: LLVM lowers a
    # masked BF16 vector load, on x86 without AVX-512, through __truncsfbf2 (not in every libgcc)
    bf16 = str(narrow) == "bf16"
    pack_buffer = stack_buffer(pack_type) if use_tiles and (options.pack or bf16) else None
    # rhs of the sums' own type is copied only where its rows are a multiple of
    # PACK_ALIAS_BYTES apart (known at run time: a weight's columns split by threads keep its
    # stride): elsewhere the tiles read it in place, faster than copying it first (the Intel
    # VM: 32x512x512 F32, 101 -> 127 GFLOP/s; 256x1536x576, 146 -> 170); a narrow one
    # is always copied, widened once for all the tiles
    pack_aliased = None
    if pack_buffer is not None and narrow == elt:
        stride_bytes = arith.MulIOp(rhs_k_stride, cst(elt_bytes)).result
        pack_aliased = arith.CmpIOp(arith.CmpIPredicate.eq, arith.RemUIOp(stride_bytes, cst(PACK_ALIAS_BYTES)).result,
                                    zero).result
    # a narrow lhs (F16 activations): each tile's rows of a block of k, widened once for all the
    # tile's columns (widening each scalar as the k loop reads it cost as much as the multiplies)
    lhs_elt = ir.MemRefType(lhs.type).element_type
    lhs_buffer = stack_buffer(ir.MemRefType.get([options.tile_rows, pack_rows], elt)) if use_tiles and lhs_elt != elt \
        else None

    def per_batch(b):
        """Whole tiles of rows (not for a fused matmul, whose copy wants each rhs row
        once), then each remaining row alone; a few rows, static and no tile, together
        (the query rows of a grouped-query head: each row of rhs read once for them all)."""
        mr, rows_end = options.tile_rows, zero
        if use_tiles:
            rows_end = arith.SubIOp(I, arith.RemUIOp(I, cst(mr)).result).result
            if acc_t.shape[-2] != DYN:
                tiles(b, rows_end)
            else:  # no block of rhs is copied for no tile
                if_op = scf.IfOp(arith.CmpIOp(arith.CmpIPredicate.ugt, rows_end, zero).result)
                with ir.InsertionPoint(if_op.then_block):
                    tiles(b, rows_end)
                    scf.YieldOp([])
        n_static = acc_t.shape[-2]
        if not use_tiles and n_static != DYN and 1 < n_static <= options.group_rows:
            return per_row((b, [cst(i) for i in range(n_static)]))
        loop(rows_end, I, one, lambda i: per_row((b, [i])))

    nest(sizes[:-2], per_batch)


