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
each fixed dim name by its value in every written type (and reshape's dims), and
the result is checked as if it had been written that way (so `S+1` with S=128 is 129, and
T=I32 under `@` is the ordinary "needs a floating dtype" error). An error in a
specialised function carries notes saying where each value came from
("T is I32 (from dtypes)"). The checked program has no type parameter without a
value, and its `TypeAnn`s and `sig` hold the concrete types. A bad argument (a
name the program does not declare, a value that is no dtype or no size) is a
`ValueError`, raised before any checking.

Rules (see grammar.lark for the syntax); each family of `ops.OPS` is one `@rule` method below,
and an op that needs a floating dtype says so in its entry (`floating`):
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
  names                defined once, before use; dim names bound by a parameter's type
  results              arity and types equal the declared ones
  type parameters      fn[T, ...]: declared once, not a dtype or dim name, used in a type, given a value
  placements           only @host parameters and results (checked last, after the rules above)
"""
from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping

from . import ast, ops
from ..errors import KinaError, Loc
from .types import DTYPE_BYTES, DTYPES, PLACEMENTS, Dim, Signature, TensorType, nearest

_ELEMENTWISE_OPS = ops.listing([op.shown for op in ops.OPS if op.family == "elementwise"])

RULES: dict[str, Callable] = {}  # op family (ops.FAMILIES) -> its typing rule, a `_FunctionChecker` method


def rule(family: str):
    """Register a `_FunctionChecker` method `rule(self, expr) -> typed expr` as the typing rule of `family`."""
    def register(method):
        RULES[family] = method
        return method
    return register

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
        if isinstance(e, ast.Number):
            raise KinaError(e.loc, f"a number may only appear as an operand of {_ELEMENTWISE_OPS} "
                                   "(it takes the other operand's dtype and shape)")
        return RULES[ops.of(e).family](self, e)

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
        raise KinaError(e.loc, f"broadcast(...) may only appear as an operand of {_ELEMENTWISE_OPS}")

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
        dtype = ops.WIDE.get(a.dtype, a.dtype) if mixed else a.dtype  # mixed: the wider one
        return dataclasses.replace(e, lhs=lhs, rhs=rhs, type=TensorType(dtype, dims, a.placement))

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
        dims = tuple(_fix_dims(d, self.dims) for d in e.dims)
        for d, loc in zip(dims, e.dim_locs or [e.loc] * len(dims)):
            for name in d.names:
                if name not in self.bound:
                    raise KinaError(loc, f"reshape: dim name '{name}' is not bound by any parameter")
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
                            f"convert: unknown dtype '{e.dtype}': expected one of {', '.join(DTYPES)}{also}{hint}")
        result = TensorType(dtype, t.dims, t.placement)
        if t.is_float and not result.is_float:
            raise KinaError(e.loc, f"convert: from a float to an integer ({t.dtype} to {dtype}) is not defined: "
                                   "only float to float, integer to float and integer to integer",
                            self._notes(("operand", e.operand)))
        if dtype == t.dtype:
            return x
        return dataclasses.replace(e, operand=x, dtype=dtype, type=result)
