"""The shape and type checker, which also specialises generic programs.

In:  an `ast.Program` from `syntax.parse`; optionally `dtypes` (a value for each
     type parameter, `{"T": "F16"}`) and `dims` (values fixing dim names, `{"S": 128}`).
Out: the same program with every `Expr.type` set to a concrete `TensorType`,
     and every `Function.sig` set to its `Signature`; its functions are the entries,
     the program's own, with every call inlined (`inline.py`): no `Call` is left.

Guarantees: a program that passes `check` is well typed by the rules below and
those of the operations (rules.py), so lowering never has to re-check, and it
compiles: only @host tensors pass. Dims
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

Rules (see grammar.lark for the syntax); the operations' are in rules.py, one per op family:
  names                defined once, before use; dim names bound by a parameter's type
  f(x, ...)            f a function of this file or of a used one (`uses.py`): inlined, see inline.py;
                       let (a, b) = f(...) binds each result, and nothing but a call stands there
  results              arity and types equal the declared ones
  type parameters      fn[T, ...]: declared once, not a dtype or dim name, used in a type, given a value
  placements           only @host parameters and results (checked last, after the rules above)
"""
from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping

from . import ast, inline, ops, uses
from ..errors import KinaError, Loc
from .rules import ELEMENTWISE_OPS, RULES, OpRules  # noqa: F401 (RULES: the rules by family, as before)
from .types import BLOCKS, DTYPE_BYTES, DTYPES, PLACEMENTS, Dim, Signature, TensorType

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
    texts = {program.filename: program.source}  # and each used file's, as it is read
    try:
        library = uses.load(program, texts)
        return _check(program, dtypes, dims, library)
    except KinaError as e:
        raise e.with_source(program.source).with_sources(texts) from None


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


def _check(program: ast.Program, dtypes: dict[str, str], dims: dict[str, int], library: uses.Library) -> ast.Program:
    if not program.functions:
        raise KinaError(Loc(program.filename, 1, 1), "no function defined: expected 'let NAME = fn(...) -> (...) { ... }'")
    seen: dict[str, Loc] = {}
    functions = []
    for fn in program.functions:
        if fn.name in seen:
            raise KinaError(fn.loc, f"function '{fn.name}' is already defined",
                            [(seen[fn.name], f"'{fn.name}' first defined here")])
        seen[fn.name] = fn.loc
        functions.append(_FunctionChecker(fn, dtypes, dims, library).run())
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


def resolve_type(ann: ast.TypeAnn, result: bool = False) -> TensorType:
    """Validate a written type: known dtype and placement, sizes that fit in memory; a block
    format only for a parameter, of rank >= 2, its blocked dim (-2) a static multiple of the
    block."""
    if ann.dtype not in DTYPES:
        hint = f" (did you mean {ann.dtype.upper()}?)" if ann.dtype.upper() in DTYPES else ""
        raise KinaError(ann.dtype_loc or ann.loc,
                        f"unknown dtype '{ann.dtype}': expected one of {', '.join(DTYPES)}{hint}")
    if ann.placement not in PLACEMENTS:
        raise KinaError(ann.placement_loc or ann.loc,
                        f"unknown placement '@{ann.placement}': expected @host or @device")
    ty = TensorType(ann.dtype, ann.dims, ann.placement)
    if ty.is_blocked:
        _check_blocks(ty, ann, result)
    _check_size(ty, ann.loc)
    return ty


def _check_blocks(ty: TensorType, ann: ast.TypeAnn, result: bool) -> None:
    """A block-quantized type is a parameter's (weights given to the function), of rank >= 2,
    blocked along dim -2 (the K of `x @ w`): a static multiple of the format's block."""
    block = BLOCKS[ty.dtype][0]
    where = ann.dtype_loc or ann.loc
    if result:
        raise KinaError(where, f"a result cannot be {ty.dtype}: block-quantized tensors are parameters only "
                               "(a function computes in float dtypes)")
    if ty.rank < 2:
        raise KinaError(ann.loc, f"{ty.dtype} is blocked along dim -2 (the K of x @ w), so its tensors have rank "
                                 f">= 2; {ty.shape_str()} has rank {ty.rank}")
    k = ty.dims[-2]
    at = ann.dim_locs[-2] if len(ann.dim_locs) == ty.rank else ann.loc
    if not k.is_static or k.const % block:
        raise KinaError(at, f"{ty.dtype} is blocked along dim {ty.rank - 2} in blocks of {block}: that dim must be "
                            f"a static multiple of {block}, and {ty.shape_str()} has {k}")


def _check_size(ty: TensorType, loc: Loc) -> None:
    """Refuse a tensor that could never be allocated, before MLIR (int64 sizes) or NumPy sees it.

    Each dim's constant part is bounded on its own too, so a 0 elsewhere in the
    shape cannot hide a dim that overflows int64."""
    block, size = BLOCKS.get(ty.dtype, (1, DTYPE_BYTES[ty.dtype]))
    nbytes = lambda n: n * size // block  # noqa: E731
    limit = f"more than the {MAX_TENSOR_BYTES >> 30} GiB Kina allows for one tensor"
    elements = 1
    for i, d in enumerate(ty.dims):
        if nbytes(d.const) > MAX_TENSOR_BYTES:
            raise KinaError(loc, f"dim {i} of tensor {ty.shape_str()} is too large for memory: "
                                 f"{d.const} {ty.dtype} elements need {nbytes(d.const)} bytes, {limit}")
        elements *= d.const if d.is_static else 1
    if nbytes(elements) > MAX_TENSOR_BYTES:
        what = "needs" if ty.is_static else "needs at least"
        raise KinaError(loc, f"tensor {ty.shape_str()} of {ty.dtype} {what} {nbytes(elements)} bytes, {limit}")


class _FunctionChecker(OpRules):
    """Checks one function (the operations' rules are the methods it inherits): an entry (specialised with `dtypes` and `dims`), or a callee
    (specialised from a call's arguments, `dims` then giving names a caller's `Dim`s, and
    `calls` the chain of calls from the entry, which `inline` reads)."""

    def __init__(self, fn: ast.Function, dtypes: Mapping[str, str], dims: Mapping[str, int | Dim],
                 library: uses.Library, calls: tuple = (), whence: tuple[str, str] = ("dtypes", "dims")):
        self.fn = self.written = fn  # self.fn becomes the specialised function
        self.env: dict[str, tuple[TensorType, Loc]] = {}
        self.temporaries: list[TensorType] = []
        self._parents: list = []  # the expressions being typed, innermost last (what a name is an operand of)
        self.body: list[ast.Let] = []  # the checked lets, those of inlined calls among them
        self.binding: str | None = None  # the let whose value is being typed (None: the results)
        self.whence = whence  # where dtypes and dims come from, for notes
        self.inliner = inline.Inliner(self, library, calls or ((fn, None),))
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
            if not self.inliner.failed:  # (not for one in a callee, whose own values it says)
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
        notes = [(t.loc, f"{t.name} is {self.dtypes[t.name]} (from {self.whence[0]})") for t in self.written.type_params]
        for name, value in self.dims.items():
            if value == Dim.of(name):
                continue  # a caller's dim of the same name: nothing to say
            binding = [loc for p in self.written.params for d, loc in zip(p.type.dims, p.type.dim_locs)
                       if d.symbol == name]
            notes.append(((binding or [self.dim_uses[name]])[0], f"{name} is {value} (from {self.whence[1]})"))
        return notes

    def specialise(self, ann: ast.TypeAnn) -> ast.TypeAnn:
        """The written type with type parameters and fixed dims replaced by their values."""
        return dataclasses.replace(ann, dtype=self.dtypes.get(ann.dtype) or ann.dtype,
                                   dims=tuple(d.substitute(self.dims) for d in ann.dims))

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
        self._check_dim_names()
        declared = tuple(resolve_type(t, result=True) for t in fn.result_types)
        self._check_result_dims()
        for let in fn.body:
            here: dict[str, Loc] = {}  # the names of this let so far (let (a, a) = ...)
            for name, loc in zip(ast.bound_names(let), let.name_locs if isinstance(let, ast.TupleLet) else (let.loc,)):
                if name in self.env or name in here:
                    kind = "parameter" if any(p.name == name for p in fn.params) else "name"
                    first = here[name] if name in here else self.env[name][1]
                    raise KinaError(loc, f"'{name}' is already defined (a let may not shadow a {kind})",
                                    [(first, f"'{name}' first defined here")])
                here[name] = loc
            if isinstance(let, ast.TupleLet) or isinstance(let.value, ast.Call):
                self.inliner.let(let)  # the call's lets, then this one's
            else:
                self.binding = let.name
                self.define(let.name, self.expr(let.value), let.loc)
        self.binding = None
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
        return dataclasses.replace(fn, body=tuple(self.body), results=results, sig=sig)

    def define(self, name: str, value: ast.Expr, loc: Loc) -> None:
        """Bind `name` to the typed `value`: a let of the checked body."""
        self.body.append(ast.Let(name, value, loc))
        self.env[name] = (value.type, loc)

    def _check_dim_names(self) -> None:
        """Names as written (a call gives a callee's names the caller's dims): each is alone as
        one of some parameter's dims, or given a value (`dims`, or a call's arguments)."""
        bound = {d.symbol for p in self.written.params for d in p.type.dims if d.symbol} | set(self.dims)
        for p in self.written.params:
            for d, loc in zip(p.type.dims, p.type.dim_locs):
                for name in d.names:
                    if name not in bound:
                        raise KinaError(loc, f"dim name '{name}' is not bound: some parameter must have "
                                             f"'{name}' alone as one of its dims")
        self.bound = bound

    def _check_result_dims(self) -> None:
        for ann in self.written.result_types:
            for d, loc in zip(ann.dims, ann.dim_locs):
                for name in d.names:
                    if name not in self.bound:
                        raise KinaError(loc, f"dim name '{name}' in a result type is not bound by any parameter")

    # -- expressions ---------------------------------------------------------
    def expr(self, e: ast.Expr) -> ast.Expr:
        """Type `e`; every tensor an operation makes is size-checked and recorded."""
        self._parents.append(e)
        try:
            typed = self._expr(e)
        finally:
            self._parents.pop()
        if not isinstance(e, (ast.Name, ast.Call)):  # an inlined call's tensors are its callee's
            _check_size(typed.type, e.loc)  # concat, matmul and broadcasting all grow tensors
            self.temporaries.append(typed.type)
        return typed

    def _blocked_use(self, name: ast.Name, t: TensorType) -> None:
        """A block-quantized tensor is the rhs of `@` (weights against float activations), the
        operand of `convert` (its values) or a callee's argument; anywhere else it is an error
        at the name."""
        parent = self._parents[-2] if len(self._parents) > 1 else None
        if isinstance(parent, (ast.Convert, ast.Call)) or (isinstance(parent, ast.MatMul) and parent.rhs is name):
            return
        if isinstance(parent, ast.Expr) and not isinstance(parent, ast.Name):
            where = ops.of(parent).shown
        else:
            where = "a result" if self.binding is None else f"let {self.binding}"
        raise KinaError(name.loc, f"{where}: '{name.id}' is {t.dtype}, a block-quantized tensor: it may only be the "
                                  "rhs of @ (x @ w, against float activations) or converted (convert[dtype=F32] w)",
                        [(self.env[name.id][1], f"'{name.id}' defined here")])

    def _expr(self, e: ast.Expr) -> ast.Expr:
        if isinstance(e, ast.Name):
            if e.id not in self.env:
                later = [(let.loc, f"'{e.id}' is defined here, after its use") for let in self.fn.body
                         if e.id in ast.bound_names(let)]
                raise KinaError(e.loc, f"undefined name '{e.id}'", later[:1])
            t = self.env[e.id][0]
            if t.is_blocked:
                self._blocked_use(e, t)
            return dataclasses.replace(e, type=t)
        if isinstance(e, ast.Number):
            raise KinaError(e.loc, f"a number may only appear as an operand of {ELEMENTWISE_OPS} "
                                   "(it takes the other operand's dtype and shape)")
        if isinstance(e, ast.Call):  # not an op of the table: inlined, its value a Name
            return self.inliner.value(e)
        return RULES[ops.of(e).family](self, e)
