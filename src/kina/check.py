"""The shape and type checker.

In:  an `ast.Program` from `syntax.parse`.
Out: the same program with every `Expr.type` set to a concrete `TensorType`,
     and every `Function.sig` set to its `Signature`.

Guarantees: a program that passes `check` is well typed by the rules below, so
lowering never has to re-check. Dims are symbolic (`types.Dim`): concat adds
them, matmul and elementwise ops require them equal. Every violation is a
`KinaError` located at the offending expression; shape errors show both sides
and carry notes pointing at where each operand was defined.

Rules (see grammar.lark for the syntax):
  concat[axis=a] x y   same rank, dtype, placement; 0 <= a < rank; other dims equal; dim a adds
  x @ y                same rank >= 2, floating; batch dims equal; x[-1] == y[-2] -> [..., x[-2], y[-1]]
  x * y, x + y         equal shapes, dtype, placement; broadcast(x) may stretch dims of size 1
  broadcast(x)         only as an operand of * or +
  softmax(x, axis=a)   floating; 0 <= a < rank
  names                defined once, before use; dim names bound by a parameter's type
  results              arity and types equal the declared ones
"""
from __future__ import annotations

import dataclasses

from . import ast
from .diagnostics import KinaError, Loc
from .types import DTYPE_BYTES, DTYPES, PLACEMENTS, Dim, Signature, TensorType

MAX_TENSOR_BYTES = 1 << 40  # 1 TiB: past this a static shape is a typo, not a tensor


def check(program: ast.Program) -> ast.Program:
    try:
        return _check(program)
    except KinaError as e:
        raise e.with_source(program.source) from None


def _check(program: ast.Program) -> ast.Program:
    if not program.functions:
        raise KinaError(Loc(program.filename, 1, 1), "no function defined: expected 'let NAME = fn(...) -> (...) { ... }'")
    seen: dict[str, Loc] = {}
    functions = []
    for fn in program.functions:
        if fn.name in seen:
            raise KinaError(fn.loc, f"function '{fn.name}' is already defined",
                            [(seen[fn.name], f"'{fn.name}' first defined here")])
        seen[fn.name] = fn.loc
        functions.append(_FunctionChecker(fn).run())
    return dataclasses.replace(program, functions=tuple(functions))


def resolve_type(ann: ast.TypeAnn) -> TensorType:
    """Validate a written type: known dtype and placement, sizes that fit in memory."""
    if ann.dtype not in DTYPES:
        hint = f" (did you mean {ann.dtype.upper()}?)" if ann.dtype.upper() in DTYPES else ""
        raise KinaError(ann.dtype_loc or ann.loc,
                        f"unknown dtype '{ann.dtype}': expected one of {', '.join(DTYPES)}{hint}")
    if ann.placement not in PLACEMENTS:
        raise KinaError(ann.placement_loc or ann.loc,
                        f"unknown placement '@{ann.placement}': expected @host or @device")
    ty = TensorType(ann.dtype, ann.dims, ann.placement)
    _check_size(ty, ann.loc)
    return ty


def _check_size(ty: TensorType, loc: Loc) -> None:
    """Refuse a tensor that could never be allocated, before MLIR (int64 sizes) or NumPy sees it.

    Each dim's constant part is bounded on its own too, so a 0 elsewhere in the
    shape cannot hide a dim that overflows int64."""
    itemsize = DTYPE_BYTES[ty.dtype]
    limit = f"more than the {MAX_TENSOR_BYTES >> 30} GiB Kina allows for one tensor"
    elements = 1
    for i, d in enumerate(ty.dims):
        if d.const * itemsize > MAX_TENSOR_BYTES:
            raise KinaError(loc, f"dim {i} of tensor {ty.shape_str()} is too large for memory: "
                                 f"{d.const} {ty.dtype} elements need {d.const * itemsize} bytes, {limit}")
        elements *= d.const if d.is_static else 1
    if elements * itemsize > MAX_TENSOR_BYTES:
        what = "needs" if ty.is_static else "needs at least"
        raise KinaError(loc, f"tensor {ty.shape_str()} of {ty.dtype} {what} {elements * itemsize} bytes, {limit}")


class _FunctionChecker:
    def __init__(self, fn: ast.Function):
        self.fn = fn
        self.env: dict[str, tuple[TensorType, Loc]] = {}
        self.temporaries: list[TensorType] = []

    def run(self) -> ast.Function:
        fn = self.fn
        params = []
        for p in fn.params:
            if p.name in self.env:
                raise KinaError(p.loc, f"parameter '{p.name}' is already defined",
                                [(self.env[p.name][1], f"'{p.name}' first defined here")])
            ty = resolve_type(p.type)
            self.env[p.name] = (ty, p.loc)
            params.append((p.name, ty))
        self._check_dim_names(params)
        declared = tuple(resolve_type(t) for t in fn.result_types)
        self._check_result_dims(declared)
        body = []
        for let in fn.body:
            if let.name in self.env:
                kind = "parameter" if any(p.name == let.name for p in fn.params) else "name"
                raise KinaError(let.loc, f"'{let.name}' is already defined (a let may not shadow a {kind})",
                                [(self.env[let.name][1], f"'{let.name}' first defined here")])
            value = self.expr(let.value)
            self.env[let.name] = (value.type, let.loc)
            body.append(dataclasses.replace(let, value=value))
        results = tuple(self.expr(r) for r in fn.results)
        if len(results) != len(declared):
            raise KinaError(fn.results[0].loc if fn.results else fn.loc,
                            f"function '{fn.name}' declares {len(declared)} result(s) but returns {len(results)}",
                            [(fn.result_types[0].loc if fn.result_types else fn.loc, "results declared here")])
        for i, (got, want, ann) in enumerate(zip(results, declared, fn.result_types)):
            if got.type != want:
                raise KinaError(got.loc, f"result {i} has type {got.type} but the function declares {want}",
                                [(ann.loc, "declared here")])
        sig = Signature(fn.name, tuple(params), declared, tuple(self.temporaries))
        return dataclasses.replace(fn, body=tuple(body), results=results, sig=sig)

    def _check_dim_names(self, params: list[tuple[str, TensorType]]) -> None:
        bound = {d.symbol for _, t in params for d in t.dims if d.symbol}
        for p, (_, t) in zip(self.fn.params, params):
            for d, loc in zip(t.dims, p.type.dim_locs):
                for name in d.names:
                    if name not in bound:
                        raise KinaError(loc, f"dim name '{name}' is not bound: some parameter must have "
                                             f"'{name}' alone as one of its dims")
        self.bound = bound

    def _check_result_dims(self, declared: tuple[TensorType, ...]) -> None:
        for t, ann in zip(declared, self.fn.result_types):
            for d, loc in zip(t.dims, ann.dim_locs):
                for name in d.names:
                    if name not in self.bound:
                        raise KinaError(loc, f"dim name '{name}' in a result type is not bound by any parameter")

    # -- expressions ---------------------------------------------------------
    def expr(self, e: ast.Expr) -> ast.Expr:
        """Type `e`; every tensor an operation makes is size-checked and recorded."""
        typed = self._expr(e)
        if not isinstance(e, ast.Name):
            _check_size(typed.type, e.loc)  # concat, matmul and broadcasting all grow tensors
            self.temporaries.append(typed.type)
        return typed

    def _expr(self, e: ast.Expr) -> ast.Expr:
        if isinstance(e, ast.Name):
            if e.id not in self.env:
                later = [(let.loc, f"'{e.id}' is defined here, after its use") for let in self.fn.body
                         if let.name == e.id]
                raise KinaError(e.loc, f"undefined name '{e.id}'", later[:1])
            return dataclasses.replace(e, type=self.env[e.id][0])
        if isinstance(e, ast.Broadcast):
            raise KinaError(e.loc, "broadcast(...) may only appear as an operand of '*' or '+'")
        if isinstance(e, ast.Concat):
            return self.concat(e)
        if isinstance(e, ast.MatMul):
            return self.matmul(e)
        if isinstance(e, ast.ELEMENTWISE):
            return self.elementwise(e)
        if isinstance(e, ast.Softmax):
            return self.softmax(e)
        raise AssertionError(f"unknown expression {e!r}")

    def _notes(self, *operands: tuple[str, ast.Expr]) -> list[tuple[Loc, str]]:
        notes = []
        for role, op in operands:
            inner = op.operand if isinstance(op, ast.Broadcast) else op
            if isinstance(inner, ast.Name) and inner.id in self.env:
                notes.append((self.env[inner.id][1], f"{role} '{inner.id}' defined here"))
        return notes

    def _same_kind(self, e: ast.Expr, what: str, a: TensorType, b: TensorType) -> None:
        notes = self._notes(("lhs", e.lhs), ("rhs", e.rhs))
        if a.rank != b.rank:
            raise KinaError(e.loc, f"{what}: ranks differ: lhs {a.shape_str()} has rank {a.rank}, "
                                   f"rhs {b.shape_str()} has rank {b.rank}", notes)
        if a.dtype != b.dtype:
            raise KinaError(e.loc, f"{what}: dtypes differ: lhs is {a.dtype}, rhs is {b.dtype}", notes)
        if a.placement != b.placement:
            raise KinaError(e.loc, f"{what}: placements differ: lhs is @{a.placement}, rhs is @{b.placement}", notes)

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

    def matmul(self, e: ast.MatMul) -> ast.Expr:
        lhs, rhs = self.expr(e.lhs), self.expr(e.rhs)
        a, b = lhs.type, rhs.type
        self._same_kind(e, "matmul", a, b)
        notes = self._notes(("lhs", e.lhs), ("rhs", e.rhs))
        if a.rank < 2:
            raise KinaError(e.loc, f"matmul: operands must have rank >= 2, got rank {a.rank}", notes)
        if not a.is_float:
            raise KinaError(e.loc, f"matmul: needs a floating dtype (F16, BF16, F32, F64), got {a.dtype}", notes)
        for i, (x, y) in enumerate(zip(a.dims[:-2], b.dims[:-2])):
            if x != y:
                raise KinaError(e.loc, f"matmul: batch dim {i} differs: lhs {a.shape_str()} has {x}, "
                                       f"rhs {b.shape_str()} has {y}", notes)
        if a.dims[-1] != b.dims[-2]:
            raise KinaError(e.loc, f"matmul: contraction dims differ: lhs {a.shape_str()} has K={a.dims[-1]}, "
                                   f"rhs {b.shape_str()} has K={b.dims[-2]}", notes)
        dims = a.dims[:-1] + b.dims[-1:]
        return dataclasses.replace(e, lhs=lhs, rhs=rhs, type=TensorType(a.dtype, dims, a.placement))

    def elementwise(self, e: ast.Mul | ast.Add) -> ast.Expr:
        what = ast.OP_NAMES[type(e)]
        sides = []
        for side in (e.lhs, e.rhs):
            if isinstance(side, ast.Broadcast):
                sides.append((True, dataclasses.replace(side, operand=self.expr(side.operand))))
            else:
                sides.append((False, self.expr(side)))
        (bl, lhs), (br, rhs) = sides
        a = lhs.operand.type if bl else lhs.type
        b = rhs.operand.type if br else rhs.type
        self._same_kind(e, what, a, b)
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

    def softmax(self, e: ast.Softmax) -> ast.Expr:
        x = self.expr(e.operand)
        t = x.type
        if not t.is_float:
            raise KinaError(e.loc, f"softmax: needs a floating dtype (F16, BF16, F32, F64), got {t.dtype}",
                            self._notes(("operand", e.operand)))
        if not 0 <= e.axis < t.rank:
            raise KinaError(e.loc, f"softmax: axis {e.axis} is out of range for rank {t.rank} "
                                   f"(expected 0 to {t.rank - 1})" if t.rank else "softmax: operand has rank 0")
        return dataclasses.replace(e, operand=x, type=t)
