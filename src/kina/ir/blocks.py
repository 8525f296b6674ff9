"""Block formats in MLIR: a format's `element` (kina.dtypes) built as ops on its bytes.

In:  a block format of the dtype table (its `element(b, j)`, written against a byte reader),
     MLIR values of its bytes, inside an active context, location and insertion point.
Out: `dequantize(low, q, t)`: the reference IR's dequantization of a quantized tensor, one
     `linalg.generic` marked `kina.dequantize`; `ElementBody`, the same formula inside any
     generic's body (the fused quantized matmul's), reading its bytes through block
     arguments; `VectorBytes`, the formula on `vector<16xi8>` loads of 16 columns at once,
     for the matmul loops.

The formula runs twice over a generic's bytes: once to learn which byte offsets it reads
(each an affine function of the element's index in its block), so that each becomes an
input of the generic with its own indexing map, then again to build the body on those
inputs' block arguments. So the reference IR is ordinary upstream MLIR (a generic over
(batch..., kb, e, n) reading the bytes [batch..., N, K / block, size] at (batch..., n, kb,
offset(e))), which convert-linalg-to-loops lowers as it lowers any generic, and the
passes see every byte it reads.

Integers: a byte is widened to i32 (zero- or sign-extended as `u8` or `i8` says); F16
fields are two bytes, little-endian, bitcast and extended to F32; `float(q)` is `sitofp`
(q is small: exact). Every op is the formula's, in its order, so the bits are those of
kina.runtime.quant's NumPy evaluation (and of `gguf.quants.dequantize`).
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg, tensor, vector

from .. import dtypes
from ..frontend.types import TensorType
from .irbuild import generic, mixed, reassociation, tensor_type

DEQUANTIZE = "kina.dequantize"  # a string attribute: the format a dequantization generic reads


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


class Val:
    """An MLIR integer or float value (scalar, or a vector of lanes) under the formula's
    operators; Python ints beside it become constants of its type."""

    def __init__(self, value: ir.Value):
        self.value = value

    def _const(self, n):
        t = self.value.type
        elt = ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t
        c = arith.ConstantOp(elt, n).result
        return vector.BroadcastOp(t, c).result if isinstance(t, ir.VectorType) else c

    def _of(self, other) -> ir.Value:
        if isinstance(other, Val):
            return other.value
        if isinstance(other, Sym):
            return other.as_i32(self.value.type)
        return self._const(other)

    def _is_float(self) -> bool:
        t = self.value.type
        elt = ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t
        return not isinstance(elt, ir.IntegerType)

    def _bin(self, other, fop, iop, swap=False):
        a, b = self.value, self._of(other)
        if swap:
            a, b = b, a
        return Val((fop if self._is_float() else iop)(a, b).result)

    def __and__(self, o): return Val(arith.AndIOp(self.value, self._of(o)).result)  # noqa: E704
    def __or__(self, o): return Val(arith.OrIOp(self.value, self._of(o)).result)  # noqa: E704
    def __rshift__(self, o): return Val(arith.ShRUIOp(self.value, self._of(o)).result)  # noqa: E704
    def __lshift__(self, o): return Val(arith.ShLIOp(self.value, self._of(o)).result)  # noqa: E704
    def __add__(self, o): return self._bin(o, arith.AddFOp, arith.AddIOp)  # noqa: E704
    def __sub__(self, o): return self._bin(o, arith.SubFOp, arith.SubIOp)  # noqa: E704
    def __mul__(self, o): return self._bin(o, arith.MulFOp, arith.MulIOp)  # noqa: E704
    __radd__, __rmul__ = __add__, __mul__
    def __rsub__(self, o): return self._bin(o, arith.SubFOp, arith.SubIOp, swap=True)  # noqa: E704
    def __neg__(self): return Val(arith.NegFOp(self.value).result)  # noqa: E704


class Sym:
    """An index in the block (the element's `j`, and what the formula computes from it): an
    affine expression of the generic's dims (for byte offsets: indexing maps) and, when the
    formula uses it as a number (a shift, a comparison), an i32 value of it."""

    def __init__(self, expr: ir.AffineExpr, value_of=None):
        self.expr, self._value_of = expr, value_of

    def _wrap(self, expr, fn):
        return Sym(expr, None if self._value_of is None else lambda: fn(self._value_of()))

    def _other(self, o):
        return (o.expr, o._value_of) if isinstance(o, Sym) else (ir.AffineConstantExpr.get(o), None)

    def __add__(self, o):
        if isinstance(o, Sym):
            return Sym(self.expr + o.expr, lambda: arith.AddIOp(self._value_of(), o._value_of()).result)
        return self._wrap(self.expr + ir.AffineConstantExpr.get(o), lambda v: arith.AddIOp(v, _index(o)).result)

    __radd__ = __add__

    def __mul__(self, o):
        return self._wrap(self.expr * ir.AffineConstantExpr.get(o), lambda v: arith.MulIOp(v, _index(o)).result)

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return self._wrap(ir.AffineExpr.__floordiv__(self.expr, o) if hasattr(ir.AffineExpr, "__floordiv__")
                          else ir.AffineFloorDivExpr.get(self.expr, ir.AffineConstantExpr.get(o)),
                          lambda v: arith.DivUIOp(v, _index(o)).result)

    def __mod__(self, o):
        return self._wrap(ir.AffineModExpr.get(self.expr, ir.AffineConstantExpr.get(o)),
                          lambda v: arith.RemUIOp(v, _index(o)).result)

    def __lt__(self, o):
        if self._value_of is None:  # only recording the offsets read: no value to compare
            return _Recorder._Any()
        return Val(arith.CmpIOp(arith.CmpIPredicate.ult, self._value_of(), _index(o)).result)

    def as_i32(self, like: ir.Type) -> ir.Value:
        v = arith.IndexCastOp(_i32(), self._value_of()).result
        return vector.BroadcastOp(like, v).result if isinstance(like, ir.VectorType) else v


def _index(n: int) -> ir.Value:
    return arith.ConstantOp(ir.IndexType.get(), n).result


class _Recorder:
    """A byte reader that only notes the offsets a formula reads (in order, once each)."""

    class _Any:
        def __getattr__(self, name):
            return lambda *a: self

        def _op(self, *a):
            return self
        __and__ = __or__ = __rshift__ = __lshift__ = __add__ = __sub__ = __mul__ = __neg__ = _op
        __radd__ = __rsub__ = __rmul__ = _op

    def __init__(self):
        self.offsets: list = []
        self._seen: set[str] = set()

    def _note(self, off):
        expr = off.expr if isinstance(off, Sym) else ir.AffineConstantExpr.get(off)
        if str(expr) not in self._seen:
            self._seen.add(str(expr))
            self.offsets.append(expr)
        return self._Any()

    def u8(self, off):
        return self._note(off)

    i8 = u8

    def f16(self, off):
        self._note(off)
        return self._note(off + 1)

    def float(self, q):
        return self._Any()

    def where(self, c, x, y):
        return self._Any()

    def affine(self, a, q, c=None, minus=False):
        return self._Any()


class ElementBody:
    """A format's element as scalar ops inside a generic's body: its bytes are the block
    arguments of the generic's byte inputs, one per offset (`offsets`, read by `record`)."""

    def __init__(self, args: dict):
        self.args = args  # str(offset expr) -> the block argument (i8)

    @staticmethod
    def record(fmt: dtypes.DType, j: Sym) -> list:
        r = _Recorder()
        fmt.element(r, j)
        return r.offsets

    def _arg(self, off) -> ir.Value:
        expr = off.expr if isinstance(off, Sym) else ir.AffineConstantExpr.get(off)
        return self.args[str(expr)]

    def u8(self, off):
        return Val(arith.ExtUIOp(_i32(), self._arg(off)).result)

    def i8(self, off):
        return Val(arith.ExtSIOp(_i32(), self._arg(off)).result)

    def f16(self, off):
        lo, hi = self.u8(off), self.u8(off + 1)
        bits = arith.TruncIOp(ir.IntegerType.get_signless(16), (lo | (hi << 8)).value).result
        return Val(arith.ExtFOp(ir.F32Type.get(), arith.BitcastOp(ir.F16Type.get(), bits).result).result)

    @staticmethod
    def float(q):
        return Val(arith.SIToFPOp(ir.F32Type.get(), q.value).result)

    @staticmethod
    def where(c, x, y):
        return Val(arith.SelectOp(c.value, x.value, y.value).result)

    @classmethod
    def affine(cls, a, q, c=None, minus=False):
        v = a * cls.float(q)
        return v if c is None else v - c if minus else v + c


def byte_maps(fmt: dtypes.DType, n_dims: int, prefix, n, kb, e) -> tuple[list, list[ir.AffineMap]]:
    """The byte offsets the formula reads (affine in `e`, the element's dim) and the map of
    each onto bytes viewed [prefix..., N, K / block, size]: (prefix..., n, kb, offset(e))."""
    offsets = ElementBody.record(fmt, Sym(ir.AffineDimExpr.get(e)))
    d = [ir.AffineDimExpr.get(a) for a in range(n_dims)]
    maps = [ir.AffineMap.get(n_dims, 0, [*(d[p] for p in prefix), d[n], d[kb], off]) for off in offsets]
    return offsets, maps


def dequantize(low, q: ir.Value, t: TensorType) -> ir.Value:
    """The values of `q` (bytes tensor<[batch..., N, K / block * size] x i8>, a quantized `t` of
    logical shape [batch..., K, N]) as F32 [batch..., K, N]: a generic over (batch..., kb, e, n)
    into [batch..., K / block, block, N], collapsed to [batch..., K, N]."""
    fmt = dtypes.by_name(t.dtype)
    nb = t.rank - 2
    K, N = t.dims[-2].const, t.dims[-1]
    kb_n = K // fmt.block
    batch = [low.size(d) for d in t.dims[:-2]]
    n_size = low.size(N)
    i8 = ir.IntegerType.get_signless(8)
    dyn = lambda v: ir.ShapedType.get_dynamic_size() if not isinstance(v, int) else v  # noqa: E731
    blocks_t = ir.RankedTensorType.get([*map(dyn, batch), dyn(n_size), kb_n, fmt.size], i8)
    groups = [[a] for a in range(nb)] + [[nb], [nb + 1, nb + 2]]
    d_sizes, s_sizes = mixed([*batch, n_size, kb_n, fmt.size])
    blocks = tensor.ExpandShapeOp(blocks_t, q, reassociation(groups), d_sizes, s_sizes).result
    n_dims = nb + 3  # (batch..., kb, e, n)
    kb, e, n = nb, nb + 1, nb + 2
    offsets, maps = byte_maps(fmt, n_dims, list(range(nb)), n, kb, e)
    out_t = TensorType("F32", (*t.dims[:-2], *map(type(t.dims[0]).of, (kb_n, fmt.block)), N), t.placement)
    ident = ir.AffineMap.get_identity(n_dims)

    def body(*args):
        reader = ElementBody({str(o): a for o, a in zip(offsets, args)})
        j = Sym(ir.AffineDimExpr.get(e), lambda: linalg.IndexOp(ir.IntegerAttr.get(ir.IntegerType.get_signless(64), e)).result)
        return [fmt.element(reader, j).value]
    (values,) = generic([blocks] * len(maps), [low.empty(out_t)], [*maps, ident], ["parallel"] * n_dims, body)
    values.owner.attributes[DEQUANTIZE] = ir.StringAttr.get(fmt.name)
    wide = TensorType("F32", t.dims, t.placement)
    groups = [[a] for a in range(nb)] + [[nb, nb + 1], [nb + 2]]
    return tensor.CollapseShapeOp(tensor_type(wide), values, reassociation(groups)).result
