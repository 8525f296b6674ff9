"""matmul-loops: after bufferization, each matmul `linalg.generic` becomes explicit loops.

    linalg.generic {matmul maps} ins(%q, %k : memref<1x4xf32, ...>, memref<4x8xf32, ...>)
                                 outs(%acc : memref<1x8xf32, ...>)   // acc + x * y
becomes, for each (batch..., i) and each block of `unroll` consecutive k (an option, 8),
    scf.for %j = ... step 32 {                       // explicit vector<32xf32>
      %a = vector.load %acc[%i, %j]
      %y0 = vector.load %k[%k0, %j]  ...  %y7 = vector.load %k[%k7, %j]
      %a' = ((%a + %x0 * %y0) + %x1 * %y1) ... + %x7 * %y7
      vector.store %a', %acc[%i, %j]
    } {kina.matmul_strategy = "unroll-and-jam"}
then vector<16xf32> steps (one 64-byte line each) and a scalar tail.

Every output element still sums over k in ascending order, as fmul then fadd, so the
results are bit-identical to convert-linalg-to-loops' plain (batch..., i, k, j) loops,
whatever loops a matmul gets. Which it gets is chosen before any is emitted
(`choose.py`: `choose(op, options)`, from its form, types, static sizes and the options),
one of choose.STRATEGIES, each emitted by its own module, and stamped on the loops it
emits as `kina.matmul_strategy`:

    register-tiles     tiles.py      many rows (prefill): tiles of rows, sums in registers
    group-rows         registers.py  a few static rows together (a grouped-query head)
    rows-in-registers  registers.py  short rows of sums carried in registers
    unroll-and-jam     rows.py       each row alone, rhs rows side by side (or one at a
                                     time where they are short and back to back)
    row-at-a-time      rows.py       each row alone, one rhs row at a time (split-k's chunks)
    dot-rows           dot_rows.py   rhs runs along k (a transposed view): dot products
    fused-copy         rows.py       the matmul also copies rhs into a concat's slot

(`loops.py` holds what every emitter reads: the operands, sizes and types.) A matmul whose
batch dims broadcast (`x[B, S, 512] @ W[512, N]`, or a batch dim of size 1 stretched)
runs the same loops, reading each operand at its own batch indices (index 0 along a
stretched dim). A widening matmul (F16 or BF16 operands, F32 sums: the reference body
extends x and y) runs them too, each loaded vector (and each lhs scalar) extended once,
then the F32 multiply and add (register tiles widen into their copies instead); it reads
half the bytes of an F32 one. A mixed one (F32 activations against F16 or BF16 weights,
or the other way round: only the narrow operand is extended) runs them too, each operand
loaded as its own type.

A fused matmul (fuse-concat-matmul: it also copies its rhs into a concat's slot) goes
one row at a time and writes the copy with non-temporal stores, aligned whole lines of
the slot (rows.py; fence-nontemporal then orders them before the function returns).
Where the slot is rhs's own memory (checked at run time: the same first element and
strides), the copy is left out and the matmul runs as a plain one: a cache held in
one buffer, its filled part passed as the past and the same buffer one position
longer as the concat (kina.models' StoryCache), is appended in place:

    scf.if (same_memory(%k_past, %slot)) { <the plain matmul's loops> }
    else { <the fused loops> } {kina.matmul_strategy = "fused-copy"}

In:  any module; after bufferization, when matmuls are on memrefs. Out: the same
module with every matmul it can take as loops, the outermost of which carry
`kina.matmul_strategy`.

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
from mlir.dialects import arith, linalg, memref, scf

from ...irbuild import DYN, index
from .._pass import KinaPass, option
from .._util import NO_MATCH, apply_patterns, loop, nest, same_memory
from .choose import NT_ALIGN, STRATEGY_ATTR, Choice, choose
from .dot_rows import emit_dot_rows
from .loops import Matmul
from .registers import per_row
from .tiles import Tiles


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
            choice = choose(op, self)
            if choice is None:
                return NO_MATCH
            block = op.operation.block
            ops = list(block.operations)
            at = _index(ops, op)
            previous = ops[at - 1] if at else None
            with rewriter.ip, op.location:
                emit(op, self, choice, lambda t: stack_buffer(op, t))
            ops = list(block.operations)
            emitted = ops[_index(ops, previous) + 1 if previous is not None else 0:_index(ops, op)]
            rewriter.erase_op(op.operation)
            for o in emitted:  # its outermost loops
                if len(o.regions):
                    o.attributes[STRATEGY_ATTR] = ir.StringAttr.get(choice.strategy)
        apply_patterns(module_op, {linalg.GenericOp: matmul})


def _index(ops, op) -> int:
    return next(i for i, o in enumerate(ops) if o.operation == op.operation)


def emit(op, options: MatmulLoops, choice: Choice, stack_buffer) -> None:
    """The loops of matmul `op` that `choice` says, at the insertion point."""
    if choice.strategy == "dot-rows":
        emit_dot_rows(op, options, choice)
    elif choice.strategy == "fused-copy":  # the copy only where the slot is not rhs's own memory
        if_op = scf.IfOp(same_memory(op.inputs[1], op.outputs[1]), has_else=True)
        for where, branch in ((if_op.then_block, choice.plain), (if_op.else_block, choice.fused)):
            with ir.InsertionPoint(where):
                emit_rows(op, options, branch, stack_buffer)
                scf.YieldOp([])
    else:
        emit_rows(op, options, choice, stack_buffer)


def emit_rows(op, options: MatmulLoops, choice: Choice, stack_buffer) -> None:
    """The loops of a matmul that goes by rows: per batch, whole register tiles of rows (not
    for a fused matmul's copy, which wants each rhs row once), then each remaining row
    alone; a few static rows with no tile together (the query rows of a grouped-query
    head: each row of rhs read once for them all)."""
    mat = Matmul(op, options, choice, stack_buffer)
    tiles = Tiles(mat) if choice.tiles else None

    def per_batch(b):
        rows_end = mat.zero
        if tiles is not None:
            rows_end = arith.SubIOp(mat.I, arith.RemUIOp(mat.I, index(options.tile_rows)).result).result
            if mat.acc_t.shape[-2] != DYN:
                tiles.run(b, rows_end)
            else:  # no block of rhs is copied for no tile
                if_op = scf.IfOp(arith.CmpIOp(arith.CmpIPredicate.ugt, rows_end, mat.zero).result)
                with ir.InsertionPoint(if_op.then_block):
                    tiles.run(b, rows_end)
                    scf.YieldOp([])
        if choice.group:
            return per_row(mat, (b, [index(i) for i in range(choice.group)]))
        loop(rows_end, mat.I, mat.one, lambda i: per_row(mat, (b, [i])))
    nest(mat.sizes[:-2], per_batch)
