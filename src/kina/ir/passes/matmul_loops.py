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
with the row of sums in L1; longer or farther-apart rows take `unroll` at a time.
Short rows nearly back to back read fastest as one stream; with a gap, or long
rows, several streams at once win (scripts/bench_k_layout.py measures it; the
figures and the thresholds they gave: docs/performance.md, "The Kᵀ layout").
The order of the sums is the same either way.

A fused matmul (fuse-concat-matmul: it also copies its rhs into a concat's slot)
goes one row at a time and writes the copy with non-temporal stores: the copy is
not read again here, so it need not be read into the cache before it is written,
nor evict what is there. Those are aligned whole lines: each row's j loop starts
with plain scalar steps up to the first NT_ALIGN-byte boundary of the slot row,
then takes aligned vectors (`vector-bytes`, then one line at a time) and ends with
plain scalars for the last partial line. So every cache line of the slot is written
one way only (a line written partly both ways is slower than either), and none by
scalar non-temporal stores (each is a partial-line write to memory; the costs of
both: docs/performance.md, "Non-temporal stores"). fence-nontemporal then orders them before the function returns.

A matmul whose output rows are short (a whole number of vectors, at most
`register-row-bytes`, like one attention head's values; checked at run time when the
length is symbolic) keeps the whole output row in vector registers while k runs,
in the same k order: each rhs row costs its loads (and, fused, its non-temporal
stores) and nothing else. A fused one needs every slot row to start on an
NT_ALIGN boundary, checked at run time (the slot is a caller's buffer); a
misaligned slot takes the row-at-a-time loops.

A matmul whose batch dims broadcast (`x[B, S, 512] @ W[512, N]`, or a batch dim of
size 1 stretched) runs the same loops, reading each operand at its own batch
indices (index 0 along a stretched dim): the same order, the same bits.

In:  any module; after bufferization, when matmuls are on memrefs. Out: the same
module with every matmul it can take as loops.

Guarantees: only matmuls on memrefs whose operands share one element type (no
F16/BF16 widening) and have a unit innermost stride are rewritten; the others
(on tensors, widening, a non-strided layout) are left to convert-linalg-to-loops.
The options change the loops, never the order of the sums (each element's adds
stay in k order, by construction): any values give the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, linalg, memref, scf, vector

from ..irbuild import DYN, index
from ._pass import KinaPass, option
from ._util import NO_MATCH, apply_patterns, batch_indices, dim, loop, maps_of, matmul_form, nest, unit_innermost

NT_ALIGN = 64  # bytes: what a non-temporal vector store needs (a cache line), not a tuning choice


def _at_least_1(n: int) -> bool:
    return 1 <= n <= 64


def _whole_lines(n: int) -> bool:
    return 0 < n <= 4096 and n % NT_ALIGN == 0


def _non_negative(n: int) -> bool:
    return n >= 0


@dataclass(frozen=True)
class MatmulLoops(KinaPass):
    name = "matmul-loops"
    summary = ("matmul generics to unroll-and-jammed vector loops, short rows in registers, "
               "fused copies with non-temporal stores; same summation order")
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

    def run(self, module_op) -> None:
        def matmul(op, rewriter):
            kind = _kind(op)
            if kind is None:
                return NO_MATCH
            with rewriter.ip, op.location:
                _emit(op, self, 1 if kind == "fused" else self.unroll)
            rewriter.erase_op(op.operation)
        apply_patterns(module_op, {linalg.GenericOp: matmul})


def _kind(op) -> str | None:
    """The matmul form of `op` (`matmul_form`) if these loops can take it: on memrefs
    of one float element type, each unit-strided along its innermost dim (the loops
    load whole vectors along it)."""
    form = matmul_form(op)
    if form is None:
        return None
    operands = list(op.operands)
    if not all(unit_innermost(v.type) for v in operands):
        return None
    types = {v.type.element_type for v in operands}
    return form if len(types) == 1 and isinstance(next(iter(types)), ir.FloatType) else None


def _emit(op, options: MatmulLoops, unroll: int) -> None:
    vector_bytes = options.vector_bytes
    lhs, rhs = list(op.inputs)
    acc, *slot = list(op.outputs)
    slot = slot[0] if slot else None  # a fused matmul's concat slot, written with non-temporal stores
    acc_t = ir.MemRefType(acc.type)
    rank, elt = acc_t.rank, acc_t.element_type
    cst, zero, one = index, index(0), index(1)
    sizes = [dim(acc, a) for a in range(rank)]  # batch..., I, N
    K, N = dim(lhs, ir.MemRefType(lhs.type).rank - 1), sizes[-1]
    # each operand's batch indices from the loops' (a broadcast operand has fewer, or reads 0)
    lhs_batch, rhs_batch = (batch_indices(m, rank - 2, side) for m, side in zip(maps_of(op), ("lhs", "rhs")))
    lhs_at = lambda b: [b[p] if p is not None else zero for p in lhs_batch]
    rhs_at = lambda b: [b[p] if p is not None else zero for p in rhs_batch]
    elt_bytes = elt.width // 8
    width = max(1, vector_bytes // elt_bytes)
    vtype = ir.VectorType.get([width], elt)
    line = max(1, NT_ALIGN // elt_bytes)  # elements in one cache line (a whole non-temporal store)
    use_vectors = acc_t.shape[-1] == DYN or acc_t.shape[-1] >= width
    # the row lengths (in vectors) whose sums stay in registers: any that fits when N is symbolic
    most, n_static = options.register_row_bytes // (width * elt_bytes), acc_t.shape[-1]
    if n_static == DYN:
        register_vectors = list(range(1, most + 1))
    else:
        register_vectors = [n_static // width] if n_static % width == 0 and 0 < n_static // width <= most else []
    if unroll > 1:  # rhs rows short and nearly back to back: one row at a time streams them best
        rhs_k_stride = list(memref.ExtractStridedMetadataOp(rhs).strides)[-2]
        row_bytes = arith.MulIOp(N, cst(elt_bytes)).result
        gap_bytes = arith.MulIOp(arith.SubIOp(rhs_k_stride, N).result, cst(elt_bytes)).result
        short_dense_rows = arith.AndIOp(
            arith.CmpIOp(arith.CmpIPredicate.ule, row_bytes, cst(options.row_at_a_time_bytes)).result,
            arith.CmpIOp(arith.CmpIPredicate.ule, gap_bytes, cst(options.row_at_a_time_gap_bytes)).result).result
    if slot is not None:  # where slot rows start, to align the non-temporal stores
        meta = memref.ExtractStridedMetadataOp(slot)
        slot_base = memref.ExtractAlignedPointerAsIndexOp(slot).result
        slot_offset, slot_strides = meta.offset, list(meta.strides)

    def slot_address(indices):
        """The byte address of slot[*indices, 0, ...]."""
        lin = slot_offset
        for i, stride in zip(indices, slot_strides):
            lin = arith.AddIOp(lin, arith.MulIOp(i, stride).result).result
        return arith.AddIOp(slot_base, arith.MulIOp(lin, cst(elt_bytes)).result).result

    def rows(outer, k0, count):
        """acc[outer, :] += lhs[outer, k] * rhs[b, k, :] for k = k0, ..., k0+count-1, in order
        (and slot[b, k, :] = rhs[b, k, :], with non-temporal stores, when fused)."""
        b = outer[:-1]
        ks = [k0] + [arith.AddIOp(k0, cst(u)).result for u in range(1, count)]
        xs = [memref.LoadOp(lhs, [*lhs_at(b), outer[-1], k]).result for k in ks]

        def step(j, vt, nontemporal):
            """One step at j: a vector of type `vt`, or one element if vt is None; the
            slot copy with non-temporal stores if `nontemporal`, else plain ones."""
            if vt is not None:
                load = lambda m, ix: vector.LoadOp(vt, m, ix).result
                store = lambda v, m, ix: vector.StoreOp(v, m, ix)
                xv = [vector.BroadcastOp(vt, x).result for x in xs]
            else:
                load = lambda m, ix: memref.LoadOp(m, ix).result
                store = lambda v, m, ix: memref.StoreOp(v, m, ix)
                xv = xs
            a = load(acc, [*outer, j])
            for x, k in zip(xv, ks):
                y = load(rhs, [*rhs_at(b), k, j])
                a = arith.AddFOp(a, arith.MulFOp(x, y).result).result
                if slot is not None and vt is not None and nontemporal:
                    vector.StoreOp(y, slot, [*b, k, j], nontemporal=True, alignment=NT_ALIGN)
                elif slot is not None:
                    memref.StoreOp(y, slot, [*b, k, j])
            store(a, acc, [*outer, j])

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
            start = arith.MinUIOp(arith.DivUIOp(gap, cst(elt_bytes)).result, N).result
            loop(zero, start, one, lambda j: step(j, None, False))
        end = start
        if use_vectors:
            end = steps(start, N, width, vtype, nontemporal=True)
            if line < width:  # the tail's whole lines (slot-aligned, so non-temporal too)
                end = steps(end, N, line, ir.VectorType.get([line], elt), nontemporal=True)
        loop(end, N, one, lambda j: step(j, None, False))

    def rows_in_registers(outer, n_vectors):
        """acc[outer, :] += lhs[outer, k] * rhs[b, k, :] (and, fused, slot[b, k, :] = rhs[b, k, :])
        for every k, in order, with the row of sums (`n_vectors` vectors) carried in registers."""
        b = outer[:-1]
        js = [cst(v * width) for v in range(n_vectors)]

        def add_row(k, *sums):
            x = vector.BroadcastOp(vtype, memref.LoadOp(lhs, [*lhs_at(b), outer[-1], k]).result).result
            new = []
            for j, a in zip(js, sums):
                y = vector.LoadOp(vtype, rhs, [*rhs_at(b), k, j]).result
                new.append(arith.AddFOp(a, arith.MulFOp(x, y).result).result)
                if slot is not None:
                    vector.StoreOp(y, slot, [*b, k, j], nontemporal=True, alignment=NT_ALIGN)
            return new
        sums = loop(zero, K, one, add_row, [vector.LoadOp(vtype, acc, [*outer, j]).result for j in js])
        for j, a in zip(js, sums):
            vector.StoreOp(a, acc, [*outer, j])

    def vectors_in_registers(outer):
        """N / width if the row of sums is a whole number of vectors and, when fused, every
        slot row starts on an NT_ALIGN boundary; 0 if not."""
        bad = arith.RemUIOp(N, cst(width)).result
        if slot is not None:
            row = arith.MulIOp(slot_strides[-2], cst(elt_bytes)).result
            for misaligned in (slot_address(outer[:-1]), row):
                bad = arith.OrIOp(bad, arith.RemUIOp(misaligned, cst(NT_ALIGN)).result).result
        ok = arith.CmpIOp(arith.CmpIPredicate.eq, bad, zero).result
        return arith.SelectOp(ok, arith.DivUIOp(N, cst(width)).result, zero).result

    def in_blocks(outer):
        u = cst(unroll)
        k_main = arith.SubIOp(K, arith.RemUIOp(K, u).result).result
        loop(zero, k_main, u, lambda k: rows(outer, k, unroll))
        loop(k_main, K, one, lambda k: rows(outer, k, 1))

    def rows_one_at_a_time(outer):
        if unroll == 1:
            return loop(zero, K, one, lambda k: rows(outer, k, 1))

        def then():
            loop(zero, K, one, lambda k: rows(outer, k, 1))
            scf.YieldOp([])

        def otherwise():
            in_blocks(outer)
            scf.YieldOp([])
        if_op = scf.IfOp(short_dense_rows, has_else=True)
        with ir.InsertionPoint(if_op.then_block):
            then()
        with ir.InsertionPoint(if_op.else_block):
            otherwise()

    def per_row(outer):
        if not register_vectors:
            return rows_one_at_a_time(outer)

        def case(switch, i, n_vectors):
            rows_in_registers(outer, n_vectors)
            scf.YieldOp([])

        def default(switch):
            rows_one_at_a_time(outer)
            scf.YieldOp([])
        scf.IndexSwitchOp([], vectors_in_registers(outer), register_vectors, case, default)

    nest(sizes[:-1], per_row)


