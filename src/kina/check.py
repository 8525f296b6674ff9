"""The shape and type checker, which also specialises generic programs.

In:  an `ast.Program` from `syntax.parse`; optionally `dtypes` (a value for each
     type parameter, `{"T": "F16"}`) and `dims` (values fixing dim names, `{"S": 128}`).
Out: the same program with every `Expr.type` set to a concrete `TensorType`,
     and every `Function.sig` set to its `Signature`.

Guarantees: a program that passes `check` is well typed by the rules below, so
lowering never has to re-check, and it compiles: only @host tensors pass. Dims
are symbolic (`types.Dim`): concat adds them, matmul and elementwise ops require
them equal. Every violation is a `KinaError` located at the offending expression;
shape errors show both sides and carry notes pointing at where each operand was
defined.

Specialisation comes first: each type parameter is replaced by its dtype and
each fixed dim name by its value in every written type, and the result is
checked as if it had been written that way (so `S+1` with S=128 is 129, and
T=I32 under `@` is the ordinary "needs a floating dtype" error). An error in a
specialised function carries notes saying where each value came from
("T is I32 (from dtypes)"). The checked program has no type parameter without a
value, and its `TypeAnn`s and `sig` hold the concrete types. A bad argument (a
name the program does not declare, a value that is no dtype or no size) is a
`ValueError`, raised before any checking.

Rules (see grammar.lark for the syntax):
  concat[axis=a] x y   same rank, dtype, placement; 0 <= a < rank; other dims equal; dim a adds
  x @ y                same rank >= 2, floating; batch dims equal; x[-1] == y[-2] -> [..., x[-2], y[-1]]
  x * y, x + y         equal shapes, dtype, placement; broadcast(x) may stretch dims of size 1
  broadcast(x)         only as an operand of * or +
  softmax(x, axis=a)   floating; 0 <= a < rank
  names                defined once, before use; dim names bound by a parameter's type
  results              arity and types equal the declared ones
  type parameters      fn[T, ...]: declared once, not a dtype or dim name, used in a type, given a value
  placements           only @host parameters and results (checked last, after the rules above)
"""
from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping

from . import ast
from .diagnostics import KinaError, Loc
from .types import DTYPE_BYTES, DTYPES, PLACEMENTS, Dim, Signature, TensorType

MAX_TENSOR_BYTES = 1 << 40  # 1 TiB: past this a static shape is a typo, not a tensor


def check(program: ast.Program, dtypes: Mapping[str, str] | None = None,
          dims: Mapping[str, int] | None = None) -> ast.Program:
    """Type-check `program`, specialised first with `dtypes` and `dims`.

    `dtypes` gives each type parameter its dtype name (`{"T": "F16"}`), and must give
    every one; `dims` fixes dim names of the parameters' types (`{"S": 128}`), the
    others stay symbolic. Raises TypeError/ValueError for a bad argument, KinaError
    for a bad program."""
    dtypes = _dtype_values(program, dtypes)
    dims = _dim_values(program, dims)
    try:
        return _check(program, dtypes, dims)
    except KinaError as e:
        raise e.with_source(program.source) from None


def _dtype_values(program: ast.Program, dtypes: Mapping[str, str] | None) -> dict[str, str]:
    known = _unique(t.name for fn in program.functions for t in fn.type_params)
    values = _mapping("dtypes", dtypes)
    for name, value in values.items():
        if name not in known:
            raise ValueError(f"dtypes: {name!r} is not a type parameter of any function in {program.filename}; "
                             + (f"its type parameters are {', '.join(known)}" if known else
                                "it declares none (a generic function is written fn[T](...))"))
        if not isinstance(value, str) or value not in DTYPES:
            raise ValueError(f"dtypes[{name!r}] must be a dtype, one of {', '.join(DTYPES)}; got {value!r}")
    return values


def _dim_values(program: ast.Program, dims: Mapping[str, int] | None) -> dict[str, int]:
    known = _unique(n for fn in program.functions for p in fn.params for d in p.type.dims for n in d.names)
    values = _mapping("dims", dims)
    for name, value in values.items():
        if name not in known:
            raise ValueError(f"dims: {name!r} is not a dim name of any function in {program.filename}; "
                             + (f"its dim names are {', '.join(known)}" if known else "its parameters have none"))
        size = None if isinstance(value, bool) or not hasattr(value, "__index__") else operator.index(value)
        if size is None or size < 0:
            raise ValueError(f"dims[{name!r}] must be a non-negative int; got {value!r}")
        values[name] = size
    return values


def _mapping(what: str, given) -> dict:
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise TypeError(f"{what} must be a mapping from names to values, got {type(given).__name__}")
    return dict(given)


def _unique(names) -> list[str]:
    return list(dict.fromkeys(names))


def _check(program: ast.Program, dtypes: dict[str, str], dims: dict[str, int]) -> ast.Program:
    if not program.functions:
        raise KinaError(Loc(program.filename, 1, 1), "no function defined: expected 'let NAME = fn(...) -> (...) { ... }'")
    seen: dict[str, Loc] = {}
    functions = []
    for fn in program.functions:
        if fn.name in seen:
            raise KinaError(fn.loc, f"function '{fn.name}' is already defined",
                            [(seen[fn.name], f"'{fn.name}' first defined here")])
        seen[fn.name] = fn.loc
        functions.append(_FunctionChecker(fn, dtypes, dims).run())
    # Last, so that a mixed program gets the more precise "placements differ" first.
    for fn in functions:
        _require_host(fn)
    return dataclasses.replace(program, functions=tuple(functions))


def _require_host(fn: ast.Function) -> None:
    """Only @host tensors compile (there is no device back end): refuse @device where it is written."""
    for p in fn.params:
        if p.type.placement != "host":
            raise KinaError(p.type.placement_loc or p.loc,
                            f"parameter '{p.name}' is @{p.type.placement}: only @host tensors can be compiled")
    # Unreachable while results must equal their declared types (an @device result needs an
    # @device parameter); kept so this function alone states the whole rule.
    for ann in fn.result_types:
        if ann.placement != "host":
            raise KinaError(ann.placement_loc or ann.loc, "only @host results can be compiled")


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


def _fix_dims(dim: Dim, values: Mapping[str, int]) -> Dim:
    """`dim` with each name in `values` replaced by its value: S+1 with S=128 is 129."""
    fixed = [(n, c) for n, c in dim.terms if n in values]
    return Dim(dim.const + sum(c * values[n] for n, c in fixed), tuple(t for t in dim.terms if t[0] not in values))


class _FunctionChecker:
    def __init__(self, fn: ast.Function, dtypes: Mapping[str, str], dims: Mapping[str, int]):
        self.fn = self.written = fn  # self.fn becomes the specialised function
        self.env: dict[str, tuple[TensorType, Loc]] = {}
        self.temporaries: list[TensorType] = []
        self.dim_uses: dict[str, Loc] = {}  # each dim name -> where it is first written
        for ann in [p.type for p in fn.params] + list(fn.result_types):
            for d, loc in zip(ann.dims, ann.dim_locs):
                for name in d.names:
                    self.dim_uses.setdefault(name, loc)
        self.dtypes = {t.name: dtypes.get(t.name) for t in fn.type_params}
        # Only names its parameters bind (as `dims` itself is checked): a name written only
        # in a result stays the "not bound" error it is without `dims`.
        bound = {n for p in fn.params for d in p.type.dims for n in d.names}
        self.dims = {n: v for n, v in dims.items() if n in bound}

    def run(self) -> ast.Function:
        type_params = self._type_params()
        try:
            return dataclasses.replace(self._run(), type_params=type_params)
        except KinaError as e:  # an error in a specialisation: say what it was specialised with
            e.notes.extend(self._specialisation_notes())
            raise

    def _type_params(self) -> tuple[ast.TypeParam, ...]:
        """Each type parameter with its value; it is declared once, named apart from dtypes and dims, and used."""
        fn, seen = self.written, {}
        for t in fn.type_params:
            if t.name in seen:
                raise KinaError(t.loc, f"type parameter '{t.name}' of {fn.name} is declared twice",
                                [(seen[t.name], f"'{t.name}' first declared here")])
            seen[t.name] = t.loc
            if t.name in DTYPES:
                raise KinaError(t.loc, f"type parameter '{t.name}' of {fn.name} has the name of a dtype: "
                                       f"call it something else (T, U, ...)")
            if t.name in self.dim_uses:
                raise KinaError(t.loc, f"type parameter '{t.name}' of {fn.name} has the name of a dim: "
                                       "rename one of them", [(self.dim_uses[t.name], f"dim '{t.name}' used here")])
            if not any(ann.dtype == t.name for ann in [p.type for p in fn.params] + list(fn.result_types)):
                raise KinaError(t.loc, f"type parameter '{t.name}' of {fn.name} is not used: no parameter or "
                                       f"result type of {fn.name} is tensor<{t.name}, ...>")
            if self.dtypes[t.name] is None:
                raise KinaError(t.loc, f"type parameter '{t.name}' of {fn.name} has no value: give it with "
                                       f"dtypes={{'{t.name}': ...}} or kinac --dtype {t.name}=...")
        return tuple(dataclasses.replace(t, value=self.dtypes[t.name]) for t in fn.type_params)

    def _specialisation_notes(self) -> list[tuple[Loc, str]]:
        notes = [(t.loc, f"{t.name} is {self.dtypes[t.name]} (from dtypes)") for t in self.written.type_params]
        for name, value in self.dims.items():
            binding = [loc for p in self.written.params for d, loc in zip(p.type.dims, p.type.dim_locs)
                       if d.symbol == name]
            notes.append(((binding or [self.dim_uses[name]])[0], f"{name} is {value} (from dims)"))
        return notes

    def specialise(self, ann: ast.TypeAnn) -> ast.TypeAnn:
        """The written type with type parameters and fixed dims replaced by their values."""
        return dataclasses.replace(ann, dtype=self.dtypes.get(ann.dtype) or ann.dtype,
                                   dims=tuple(_fix_dims(d, self.dims) for d in ann.dims))

    def _run(self) -> ast.Function:
        fn = self.fn = dataclasses.replace(
            self.written, params=tuple(dataclasses.replace(p, type=self.specialise(p.type)) for p in self.written.params),
            result_types=tuple(self.specialise(t) for t in self.written.result_types))
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
