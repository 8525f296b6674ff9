"""The typing rule of each family of operations: the half of the checker that `ops.OPS` indexes.

In:  an operation's node, its operands not yet typed, met by `check._FunctionChecker`, which
     inherits these rules as methods and gives them what they read: `self.expr` (type an
     operand), `self.env` (each name's type and where it is defined), `self.dims` and
     `self.bound` (the dim names' values and the names bound), `self.dtypes` and `self.fn`.
Out: the node with its operands typed and its own `type` set; or a `KinaError` at the node,
     showing both shapes where two disagree, with notes where each named operand is defined.

Guarantees: `RULES` maps every family of `ops.FAMILIES` to its rule (tests/test_op_table.py
says so), and an op that needs a floating dtype says so in its entry (`floating`), which
`_floating` reads. The rules (see grammar.lark for the syntax):
  concat[axis=a] x y   same rank, dtype, placement; 0 <= a < rank; other dims equal; dim a adds
  x @ y                rank >= 2, same dtype (floating) and placement; x[-1] == y[-2]; the batch dims
                       broadcast as np.matmul's (aligned from the right, equal or 1 or missing)
                       -> [*batch, x[-2], y[-1]]
  x + y, x - y,        equal shapes, dtype, placement; broadcast(x) may stretch dims of size 1;
  x * y, x / y,        a number takes the other operand's dtype and shape (and must be a value
  maximum(x, y)        of that dtype); `/` needs a floating dtype
  broadcast(x)         only as an operand of + - * /, beside a tensor
  -x                   any dtype; exp, sqrt, rsqrt, sigmoid need a floating one
  softmax(x, axis=a)   floating; 0 <= a < rank
  sum, max, mean       (x, axis=a): 0 <= a < rank; dim a becomes 1; mean needs a floating dtype
  transpose[perm=p] x  p a permutation of 0 .. rank-1; dim i of the result is x's dim p[i]
  reshape[dims=d] x    every name in d bound; d's symbolic dims are x's, in order; the products
                       of the static dims are equal
  slice[axis=a, start=s, size=n] x   0 <= a < rank; s + n <= the static part of x's dim a
                       (its value when every name in it is 0); dim a becomes n
  convert[dtype=D] x   D a dtype or a type parameter of the function; x's shape in dtype D; not
                       from a float to an integer; to x's own dtype it is x itself (no node)
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from . import ast, ops
from ..errors import KinaError, Loc
from .types import BLOCKS, DTYPES, Dim, TensorType, nearest

ELEMENTWISE_OPS = ops.listing([op.shown for op in ops.OPS if op.family == "elementwise"])

RULES: dict[str, Callable] = {}  # op family (ops.FAMILIES) -> its typing rule, an `OpRules` method


def rule(family: str):
    """Register an `OpRules` method `rule(self, expr) -> typed expr` as the typing rule of `family`."""
    def register(method):
        RULES[family] = method
        return method
    return register


class OpRules:
    """The rules, and the helpers they share; `check._FunctionChecker` inherits them."""

    def _notes(self, *operands: tuple[str, ast.Expr]) -> list[tuple[Loc, str]]:
        notes = []
        for role, op in operands:
            inner = op.operand if isinstance(op, ast.Broadcast) else op
            if isinstance(inner, ast.Name) and inner.id in self.env:
                notes.append((self.env[inner.id][1], f"{role} '{inner.id}' defined here"))
        return notes

    def _same_kind(self, e: ast.Expr, what: str, a: TensorType, b: TensorType, rank: bool = True) -> None:
        notes = self._notes(("lhs", e.lhs), ("rhs", e.rhs))
        if rank and a.rank != b.rank:
            raise KinaError(e.loc, f"{what}: ranks differ: lhs {a.shape_str()} has rank {a.rank}, "
                                   f"rhs {b.shape_str()} has rank {b.rank}", notes)
        if a.dtype != b.dtype:
            raise KinaError(e.loc, f"{what}: dtypes differ: lhs is {a.dtype}, rhs is {b.dtype}", notes)
        if a.placement != b.placement:
            raise KinaError(e.loc, f"{what}: placements differ: lhs is @{a.placement}, rhs is @{b.placement}", notes)

    def _axis(self, e: ast.Expr, what: str, t: TensorType, axis: int) -> None:
        if t.rank == 0:
            raise KinaError(e.loc, f"{what}: operand has rank 0, so there is no axis {axis}",
                            self._notes(("operand", e.operand)))
        if not 0 <= axis < t.rank:
            raise KinaError(e.loc, f"{what}: axis {axis} is out of range for rank {t.rank} (expected 0 to {t.rank - 1})",
                            self._notes(("operand", e.operand)))

    def _floating(self, e: ast.Expr, t: TensorType, *operands: tuple[str, ast.Expr]) -> None:
        """Refuse an integer `t` when `e`'s op needs a floating dtype (`ops.Op.floating`)."""
        op = ops.of(e)
        if op.floating and not t.is_float:
            raise KinaError(e.loc, f"{op.shown}: needs a floating dtype (F16, BF16, F32, F64), got {t.dtype}",
                            self._notes(*operands))

    @rule("broadcast")
    def broadcast(self, e: ast.Broadcast) -> ast.Expr:
        """Alone, refused: the elementwise rule types a broadcast operand."""
        raise KinaError(e.loc, f"broadcast(...) may only appear as an operand of {ELEMENTWISE_OPS}")

    @rule("concat")
    def concat(self, e: ast.Concat) -> ast.Expr:
        lhs, rhs = self.expr(e.lhs), self.expr(e.rhs)
        a, b = lhs.type, rhs.type
        self._same_kind(e, "concat", a, b)
        if a.rank == 0:
            raise KinaError(e.loc, "concat: operands have rank 0, so there is no axis to concatenate along",
                            self._notes(("lhs", e.lhs), ("rhs", e.rhs)))
        if not 0 <= e.axis < a.rank:
            raise KinaError(e.loc, f"concat: axis {e.axis} is out of range for rank {a.rank} (expected 0 to {a.rank - 1})")
        for i, (x, y) in enumerate(zip(a.dims, b.dims)):
            if i != e.axis and x != y:
                raise KinaError(e.loc, f"concat: dim {i} differs: lhs {a.shape_str()} has {x}, rhs {b.shape_str()} has {y} "
                                       f"(only the axis {e.axis} dim may differ)", self._notes(("lhs", e.lhs), ("rhs", e.rhs)))
        dims = tuple(x + y if i == e.axis else x for i, (x, y) in enumerate(zip(a.dims, b.dims)))
        ty = TensorType(a.dtype, dims, a.placement)
        return dataclasses.replace(e, lhs=lhs, rhs=rhs, type=ty)

    @rule("matmul")
    def matmul(self, e: ast.MatMul) -> ast.Expr:
        """NumPy's matmul rule for rank >= 2: the batch dims (all but the last two), aligned
        from the right, broadcast (each pair equal, or one of them 1, or missing). The
        operands share a dtype, or one is F16 or BF16 and the other F32 (the dtype it
        computes in): the product is F32, the narrow operand widened exactly."""
        lhs, rhs = self.expr(e.lhs), self.expr(e.rhs)
        a, b = lhs.type, rhs.type
        notes = self._notes(("lhs", e.lhs), ("rhs", e.rhs))
        if b.is_blocked:  # (a block-quantized lhs was refused where its name was typed)
            return self._quantized_matmul(e, lhs, rhs, notes)
        # mixed: F16 or BF16 against the dtype it computes in (F32), as weights against activations
        mixed = {a.dtype, b.dtype} in [{narrow, wide} for narrow, wide in ops.WIDE.items()]
        if a.dtype != b.dtype and not mixed:
            raise KinaError(e.loc, f"matmul: dtypes differ: lhs is {a.dtype}, rhs is {b.dtype} (expected one dtype, or "
                                   "F16 or BF16 against F32: that operand is widened)", notes)
        self._same_kind(e, "matmul", a, b if not mixed else dataclasses.replace(b, dtype=a.dtype), rank=False)
        for side, t in (("lhs", a), ("rhs", b)):
            if t.rank < 2:
                raise KinaError(e.loc, f"matmul: operands must have rank >= 2: {side} {t.shape_str()} has rank {t.rank}",
                                notes)
        self._floating(e, a, ("lhs", e.lhs), ("rhs", e.rhs))
        dtype = ops.WIDE.get(a.dtype, a.dtype) if mixed else a.dtype  # mixed: the wider one
        return self._matmul_dims(e, lhs, rhs, a, b, notes, dtype)

    def _matmul_dims(self, e, lhs, rhs, a: TensorType, b: TensorType, notes, dtype: str) -> ast.Expr:
        """The product's type: batch dims broadcast, the contraction dims equal."""
        n = max(a.rank, b.rank) - 2
        batch = []
        for i in range(n):  # result batch dim i is dim i - (n - rank + 2) of each operand, when it has one
            ia, ib = i - n + a.rank - 2, i - n + b.rank - 2
            x, y = (a.dims[ia] if ia >= 0 else Dim(1)), (b.dims[ib] if ib >= 0 else Dim(1))
            if x != y and Dim(1) not in (x, y):
                raise KinaError(e.loc, f"matmul: batch dims do not broadcast: lhs {a.shape_str()} has {x} at dim {ia}, "
                                       f"rhs {b.shape_str()} has {y} at dim {ib} (aligned from the right, each pair of "
                                       "batch dims must be equal or one of them 1)", notes)
            batch.append(y if x == Dim(1) else x)
        if a.dims[-1] != b.dims[-2]:
            raise KinaError(e.loc, f"matmul: contraction dims differ: lhs {a.shape_str()} has K={a.dims[-1]}, "
                                   f"rhs {b.shape_str()} has K={b.dims[-2]}", notes)
        dims = (*batch, a.dims[-2], b.dims[-1])
        return dataclasses.replace(e, lhs=lhs, rhs=rhs, type=TensorType(dtype, dims, a.placement))

    def _quantized_matmul(self, e: ast.MatMul, lhs: ast.Expr, rhs: ast.Expr, notes) -> ast.Expr:
        """x @ w with w block-quantized [..., K, N]: x F32, F16 or BF16 [..., I, K]; the sums run in
        F32 over w's exact values and the result has x's dtype (rounded once from F32)."""
        a, b = lhs.type, rhs.type
        if a.dtype not in ("F32", "F16", "BF16"):
            raise KinaError(e.loc, f"matmul: rhs is {b.dtype}, a block-quantized tensor, so lhs must be F32, F16 or "
                                   f"BF16 (the activations), not {a.dtype}", notes)
        self._same_kind(e, "matmul", a, dataclasses.replace(b, dtype=a.dtype), rank=False)
        if a.rank < 2:
            raise KinaError(e.loc, f"matmul: operands must have rank >= 2: lhs {a.shape_str()} has rank {a.rank}", notes)
        return self._matmul_dims(e, lhs, rhs, a, dataclasses.replace(b, dtype=a.dtype), notes, a.dtype)

    @rule("elementwise")
    def elementwise(self, e: ast.Binary) -> ast.Expr:
        """Equal shapes; broadcast(x) stretches x's dims of size 1, and a number takes the
        other operand's dtype and shape."""
        what = ops.of(e).shown
        if isinstance(e.lhs, ast.Number) and isinstance(e.rhs, ast.Number):
            raise KinaError(e.loc, f"{what}: both operands are numbers: one of them must be a tensor")
        sides = []
        for side, other in ((e.lhs, e.rhs), (e.rhs, e.lhs)):
            if isinstance(side, ast.Number):
                sides.append((False, side))
            elif isinstance(side, ast.Broadcast):
                if isinstance(other, ast.Number):
                    raise KinaError(side.loc, f"broadcast(...) has nothing to stretch to: the other operand of "
                                              f"{what} is a number")
                sides.append((True, dataclasses.replace(side, operand=self.expr(side.operand))))
            else:
                sides.append((False, self.expr(side)))
        (bl, lhs), (br, rhs) = sides
        if isinstance(lhs, ast.Number) or isinstance(rhs, ast.Number):
            number, tensor = (lhs, rhs) if isinstance(lhs, ast.Number) else (rhs, lhs)
            ty = tensor.type
            self._floating(e, ty)
            self._number(number, what, ty)
            number = dataclasses.replace(number, type=ty)
            lhs, rhs = (number, tensor) if isinstance(lhs, ast.Number) else (tensor, number)
            return dataclasses.replace(e, lhs=lhs, rhs=rhs, type=ty)
        a = lhs.operand.type if bl else lhs.type
        b = rhs.operand.type if br else rhs.type
        self._same_kind(e, what, a, b)
        self._floating(e, a, ("lhs", e.lhs), ("rhs", e.rhs))  # `/`: no integer division, no zero trap
        dims = []
        for i, (x, y) in enumerate(zip(a.dims, b.dims)):
            if x == y:
                dims.append(x)
            elif bl and x == Dim(1):
                dims.append(y)
            elif br and y == Dim(1):
                dims.append(x)
            else:
                notes = self._notes(("lhs", e.lhs), ("rhs", e.rhs))
                if bl or br:
                    raise KinaError(e.loc, f"{what}: cannot broadcast dim {i}: lhs {a.shape_str()} has {x}, "
                                           f"rhs {b.shape_str()} has {y} (a broadcast dim must be 1 or equal)", notes)
                raise KinaError(e.loc, f"{what}: shapes differ: lhs {a.shape_str()}, rhs {b.shape_str()} (dim {i}: {x} vs {y}); "
                                       "wrap an operand in broadcast(...) to stretch its dims of size 1", notes)
        ty = TensorType(a.dtype, tuple(dims), a.placement)
        if bl:
            lhs = dataclasses.replace(lhs, type=ty)
        if br:
            rhs = dataclasses.replace(rhs, type=ty)
        return dataclasses.replace(e, lhs=lhs, rhs=rhs, type=ty)

    def _number(self, number: ast.Number, what: str, ty: TensorType) -> None:
        """A number must be a value of the other operand's dtype: in range, an integer for
        I32/I64, and not a nonzero that would round to 0."""
        try:
            value = nearest(ty.dtype, number.value)
        except ValueError as err:
            raise KinaError(number.loc, f"{what}: the number {err}; a number takes the dtype of the other "
                                        f"operand, {ty.dtype}") from None
        if value == 0 and number.value != 0:
            raise KinaError(number.loc, f"{what}: the number {number.value} is too small for {ty.dtype}: it would "
                                        "round to 0")

    @rule("unary")
    def unary(self, e: ast.Unary) -> ast.Expr:
        """Same type as the operand; all but unary minus need a floating dtype."""
        x = self.expr(e.operand)
        self._floating(e, x.type, ("operand", e.operand))
        return dataclasses.replace(e, operand=x, type=x.type)

    @rule("softmax")
    def softmax(self, e: ast.Softmax) -> ast.Expr:
        x = self.expr(e.operand)
        t = x.type
        self._floating(e, t, ("operand", e.operand))
        if not 0 <= e.axis < t.rank:
            raise KinaError(e.loc, f"softmax: axis {e.axis} is out of range for rank {t.rank} "
                                   f"(expected 0 to {t.rank - 1})" if t.rank else "softmax: operand has rank 0")
        return dataclasses.replace(e, operand=x, type=t)

    @rule("reduce")
    def reduce(self, e: ast.Reduce) -> ast.Expr:
        """The operand's type with dim `axis` 1; mean needs a floating dtype."""
        x = self.expr(e.operand)
        t = x.type
        self._floating(e, t, ("operand", e.operand))
        self._axis(e, ops.of(e).shown, t, e.axis)
        dims = t.dims[:e.axis] + (Dim(1),) + t.dims[e.axis + 1:]
        return dataclasses.replace(e, operand=x, type=TensorType(t.dtype, dims, t.placement))

    @rule("transpose")
    def transpose(self, e: ast.Transpose) -> ast.Expr:
        """perm is a permutation of 0 .. rank-1; dim i of the result is dim perm[i] of the operand."""
        x = self.expr(e.operand)
        t, perm = x.type, list(e.perm)
        shown = f"[{', '.join(map(str, perm))}]"
        notes = self._notes(("operand", e.operand))
        if len(perm) != t.rank:
            raise KinaError(e.loc, f"transpose: perm {shown} has {len(perm)} entries but the operand "
                                   f"{t.shape_str()} has rank {t.rank}", notes)
        for p in perm:
            if p >= t.rank or perm.count(p) > 1:
                why = f"{p} is out of range" if p >= t.rank else f"{p} appears {perm.count(p)} times"
                raise KinaError(e.loc, f"transpose: perm {shown} is not a permutation of 0 to {t.rank - 1}: {why}",
                                notes)
        dims = tuple(t.dims[p] for p in perm)
        return dataclasses.replace(e, operand=x, type=TensorType(t.dtype, dims, t.placement))

    @rule("reshape")
    def reshape(self, e: ast.Reshape) -> ast.Expr:
        """The written dims (specialised like a type's, every name bound) hold the same
        elements: their symbolic dims are the operand's, in the same order, and the
        products of their static dims are equal."""
        x = self.expr(e.operand)
        t = x.type
        for d, loc in zip(e.dims, e.dim_locs or [e.loc] * len(e.dims)):
            for name in d.names:
                if name not in self.bound:
                    raise KinaError(loc, f"reshape: dim name '{name}' is not bound by any parameter")
        dims = tuple(d.substitute(self.dims) for d in e.dims)
        result = TensorType(t.dtype, dims, t.placement)
        notes = self._notes(("operand", e.operand))
        before, after = [d for d in t.dims if not d.is_static], [d for d in dims if not d.is_static]
        if before != after:
            show = lambda ds: ", ".join(map(str, ds)) or "none"
            raise KinaError(e.loc, f"reshape: the symbolic dims must stay, in order: the operand {t.shape_str()} has "
                                   f"{show(before)}, the result {result.shape_str()} has {show(after)}", notes)
        count = lambda ty: math.prod(d.const for d in ty.dims if d.is_static)
        if count(t) != count(result):
            size = lambda ty: "*".join([d.symbol or f"({d})" for d in before] + [str(count(ty))])
            raise KinaError(e.loc, f"reshape: element counts differ: the operand {t.shape_str()} has {size(t)}, "
                                   f"the result {result.shape_str()} has {size(result)}", notes)
        return dataclasses.replace(e, operand=x, dims=dims, type=result)

    @rule("slice")
    def slice(self, e: ast.Slice) -> ast.Expr:
        """Dims start .. start+size-1 along axis; they must exist for every value of the dim's
        names, so start + size is at most the dim's static part (S+2 has at least 2)."""
        x = self.expr(e.operand)
        t = x.type
        self._axis(e, "slice", t, e.axis)
        d, end = t.dims[e.axis], e.start + e.size
        if end > d.const:
            bound = f"dim {e.axis} of {t.shape_str()} is {d}" + ("" if d.is_static else
                                                                 f", which is only sure to be at least {d.const}")
            raise KinaError(e.loc, f"slice: start {e.start} + size {e.size} = {end} is past the end: {bound}",
                            self._notes(("operand", e.operand)))
        dims = t.dims[:e.axis] + (Dim(e.size),) + t.dims[e.axis + 1:]
        return dataclasses.replace(e, operand=x, type=TensorType(t.dtype, dims, t.placement))

    @rule("convert")
    def convert(self, e: ast.Convert) -> ast.Expr:
        """x's shape in dtype D (a type parameter's value, specialised like a type's dtype). A
        float to an integer is refused: NumPy's astype and LLVM's fptosi disagree past the
        integer's range and at NaN. To x's own dtype the result is x itself."""
        x = self.expr(e.operand)
        t = x.type
        dtype = self.dtypes.get(e.dtype) or e.dtype
        if dtype not in DTYPES:
            hint = f" (did you mean {e.dtype.upper()}?)" if e.dtype.upper() in DTYPES else ""
            params = [p.name for p in self.fn.type_params]
            also = f" or a type parameter of {self.fn.name} ({ops.listing(params)})" if params else ""
            raise KinaError(e.dtype_loc or e.loc,
                            f"convert: unknown dtype '{e.dtype}': expected one of {', '.join(d for d in DTYPES if d not in BLOCKS)}"
                            f"{also}{hint}")
        result = TensorType(dtype, t.dims, t.placement)
        if result.is_blocked:
            raise KinaError(e.dtype_loc or e.loc, f"convert: to {dtype}, a block format, is not defined: quantizing is "
                                                  "the runtime's (kina.runtime.quant); convert from one to a float dtype")
        if t.is_float and not result.is_float:
            raise KinaError(e.loc, f"convert: from a float to an integer ({t.dtype} to {dtype}) is not defined: "
                                   "only float to float, integer to float and integer to integer",
                            self._notes(("operand", e.operand)))
        if dtype == t.dtype:
            return x
        return dataclasses.replace(e, operand=x, dtype=dtype, type=result)
