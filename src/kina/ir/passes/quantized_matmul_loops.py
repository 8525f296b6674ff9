"""quantized-matmul-loops: a fused quantized matmul (fuse-dequant-matmul's, tiled) as vector loops.

    linalg.generic {kina.quantized = "Q4_1"} ins(%x : memref<1x1x18x32xf32>, %wt, %wt, ...)
                                             outs(%y : memref<1x1x36x16xf32>)
            // (b, i, jt, kb, e, jl): acc + x[b, i, kb, e] * element(bytes of column jt*16+jl, block kb, e)
becomes, for each row i (`rows` at a time) and `tiles` tiles of 16 columns at a time,

    %a0 = vector.load %y[%b, %i, %jt, 0] : vector<16xf32>     ... one vector of sums per row and tile
    scf.for %kb = 0 to 18 iter_args(%a0, ...) {
      %q = vector.load %wt[%jt, (%kb * 20 + 4) * 16] : vector<16xi8>   // byte 4 of 16 columns' block kb
      %w = d * float((q >> s) & 15) + m                         // the format's element, on 16 lanes
      %a0' = %a0 + broadcast(%x[%b, %i, %kb, e]) * %w           // each e of the block in order
    }
    vector.store %a0', %y[%b, %i, %jt, 0]

so each block of 16 columns is read once per row step and its weights widened in registers,
never written out. Every lane sums its column over k in ascending order as the generic's
body does (the element computed by the same formula, kina.dtypes): the same bits as the
reference's dequantize-then-matmul, unless `fma` (one rounding per multiply-add, as
matmul-loops{fma=true}). The element's scale times quant is exact in F32 for every format
(at most 11 + 7 + 6 significant bits), so its offset is added with one fused multiply-add
either way: the bits are unchanged. Loads of a block's bytes are shared by the elements
that read them (a nibble byte serves e and e + 16). Formats of 256-element blocks run
their eight sub-blocks of 32 in a loop, each unrolled.

In:  after bufferization and the threads pass (on memrefs, a part's subviews). Out: each
tiled fused quantized matmul as loops; one in GGUF's row layout is left to
convert-linalg-to-loops (correct, scalar).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from mlir import ir
from mlir.dialects import arith, math, memref, vector

from ... import dtypes
from ..blocks import Sym
from ..irbuild import DYN, index
from ._pass import KinaPass, option
from ._util import NO_MATCH, apply_patterns, dim, iterators_of, loop, nest
from .fuse_dequant_matmul import QUANTIZED, TILED

LANES = 16  # columns of a tile: one vector<16xf32> of sums


@dataclass(frozen=True)
class QuantizedMatmulLoops(KinaPass):
    name = "quantized-matmul-loops"
    summary = "fused quantized matmuls (tiled) to vector loops: 16 columns a vector, blocks widened in registers"
    optimisation = True
    rows: int = option(4, "rows of x a step takes at once (their sums in registers; the rest one at a time)",
                       check=lambda n: 1 <= n <= 8, expected="an integer from 1 to 8")
    tiles: int = option(4, "tiles of 16 columns a step takes at once", check=lambda n: 1 <= n <= 8,
                        expected="an integer from 1 to 8")
    fma: bool = option(False, "fused multiply-adds for the sums (one rounding per k): not the bits of -O0")
    block_sums: bool = option(False, "sum x * q over each group of a block first, then scale it and add the "
                              "group's offset times the sum of x (a * sum(x q) + c * sum(x): fewer operations, "
                              "the same values summed in another order: not the bits of -O0)")

    def run(self, module_op) -> None:
        def pattern(op, rewriter):
            if QUANTIZED not in op.attributes or TILED not in op.attributes:
                return NO_MATCH  # not tiled (GGUF's rows): left to convert-linalg-to-loops
            if not all(isinstance(v.type, ir.MemRefType) for v in op.operands):
                return NO_MATCH
            with rewriter.ip, op.location:
                _emit(op, self)
            rewriter.erase_op(op.operation)
        from mlir.dialects import linalg
        apply_patterns(module_op, {linalg.GenericOp: pattern})


class VectorBytes:
    """A format's byte reader (kina.dtypes) on 16 columns at once: byte `off` of block `kb` of the
    tile `row` of the tiled weight is one vector<16xi8> load; each is loaded once (memoized)."""

    def __init__(self, w, row, kb, size: int, split: bool = False):
        self.w, self.row, self.kb, self.size, self.split = w, row, kb, size, split
        self.loaded: dict = {}
        self.made: dict = {}  # (what, static offset) -> its value: each field widened once a block
        self.kb_base = arith.MulIOp(kb, index(size)).result

    def _once(self, what: str, off, make):
        if not isinstance(off, int):
            return make()
        key = (what, off)
        if key not in self.made:
            self.made[key] = make()
        return self.made[key]

    def _bytes(self, off) -> ir.Value:
        if isinstance(off, int) and off in self.loaded:  # a dynamic offset is loaded again (LLVM merges those)
            return self.loaded[off]
        o = index(off) if isinstance(off, int) else off.value_of()
        col = arith.MulIOp(arith.AddIOp(self.kb_base, o).result, index(LANES)).result
        vt = ir.VectorType.get([LANES], ir.IntegerType.get_signless(8))
        loaded = vector.LoadOp(vt, self.w, [self.row, col]).result
        if isinstance(off, int):
            self.loaded[off] = loaded
        return loaded

    def _i32(self):
        return ir.VectorType.get([LANES], ir.IntegerType.get_signless(32))

    def u8(self, off):
        return self._once("u8", off, lambda: V(arith.ExtUIOp(self._i32(), self._bytes(off)).result))

    def i8(self, off):
        return self._once("i8", off, lambda: V(arith.ExtSIOp(self._i32(), self._bytes(off)).result))

    def f16(self, off):
        def make():
            lo, hi = self.u8(off), self.u8(off + 1)
            i16 = ir.VectorType.get([LANES], ir.IntegerType.get_signless(16))
            bits = arith.TruncIOp(i16, (lo | (hi << 8)).value).result
            h = arith.BitcastOp(ir.VectorType.get([LANES], ir.F16Type.get()), bits).result
            return V(arith.ExtFOp(ir.VectorType.get([LANES], ir.F32Type.get()), h).result)
        return self._once("f16", off, make)

    @staticmethod
    def float(q):
        return V(arith.SIToFPOp(ir.VectorType.get([LANES], ir.F32Type.get()), q.value).result)

    @staticmethod
    def where(c, x, y):
        if isinstance(c, bool):
            return x if c else y
        return V(arith.SelectOp(c.value, x.value, y.value).result)

    def affine(self, a, q, c=None, minus=False):
        if self.split:  # block sums: the parts, for the loops to combine
            return Affine(a, q, c, minus)
        v = a * self.float(q)
        return v if c is None else v - c if minus else v + c


class Affine(NamedTuple):
    """An element as a * float(q) + c (c None: 0), its parts unmade: a and c are each group's."""
    a: "V"
    q: "V"
    c: "V | None"
    minus: bool


class V:
    """A vector value under the formula's operators (ints become splat constants). A product
    waits to see whether an offset is added to it: then it is one fused multiply-add, which
    is exact for a format's scale times quant (see the module doc)."""

    def __init__(self, value, product=None):
        self._value, self.product = value, product

    @property
    def value(self) -> ir.Value:
        if self._value is None:
            self._value = arith.MulFOp(*self.product).result
        return self._value

    def _of(self, o) -> ir.Value:
        if isinstance(o, V):
            return o.value
        t = self.product[0].type if self._value is None else self._value.type
        elt = ir.VectorType(t).element_type
        if isinstance(o, (Sym, _Index)):
            return o.as_i32(t)
        return vector.BroadcastOp(t, arith.ConstantOp(elt, o).result).result

    def _float(self) -> bool:
        t = self.product[0].type if self._value is None else self._value.type  # a product stays unmade
        return not isinstance(ir.VectorType(t).element_type, ir.IntegerType)

    def __and__(self, o): return V(arith.AndIOp(self.value, self._of(o)).result)  # noqa: E704
    def __or__(self, o): return V(arith.OrIOp(self.value, self._of(o)).result)  # noqa: E704
    def __rshift__(self, o): return V(arith.ShRUIOp(self.value, self._of(o)).result)  # noqa: E704
    def __lshift__(self, o): return V(arith.ShLIOp(self.value, self._of(o)).result)  # noqa: E704

    def __mul__(self, o):
        if self._float():
            return V(None, (self.value, self._of(o)))
        return V(arith.MulIOp(self.value, self._of(o)).result)

    def __add__(self, o):
        if not self._float():
            return V(arith.AddIOp(self.value, self._of(o)).result)
        if self._value is None:  # scale * quant + offset: exact product, one rounding
            return V(math.FmaOp(*self.product, self._of(o)).result)
        return V(arith.AddFOp(self.value, self._of(o)).result)

    def __neg__(self):
        return V(arith.NegFOp(self.value).result)

    def __sub__(self, o):
        if not self._float():
            return V(arith.SubIOp(self.value, self._of(o)).result)
        if self._value is None:
            return V(math.FmaOp(*self.product, arith.NegFOp(self._of(o)).result).result)
        return V(arith.SubFOp(self.value, self._of(o)).result)


class _Index:
    """A dynamic index the formula computes with (a sub-block's element: sb * 32 + l): ints
    fold, `value_of()` builds the index value."""

    def __init__(self, value_of):
        self.value_of = value_of

    def _wrap(self, fn):
        return _Index(lambda: fn(self.value_of()))

    def __add__(self, o):
        if isinstance(o, _Index):
            return _Index(lambda: arith.AddIOp(self.value_of(), o.value_of()).result)
        return self if o == 0 else self._wrap(lambda v: arith.AddIOp(v, index(o)).result)

    __radd__ = __add__

    def __mul__(self, o):
        return self._wrap(lambda v: arith.MulIOp(v, index(o)).result)

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return self._wrap(lambda v: arith.DivUIOp(v, index(o)).result)

    def __mod__(self, o):
        return self._wrap(lambda v: arith.RemUIOp(v, index(o)).result)

    def __lt__(self, o):
        return V(arith.CmpIOp(arith.CmpIPredicate.ult, self.value_of(), index(o)).result)

    def as_i32(self, like):
        v = arith.IndexCastOp(ir.IntegerType.get_signless(32), self.value_of()).result
        return vector.BroadcastOp(like, v).result


def _emit(op, options: QuantizedMatmulLoops) -> None:
    fmt = dtypes.by_name(ir.StringAttr(op.attributes[QUANTIZED]).value)
    x, w = list(op.inputs)[:2]
    out = list(op.outputs)[0]
    out_t = ir.MemRefType(out.type)
    rank = out_t.rank  # (b..., I, NT, 16)
    nb = rank - 3
    acc_elt = out_t.element_type
    vt = ir.VectorType.get([LANES], acc_elt)
    x_elt = ir.MemRefType(x.type).element_type
    zero, one = index(0), index(1)
    batch = [dim(out, a) for a in range(nb)]
    I, NT = dim(out, nb), dim(out, nb + 1)
    KB = dim(x, ir.MemRefType(x.type).rank - 2)
    x_rank = ir.MemRefType(x.type).rank
    x_lead = x_rank - 3  # x's batch dims (it may have fewer than the output: broadcast)
    mac = (lambda a, xv, wv: math.FmaOp(xv, wv, a).result) if options.fma else \
        (lambda a, xv, wv: arith.AddFOp(a, arith.MulFOp(xv, wv).result).result)

    def widen(s):
        return s if s.type == acc_elt else arith.ExtFOp(acc_elt, s).result

    def x_at(b, i, kb, e):
        return memref.LoadOp(x, [*b[nb - x_lead:], i, kb, e]).result

    def step(b, i0, n_rows, t0, n_tiles):  # noqa: C901 (one step's loops, read top to bottom)
        rows = [i0] + [arith.AddIOp(i0, index(r)).result for r in range(1, n_rows)]
        tiles = [t0] + [arith.AddIOp(t0, index(t)).result for t in range(1, n_tiles)]
        start = [vector.LoadOp(vt, out, [*b, r, t, zero]).result for r in rows for t in tiles]

        def elements(kb, e_of, sums):
            """Add the elements e_of(l) of block kb (l = 0 .. count-1) into the sums, in order."""
            if options.block_sums:
                return grouped(kb, e_of, sums)
            readers = [VectorBytes(w, t, kb, fmt.size) for t in tiles]
            sums = list(sums)
            for e in e_of:
                ws = [widen_w(fmt.element(rd, e).value) for rd in readers]
                ee = index(e) if isinstance(e, int) else e.value_of()
                for ri, r in enumerate(rows):
                    xv = vector.BroadcastOp(vt, widen(x_at(b, r, kb, ee))).result
                    for ti in range(n_tiles):
                        k = ri * n_tiles + ti
                        sums[k] = mac(sums[k], xv, ws[ti])
            return sums

        def grouped(kb, e_of, sums):
            """block-sums: per group of the block, sum(x q) per row and tile (fused multiply-adds),
            then sums += a * that + c * sum(x)."""
            readers = [VectorBytes(w, t, kb, fmt.size, split=True) for t in tiles]
            sums = list(sums)
            zero_v = arith.ConstantOp(vt, ir.DenseElementsAttr.get_splat(vt, ir.FloatAttr.get(acc_elt, 0.0))).result
            e_of = list(e_of)
            for g0 in range(0, len(e_of), fmt.group):
                group = e_of[g0:g0 + fmt.group]
                if all(isinstance(e, int) for e in group):
                    # the elements that read one byte side by side (Q4_1's j and j + 16): each
                    # byte is widened and used at once, not held across the group (which spilled)
                    group = sorted(group, key=lambda e: fmt.bytes_read(e)[::-1])
                partial = [zero_v] * (n_rows * n_tiles)
                xsum = [None] * n_rows
                parts = None
                for e in group:
                    parts = [fmt.element(rd, e) for rd in readers]
                    qs = [rd.float(p.q).value for rd, p in zip(readers, parts)]
                    ee = index(e) if isinstance(e, int) else e.value_of()
                    for ri, r in enumerate(rows):
                        xs = widen(x_at(b, r, kb, ee))
                        xsum[ri] = xs if xsum[ri] is None else arith.AddFOp(xsum[ri], xs).result
                        xv = vector.BroadcastOp(vt, xs).result
                        for ti in range(n_tiles):
                            k = ri * n_tiles + ti
                            partial[k] = math.FmaOp(xv, qs[ti], partial[k]).result
                for ri in range(n_rows):
                    xs_v = vector.BroadcastOp(vt, xsum[ri]).result
                    for ti, p in enumerate(parts):
                        k = ri * n_tiles + ti
                        sums[k] = math.FmaOp(p.a.value, partial[k], sums[k]).result
                        if p.c is not None:
                            c = arith.NegFOp(p.c.value).result if p.minus else p.c.value
                            sums[k] = math.FmaOp(c, xs_v, sums[k]).result
            return sums

        def widen_w(v):
            return v if ir.VectorType(v.type).element_type == acc_elt else arith.ExtFOp(vt, v).result

        def block(kb, *sums):
            if fmt.block <= 32:
                return elements(kb, range(fmt.block), sums)

            def sub(sb, *s):
                base = _Index(lambda: arith.MulIOp(sb, index(32)).result)
                return elements(kb, [base + l for l in range(32)], s)
            return loop(zero, index(fmt.block // 32), one, sub, sums)
        sums = loop(zero, KB, one, block, start)
        for k, (r, t) in enumerate((r, t) for r in rows for t in tiles):
            vector.StoreOp(sums[k], out, [*b, r, t, zero])

    def rest(n, m):
        """n rounded down to a multiple of m."""
        return arith.SubIOp(n, arith.RemUIOp(n, index(m)).result).result

    i_static, nt_static = out_t.shape[nb], out_t.shape[nb + 1]

    def per_batch(b):
        def rows_from(i0, n_rows):
            # whole steps of `tiles` tiles, then one at a time (none of either when NT is static and says so)
            if nt_static == DYN or nt_static >= options.tiles:
                t_main = rest(NT, options.tiles) if nt_static == DYN or nt_static % options.tiles else NT
                loop(zero, t_main, index(options.tiles), lambda t0: step(b, i0, n_rows, t0, options.tiles))
            else:
                t_main = zero
            if nt_static == DYN or nt_static % options.tiles:
                loop(t_main, NT, one, lambda t0: step(b, i0, n_rows, t0, 1))
        if i_static == DYN or i_static >= options.rows:  # a decode step's one row: no tile of rows
            i_main = rest(I, options.rows) if i_static == DYN or i_static % options.rows else I
            loop(zero, i_main, index(options.rows), lambda i0: rows_from(i0, options.rows))
        else:
            i_main = zero
        if i_static == DYN or i_static % options.rows:
            loop(i_main, I, one, lambda i0: rows_from(i0, 1))

    nest(batch, per_batch)
    del x_elt
