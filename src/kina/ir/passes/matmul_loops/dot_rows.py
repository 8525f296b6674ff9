"""matmul-loops, dot products of rows: a matmul whose rhs runs along k as its lhs does.

A transposed view (a tied head's table[V, D] @ xᵀ, or x @ W[N, K]ᵀ) is dot products of
rows. The side with more rows goes `lanes` of them at a time (one 64-byte line of sums,
16 for F32):

    scf.for %k0 = 0 to K step 16 iter_args(%sums = <acc[i0..i0+15, j]>) {
      memref.prefetch %t[%i0 + 16 + r, %k0]  ...               // the next block's lines
      %r0 = vector.load %t[%i0, %k0] ... %r15 = vector.load %t[%i0 + 15, %k0]
      %c0, ..., %c15 = 4 rounds of 16 vector.shuffle's of %r0..%r15   // the square, transposed
      %sums' = ((%sums + %c0 * x[%k0]) + %c1 * x[%k0 + 1]) ... + %c15 * x[%k0 + 15]
    } {kina.matmul_strategy = "dot-rows"}

so lane r sums row r in k order, as the plain loops do; the last k and rows go one
at a time. A block of rows takes `transposed-columns` (16) columns of the other side
at once (a prompt's rows: each square is transposed once for all of them, each column
with its own vector of sums), then the rest in groups a quarter as wide. Which side's
rows are blocked is the choice's `blocked`: the static side's when one size is static
and the other symbolic (a weight against a prompt); when both are symbolic, the longer
side, chosen at run time. F16/BF16 rows are widened as loaded, the other side once into
an F32 copy.

In:  a matmul the choice calls "dot-rows". Out: its loops, at the insertion point.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from ...irbuild import DYN, index
from .._util import batch_indices, dim, loop, maps_of, nest, transposed_view
from .choose import NT_ALIGN, Choice
from .loops import widen_and_mac


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


def emit_dot_rows(op, options, choice: Choice) -> None:
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
    widen, mac = widen_and_mac(elt, options.fma)
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

    if choice.blocked is not None:  # the static side (a weight's rows) in blocks, the other in groups
        return blocked(choice.blocked)
    if_op = scf.IfOp(arith.CmpIOp(arith.CmpIPredicate.ugt, N, I).result, has_else=True)
    for where, along in ((if_op.then_block, "j"), (if_op.else_block, "i")):
        with ir.InsertionPoint(where):
            blocked(along)
            scf.YieldOp([])
