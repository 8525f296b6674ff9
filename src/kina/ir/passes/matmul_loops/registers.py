"""matmul-loops, sums in registers: short rows of sums, or a few rows at once, carried in
vector registers while k runs.

A matmul whose output rows are short (a whole number of 64-byte lines, at most
`register-row-bytes`, like one attention head's values; checked at run time when the
length is symbolic) keeps the whole output row in vector registers while k runs, in the
same k order: each rhs row costs its loads (and, fused, its non-temporal stores) and
nothing else (rows-in-registers). A fused one needs every slot row to start on an
NT_ALIGN boundary, checked at run time; a misaligned slot takes the row loops.

A matmul of a few static rows (2 to `group-rows`) too few for a register tile, such as a
grouped-query head's G query rows against its cache (q[1, Hk, G, Dh] @ Kᵀ[1, Hk, Dh, S],
then probs @ V), takes them together (group-rows): each step loads the sums of every row,
then each rhs vector once, added into every row's sums in k order:

    %a0 = vector.load %acc[%b, 0, %j]   %a1 = vector.load %acc[%b, 1, %j]   ...
    %y0 = vector.load %k[%k0, %j]
    %a0' = %a0 + %x00 * %y0             %a1' = %a1 + %x10 * %y0             ...

so the cache is read once for the group, not once per row (the same bits: each row's
sums keep their k order). Rows in registers count their sums in 64-byte lines then, the
group's at most MULTI_ROW_REGISTERS times one row's most.

In:  a `Matmul` and its rows outer = (batch indices, [i, ...]).
Out: `per_row(mat, outer)`: a run-time switch on the row's length in lines, a case per
     length whose sums fit in registers, the row loops (`rows.one_at_a_time`) otherwise.
"""
from __future__ import annotations

from mlir.dialects import arith, memref, scf, vector

from ...irbuild import index
from .._util import loop
from .choose import NT_ALIGN
from .loops import Matmul
from .rows import one_at_a_time

# rows taken together (group-rows) keep their sums in registers while those total at most this
# many times one row's most (register-row-bytes)
MULTI_ROW_REGISTERS = 2



def per_row(mat: Matmul, outer) -> None:
    """The rows of outer = (b, [i, ...]) together: sums in registers where they fit."""
    fits = [n for n in mat.choice.register_vectors if n * len(outer[1]) <= max(1, mat.choice.most) * MULTI_ROW_REGISTERS]
    if not fits:
        return one_at_a_time(mat, outer)

    def case(switch, i, n_vectors):
        rows_in_registers(mat, outer, n_vectors)
        scf.YieldOp([])

    def default(switch):
        one_at_a_time(mat, outer)
        scf.YieldOp([])
    scf.IndexSwitchOp([], vectors_in_registers(mat, outer), fits, case, default)



def rows_in_registers(mat: Matmul, outer, n_vectors):
    """acc[b, i, :] += lhs[b, i, k] * rhs[b, k, :] for each row i of outer = (b, [i, ...])
    (and, fused, slot[b, k, :] = rhs[b, k, :]) for every k, in order, with the rows of
    sums (`n_vectors` lines each) carried in registers, each rhs vector loaded once."""
    b, ii = outer
    js = [index(v * mat.line) for v in range(n_vectors)]
    at = [(i, j) for i in ii for j in js]  # the carried sums' places, row by row

    def add_row(k, *sums):
        xs = {i: vector.BroadcastOp(mat.line_vtype, mat.widen(memref.LoadOp(mat.lhs, [*mat.lhs_at(b), i, k]).result)).result
              for i in ii}
        new = list(sums)
        for j in js:
            y = vector.LoadOp(mat.nvtype(mat.line_vtype), mat.rhs, [*mat.rhs_at(b), k, j]).result
            wide = mat.widen(y)
            for n, (i, jj) in enumerate(at):
                if jj is j:
                    new[n] = mat.mac(sums[n], xs[i], wide)
            if mat.slot is not None:
                vector.StoreOp(y, mat.slot, [*b, k, j], nontemporal=True, alignment=NT_ALIGN)
        return new
    sums = loop(mat.zero, mat.K, mat.one, add_row, [vector.LoadOp(mat.line_vtype, mat.acc, [*b, i, j]).result for i, j in at])
    for (i, j), a in zip(at, sums):
        vector.StoreOp(a, mat.acc, [*b, i, j])



def vectors_in_registers(mat: Matmul, outer):
    """N / line if the row of sums is a whole number of lines and, when fused, every
    slot row starts on an NT_ALIGN boundary; 0 if not."""
    bad = arith.RemUIOp(mat.N, index(mat.line)).result
    if mat.slot is not None:
        row = arith.MulIOp(mat.slot_strides[-2], index(mat.slot_bytes)).result
        for misaligned in (mat.slot_address(outer[0]), row):
            bad = arith.OrIOp(bad, arith.RemUIOp(misaligned, index(NT_ALIGN)).result).result
    ok = arith.CmpIOp(arith.CmpIPredicate.eq, bad, mat.zero).result
    return arith.SelectOp(ok, arith.DivUIOp(mat.N, index(mat.line)).result, mat.zero).result
