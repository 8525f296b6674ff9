"""matmul-loops, one row at a time and unroll-and-jam: a row of sums, stepped along j.

    linalg.generic {matmul} ins(%x, %w : memref<1x576xf32>, memref<576x1536xf32>) outs(%acc ...)
becomes, for the row (and each batch index),
    scf.if %short_dense_rows {                   // rhs rows short and nearly back to back
      scf.for %k0 = 0 to 576 step 4 {            // `step-rows` rows of k a step
        scf.for %j = 0 to 1536 step 32 {
          %a = vector.load %acc[0, %j]
          %a' = (((%a + %x0 * %w[%k0, %j]) + %x1 * %w[%k0 + 1, %j]) + ...) + %x3 * %w[%k0 + 3, %j]
          vector.store %a', %acc[0, %j]
        }
      }
    } else {                                     // unroll-and-jam
      scf.for %k0 = 0 to 576 step 8 {            // `unroll` rows read side by side
        scf.for %j = 0 to 1536 step 32 { the same, 8 rows a step, each prefetched along itself }
      }
    }
then, in each j loop, vector<16xf32> steps (one 64-byte line each) and a scalar tail.

convert-linalg-to-loops would give (batch..., i, k, j) loops whose j loop streams
one rhs row at a time. Here one j loop reads `unroll` rows side by side (several
read streams at once) and adds their products to the accumulator in the order
k, k+1, ...: every output element still sums over k in ascending order, as fmul
then fadd, so results are bit-identical to the plain loops.

Which of the two is decided at run time from the rhs (unroll-and-jam): rows of at most
`row-at-a-time-bytes` whose gap to the next row is at most `row-at-a-time-gap-bytes`
go one row of k at a time, a single read stream over nearly contiguous memory,
with the row of sums in L1 (each vector of sums loaded, then `step-rows` rows added
to it in k order, then stored: fewer loads and stores of sums per weight); longer or
farther-apart rows take `unroll` at a time (scripts/bench_k_layout.py measures it; the
figures and the thresholds: docs/performance.md, "The Kᵀ layout"). A matmul marked
`kina.one_row_at_a_time` (split-k's chunks, whose rows are a weight's, back to back)
goes one row at a time only (row-at-a-time).

Where a step adds one row (step-rows=1, a widening matmul), each vector step also
prefetches its lines the whole rows ahead that cover `prefetch-bytes` (a decode
projection read one row at a time is one stream, which the hardware prefetchers alone
left at 70-80% of a contiguous read; docs/performance.md, "Decode at the
weight-bandwidth floor"); steps of several rows are streams the hardware keeps ahead of,
and have none. The prefetches fill L2 (`prefetch-level=2`, prefetcht1). The `unroll`
rows read side by side are prefetched along themselves, `side-prefetch-bytes` further
on, clamped to the row's last element (the hardware prefetchers stop at each 4 KiB page
of each of the 8 streams: docs/performance.md, "Long rows read side by side, prefetched
along").

A fused matmul's copy (fused-copy) goes one row at a time and writes the slot with
non-temporal stores: the copy is not read again here, so it need not be read into the
cache before it is written, nor evict what is there. Those are aligned whole lines: each
row's j loop starts with plain scalar steps up to the first NT_ALIGN-byte boundary of the
slot row, then takes aligned vectors (`vector-bytes`, then one line at a time) and ends
with plain scalars for the last partial line (all counted in the slot's elements: a
widening fused matmul, an F16 or BF16 model's attention, copies F16 rows, and its vector
steps cover whole lines of them). So every cache line of the slot is written one way only
(a line written partly both ways is slower than either), and none by scalar non-temporal
stores (each is a partial-line write to memory; the costs of both: docs/performance.md,
"Non-temporal stores").

In:  a `Matmul` and a row (or rows) of it: outer = (batch indices, [i, ...]).
Out: `one_at_a_time(mat, outer)`, the loops over k for those rows.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from ...irbuild import index
from .._util import loop
from .choose import NT_ALIGN
from .loops import Matmul



def one_at_a_time(mat: Matmul, outer) -> None:
    """Every k for the rows of outer: one rhs row (or `step-rows`) at a time where rhs rows are
    short and nearly back to back (checked at run time) or the choice says so, else
    `unroll` rows side by side."""
    if mat.choice.unroll == 1:
        return in_blocks(mat, outer, mat.choice.step_rows, mat.choice.prefetch)

    def then():
        in_blocks(mat, outer, mat.choice.step_rows, mat.choice.prefetch)
        scf.YieldOp([])

    def otherwise():
        in_blocks(mat, outer, mat.choice.unroll, side=mat.options.side_prefetch_bytes > 0 and mat.slot is None)
        scf.YieldOp([])
    if_op = scf.IfOp(mat.short_dense_rows, has_else=True)
    with ir.InsertionPoint(if_op.then_block):
        then()
    with ir.InsertionPoint(if_op.else_block):
        otherwise()



def in_blocks(mat: Matmul, outer, unroll, prefetch=False, side=False):
    """Every k, `unroll` rows of rhs per pass over j, then the last ones alone;
    `prefetch` with one row a step only."""
    if unroll == 1:
        return loop(mat.zero, mat.K, mat.one, lambda k: rows(mat, outer, k, 1, prefetch))
    u = index(unroll)
    k_main = arith.SubIOp(mat.K, arith.RemUIOp(mat.K, u).result).result
    loop(mat.zero, k_main, u, lambda k: rows(mat, outer, k, unroll, side=side))
    loop(k_main, mat.K, mat.one, lambda k: rows(mat, outer, k, 1))



def rows(mat: Matmul, outer, k0, count, prefetch=False, side=False):
    """acc[b, i, :] += lhs[b, i, k] * rhs[b, k, :] for each row i of outer = (b, [i, ...])
    and k = k0, ..., k0+count-1, in order, each rhs vector loaded once for all the rows
    (and slot[b, k, :] = rhs[b, k, :], with non-temporal stores, when fused); with
    `prefetch` (one row a step), each vector step also prefetches its lines
    `rows_ahead` rows past it; with `side` (rows side by side), each row's lines
    `side-prefetch-bytes` further along it (N - 1 at most)."""
    b, ii = outer
    ks = [k0] + [arith.AddIOp(k0, index(u)).result for u in range(1, count)]
    xs = [[mat.widen(memref.LoadOp(mat.lhs, [*mat.lhs_at(b), i, k]).result) for k in ks] for i in ii]
    if prefetch:  # the row's lines `rows_ahead` rows past it (the last row at most)
        assert count == 1, "only steps of one row prefetch"
        aheads = [arith.MinUIOp(arith.AddIOp(k0, mat.rows_ahead).result, mat.K_last).result]

    def step(j, vt, nontemporal):
        """One step at j: a vector of type `vt`, or one element if vt is None; the
        slot copy with non-temporal stores if `nontemporal`, else plain ones."""
        if vt is not None:
            load = lambda m, ix: vector.LoadOp(vt, m, ix).result
            rhs_load = lambda t, ix: vector.LoadOp(t, mat.rhs, ix).result
            store = lambda v, m, ix: vector.StoreOp(v, m, ix)
            xv = [[vector.BroadcastOp(vt, x).result for x in row] for row in xs]
        else:
            load = lambda m, ix: memref.LoadOp(m, ix).result
            rhs_load = lambda t, ix: memref.LoadOp(mat.rhs, ix).result
            store = lambda v, m, ix: memref.StoreOp(v, m, ix)
            xv = xs
        sums = [load(mat.acc, [*b, i, j]) for i in ii]
        if prefetch and vt is not None:  # every line of the step: rows are back to back, the lines aligned or not
            for ahead in aheads:
                for off in range(0, vt.shape[0], NT_ALIGN // mat.in_bytes):
                    memref.PrefetchOp(mat.rhs, [*mat.rhs_at(b), ahead, arith.AddIOp(j, index(off)).result], False,
                                      4 - mat.options.prefetch_level, True)
        if side and vt is not None:  # each row's lines of the step, further along the row
            ahead = [arith.MinUIOp(arith.AddIOp(j, index(off + mat.options.side_prefetch_bytes // mat.in_bytes)).result,
                                   mat.N_last).result for off in range(0, vt.shape[0], NT_ALIGN // mat.in_bytes)]
            for k in ks:
                for jp in ahead:
                    memref.PrefetchOp(mat.rhs, [*mat.rhs_at(b), k, jp], False, 4 - mat.options.prefetch_level, True)
        for u, k in enumerate(ks):
            y = rhs_load(mat.nvtype(vt), [*mat.rhs_at(b), k, j])
            wide = mat.widen(y)
            sums = [mat.mac(a, row[u], wide) for a, row in zip(sums, xv)]
            if mat.slot is not None and vt is not None and nontemporal:
                vector.StoreOp(y, mat.slot, [*b, k, j], nontemporal=True, alignment=NT_ALIGN)
            elif mat.slot is not None:
                memref.StoreOp(y, mat.slot, [*b, k, j])
        for i, a in zip(ii, sums):
            store(a, mat.acc, [*b, i, j])

    def steps(lo, hi, w, vt, nontemporal=False):
        """Steps of w elements from lo while a whole one fits below hi; returns where they end."""
        w = index(w)
        end = arith.AddIOp(lo, arith.SubIOp(arith.SubIOp(hi, lo).result,
                                            arith.RemUIOp(arith.SubIOp(hi, lo).result, w).result).result).result
        loop(lo, end, w, lambda j: step(j, vt, nontemporal))
        return end

    start = mat.zero
    if mat.slot is not None and mat.use_vectors:  # plain steps up to the slot row's first NT_ALIGN boundary (at most N)
        addr = mat.slot_address([*b, ks[0]])
        gap = arith.RemUIOp(arith.SubIOp(index(NT_ALIGN), arith.RemUIOp(addr, index(NT_ALIGN)).result).result,
                            index(NT_ALIGN)).result
        start = arith.MinUIOp(arith.DivUIOp(gap, index(mat.slot_bytes)).result, mat.N).result
        loop(mat.zero, start, mat.one, lambda j: step(j, None, False))
    end = start
    if mat.use_vectors:
        end = steps(start, mat.N, mat.width, mat.vtype, nontemporal=True)
        if mat.line < mat.width:  # the tail's whole lines (slot-aligned, so non-temporal too)
            end = steps(end, mat.N, mat.line, ir.VectorType.get([mat.line], mat.elt), nontemporal=True)
    loop(end, mat.N, mat.one, lambda j: step(j, None, False))
