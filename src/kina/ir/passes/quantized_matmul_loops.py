"""quantized-matmul-loops: a fused quantized matmul (fuse-dequant-matmul's, tiled) as vector loops.

    linalg.generic {kina.quantized = "Q4_1"} ins(%x : memref<1x1x18x32xf32>, %wt, %wt, ...)
                                             outs(%y : memref<1x1x36x16xf32>)
            // (b, i, jt, kb, e, jl): acc + x[b, i, kb, e] * element(bytes of column jt*16+jl, block kb, e)
becomes, for each row i (`rows` at a time, with `rows-tiles` tiles of 16 columns a step: 4, or 2 when
those would not fit in registers; a single row with `tiles`),

    %a0 = vector.load %y[%b, %i, %jt, 0] : vector<16xf32>     ... one vector of sums per row and tile
    scf.for %kb = 0 to 18 iter_args(%a0, ...) {
      %q = vector.load %wt[%jt, %kb * 320 + 4 * 16] : vector<16xi8>   // byte 4 of 16 columns' block kb
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
that read them (a nibble byte serves e and e + 16), and so is every value computed from
them (`VectorBytes`, `V`: each built once per loop body under a key saying what it is).

Formats of 256-element blocks run their eight sub-blocks of 32 in a loop, each unrolled.
The formula's index arithmetic on e = 32 sb + l (l = 0..31 a constant) folds exactly
(`_Index`), so what depends on sb alone is built once per sub-block. For Q4_K, whose
element reads the nibble byte 16 + 32 (e // 64) + e % 32, shifts it by 4 ((e // 32) % 2)
and selects its scale and min from the bytes 4, 8 and 12 + (e // 32) % 4:

    scf.for %sb = 0 to 8 {
      %h = arith.divui %sb, 2 ; %r = arith.remui %sb, 4 ; %s = 4 * (%sb % 2) ; %low = %sb < 4
      %sc = select(%low, u8(%kb * 2304 + %r * 16 + 64) & 63, ...)     ... and %m, once
      %a = d * float(%sc) ; %c = -(dmin * float(%m))                    ... once
      %q_l = vector.load %wt[%jt, %kb * 2304 + %h * 512 + (16 + l) * 16]  // l = 0..31
      %w_l = fma(%a, float((%q_l >> %s) & 15), %c)
    }

rather than each of the 32 elements dividing 32 sb + l afresh and loading, masking and
selecting its scale and min again.

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
    tiles: int = option(4, "tiles of 16 columns a step of one row takes at once (a decode step's, and the rows "
                        "past the last whole step of `rows`)", check=lambda n: 1 <= n <= 8,
                        expected="an integer from 1 to 8")
    rows_tiles: int = option(0, "tiles of 16 columns a step of `rows` rows takes at once (a prefill's); 0: the "
                             "most of 4 and 2 whose sums, per-tile scales and offsets and row broadcasts fit in "
                             "24 vector registers (rows_tiles_for)", check=lambda n: 0 <= n <= 8,
                             expected="an integer from 0 to 8")
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
    """A format's byte reader (kina.dtypes) on 16 columns at once: byte `off` of a block of the
    tile `row` of the tiled weight is one vector<16xi8> load at `column(off)` (`_columns`).
    `off` is an int or an `_Index`; every load, widening and operation on them is built once
    per loop body (`memo`, keyed by what it computes), so the 32 elements of a sub-block read
    and widen its scale once."""

    def __init__(self, w, row, column, split: bool = False):
        self.w, self.row, self.column, self.split = w, row, column, split
        self.memo: dict = {}

    def _bytes(self, off) -> ir.Value:
        vt = ir.VectorType.get([LANES], ir.IntegerType.get_signless(8))
        return _once(self.memo, ("bytes", _key(off)),
                     lambda: vector.LoadOp(vt, self.w, [self.row, self.column(off)]).result)

    def _i32(self):
        return ir.VectorType.get([LANES], ir.IntegerType.get_signless(32))

    def _v(self, key, make):
        return _once(self.memo, key, lambda: V(make(), memo=self.memo, key=key))

    def u8(self, off):
        return self._v(("u8", _key(off)), lambda: arith.ExtUIOp(self._i32(), self._bytes(off)).result)

    def i8(self, off):
        return self._v(("i8", _key(off)), lambda: arith.ExtSIOp(self._i32(), self._bytes(off)).result)

    def f16(self, off):
        def make():
            lo, hi = self.u8(off), self.u8(off + 1)
            i16 = ir.VectorType.get([LANES], ir.IntegerType.get_signless(16))
            bits = arith.TruncIOp(i16, (lo | (hi << 8)).value).result
            h = arith.BitcastOp(ir.VectorType.get([LANES], ir.F16Type.get()), bits).result
            return arith.ExtFOp(ir.VectorType.get([LANES], ir.F32Type.get()), h).result
        return self._v(("f16", _key(off)), make)

    def float(self, q):
        return self._v(("float", q.key),
                       lambda: arith.SIToFPOp(ir.VectorType.get([LANES], ir.F32Type.get()), q.value).result)

    def where(self, c, x, y):
        if isinstance(c, bool):
            return x if c else y
        return self._v(("where", c.key, x.key, y.key), lambda: arith.SelectOp(c.value, x.value, y.value).result)

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


def _columns(kb, size: int):
    """column(off): where byte `off` (an int or an `_Index`) of block kb starts in a tile's row
    (16 columns a byte), built once per offset and shared by the tiles."""
    kb16, made = arith.MulIOp(kb, index(size * LANES)).result, {}

    def column(off) -> ir.Value:
        def make():
            add, col = (off, kb16) if isinstance(off, int) else (off.add, dynamic(off + -off.add))
            return arith.AddIOp(col, index(add * LANES)).result if add else col

        def dynamic(dyn):  # kb16 + 16 * an offset's dynamic part, shared by its constants
            return _once(made, dyn.key, lambda: arith.AddIOp(kb16, (dyn * LANES).value_of()).result)
        return _once(made, _key(off), make)
    return column


def _once(memo: dict, key, make):
    """memo[key], made by make() the first time."""
    if key not in memo:
        memo[key] = make()
    return memo[key]


def _key(o):
    """What a formula's operand computes, as a hashable key (a value's, an index's, a constant's)."""
    if isinstance(o, (V, _Index)):
        return o.key
    return ("const", type(o).__name__, o)


class V:
    """A vector value under the formula's operators (ints become splat constants), each result
    built once per `memo` under the key of what it computes. A product waits to see whether an
    offset is added to it: then it is one fused multiply-add, which is exact for a format's
    scale times quant (see the module doc)."""

    def __init__(self, value, product=None, memo=None, key=None):
        self._value, self.product = value, product
        self.memo = {} if memo is None else memo
        self.key = ("value", self) if key is None else key  # unkeyed: only itself is the same

    @property
    def value(self) -> ir.Value:
        if self._value is None:
            self._value = arith.MulFOp(*self.product).result
        return self._value

    def _type(self):
        return self.product[0].type if self._value is None else self._value.type  # a product stays unmade

    def _of(self, o) -> ir.Value:
        if isinstance(o, V):
            return o.value
        t = self._type()
        if isinstance(o, (Sym, _Index)):
            return o.as_i32(t)
        return _once(self.memo, ("splat", str(t), _key(o)), lambda: vector.BroadcastOp(
            t, arith.ConstantOp(ir.VectorType(t).element_type, o).result).result)

    def _float(self) -> bool:
        return not isinstance(ir.VectorType(self._type()).element_type, ir.IntegerType)

    def _op(self, name, o, make):
        """The result of `name` on self and o, made (make() -> (value, product)) once."""
        key = (name, self.key, _key(o))
        return _once(self.memo, key, lambda: V(*make(), memo=self.memo, key=key))

    def _int(self, name, o, op):
        return self._op(name, o, lambda: (op(self.value, self._of(o)).result,))

    def __and__(self, o): return self._int("&", o, arith.AndIOp)  # noqa: E704
    def __or__(self, o): return self._int("|", o, arith.OrIOp)  # noqa: E704
    def __rshift__(self, o): return self._int(">>", o, arith.ShRUIOp)  # noqa: E704
    def __lshift__(self, o): return self._int("<<", o, arith.ShLIOp)  # noqa: E704

    def __mul__(self, o):
        if self._float():
            return self._op("*", o, lambda: (None, (self.value, self._of(o))))
        return self._int("*", o, arith.MulIOp)

    def __add__(self, o):
        def make():
            if not self._float():
                return arith.AddIOp(self.value, self._of(o)).result,
            if self._value is None:  # scale * quant + offset: exact product, one rounding
                return math.FmaOp(*self.product, self._of(o)).result,
            return arith.AddFOp(self.value, self._of(o)).result,
        return self._op("+", o, make)

    def __neg__(self):
        return self._op("neg", None, lambda: (arith.NegFOp(self.value).result,))

    def __sub__(self, o):
        def make():
            if not self._float():
                return arith.SubIOp(self.value, self._of(o)).result,
            if self._value is None:
                neg = (-o).value if isinstance(o, V) else arith.NegFOp(self._of(o)).result
                return math.FmaOp(*self.product, neg).result,
            return arith.SubFOp(self.value, self._of(o)).result,
        return self._op("-", o, make)


class _Index:
    """A dynamic index the formula computes with, kept as an affine form: the sum of `terms`
    (base key, coefficient) plus `add`. A base is a dynamic index named by what it computes:
    ("sb",), the sub-block, or (form, "//", d) and (form, "%", d) of another form. With
    e = 32 sb + l (l an int) the formula's divisions fold exactly: e // 32 is sb, e % 32 the
    int l, e // 64 the base sb // 2, e % 64 is 32 (sb % 2) + l. For m v + c, 0 <= c < m:
    (m v + c) // d = (m/d) v + c // d and (m v + c) % d = c % d when d divides m;
    = v // (d/m) and m (v % (d/m)) + c when m divides d; otherwise the division is a new
    base. Every value is built once per loop body (`memo`)."""

    def __init__(self, memo: dict, terms=(), add: int = 0):
        self.memo, self.add = memo, add
        self.terms = tuple(sorted(((k, m) for k, m in terms if m), key=repr))

    @property
    def key(self):
        return ("index", self.terms, self.add)

    def _form(self, terms, add=0):
        form = _Index(self.memo, terms, add)
        return form if form.terms else add  # no dynamic part left: an int

    def __add__(self, o):
        if isinstance(o, _Index):
            merged: dict = dict(self.terms)
            for k, m in o.terms:
                merged[k] = merged.get(k, 0) + m
            return self._form(merged.items(), self.add + o.add)
        return self._form(self.terms, self.add + o)

    __radd__ = __add__

    def __mul__(self, o):
        return self._form(((k, m * o) for k, m in self.terms), self.add * o)

    __rmul__ = __mul__

    def _base(self, op, d):
        """The base (self op d), and for % of a base v % a where d divides a, v % d."""
        if op == "%" and d == 1:
            return 0
        if op == "%" and self.add == 0 and len(self.terms) == 1 and self.terms[0][1] == 1:
            inner = self.terms[0][0]
            if len(inner) == 3 and inner[1] == "%" and inner[2] % d == 0:
                return self._form([((inner[0], "%", d), 1)])
        return self._form([((self.key, op, d), 1)])

    def _single(self, d):
        """(v, m) when self is m v + c with 0 <= c < m and m divides d, else None."""
        if len(self.terms) == 1 and 0 <= self.add < self.terms[0][1] and d % self.terms[0][1] == 0:
            return self._form([(self.terms[0][0], 1)]), self.terms[0][1]
        return None

    def __floordiv__(self, d):
        if self.add >= 0 and all(m % d == 0 for _, m in self.terms):
            return self._form(((k, m // d) for k, m in self.terms), self.add // d)
        if (vm := self._single(d)) is not None:
            return vm[0]._base("//", d // vm[1])
        return self._base("//", d)

    def __mod__(self, d):
        if self.add >= 0 and all(m % d == 0 for _, m in self.terms):
            return self.add % d
        if (vm := self._single(d)) is not None:
            return vm[0]._base("%", d // vm[1]) * vm[1] + self.add
        return self._base("%", d)

    def _base_value(self, key) -> ir.Value:
        def make():
            form, op, d = key
            v = _Index(self.memo, form[1], form[2]).value_of()
            return (arith.DivUIOp if op == "//" else arith.RemUIOp)(v, index(d)).result
        return _once(self.memo, key, make)  # ("sb",) is in the memo from the start

    def value_of(self) -> ir.Value:
        def make():
            if self.add and self.terms:
                return arith.AddIOp(self._form(self.terms).value_of(), index(self.add)).result
            v = None
            for k, m in self.terms:
                t = self._base_value(k) if m == 1 else arith.MulIOp(self._base_value(k), index(m)).result
                v = t if v is None else arith.AddIOp(v, t).result
            return index(self.add) if v is None else v
        return _once(self.memo, ("value", self.key), make)

    def __lt__(self, o):
        return _once(self.memo, ("<", self.key, o), lambda: V(
            arith.CmpIOp(arith.CmpIPredicate.ult, self.value_of(), index(o)).result, key=("<", self.key, o)))

    def as_i32(self, like):
        def make():
            v = arith.IndexCastOp(ir.IntegerType.get_signless(32), self.value_of()).result
            return vector.BroadcastOp(like, v).result
        return _once(self.memo, ("i32", self.key, str(like)), make)


def rows_tiles_for(fmt, rows: int) -> int:
    """The tiles a step of `rows` rows takes when rows-tiles is 0: 4, unless its live vectors (a
    sum per row and tile, each tile's scale and offset, a broadcast per row) pass 24 of AVX-512's
    32 registers, then 2. On SmolLM2-135M's 37-token prefill, 4 tiles spilled for Q4_1 (2 were
    22% faster) and 2 were 8-15% slower for Q8_0, Q4_0 and Q5_0 (docs/log/2026-12-05-quiet-reruns.md)."""
    def live(tiles):
        return rows * tiles + tiles * (2 if fmt.offset else 1) + rows
    return 4 if live(4) <= 24 else 2


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
            column = _columns(kb, fmt.size)
            readers = [VectorBytes(w, t, column) for t in tiles]
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
            column = _columns(kb, fmt.size)
            readers = [VectorBytes(w, t, column, split=True) for t in tiles]
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
                e = _Index({("sb",): sb}, [(("sb",), 32)])  # 32 sb + l: the formula's divisions fold
                return elements(kb, [e + l for l in range(32)], s)
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
            # whole steps of n_tiles tiles, then one at a time (none of either when NT is static and says so)
            n_tiles = options.tiles if n_rows == 1 else options.rows_tiles or rows_tiles_for(fmt, n_rows)
            if nt_static == DYN or nt_static >= n_tiles:
                t_main = rest(NT, n_tiles) if nt_static == DYN or nt_static % n_tiles else NT
                loop(zero, t_main, index(n_tiles), lambda t0: step(b, i0, n_rows, t0, n_tiles))
            else:
                t_main = zero
            if nt_static == DYN or nt_static % n_tiles:
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
