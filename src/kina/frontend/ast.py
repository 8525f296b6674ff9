"""The Kina AST: frozen dataclasses, one per grammar rule, each with a `loc`.

In:  built by `syntax.parse` from grammar.lark.
Out: a `Program` of `Use`s and `Function`s whose bodies are `Let`s (and `TupleLet`s) over
     `Expr` trees. Which operation each `Expr` class is (its family, its messages) is its
     entry in `ops.OPS`, but for the leaves (`Name`, `Number`) and `Call`, a call of a
     function, which `check` inlines.

Guarantees: nodes are immutable and compare by value (locations included), so a
test can write an expected tree literally. `type` is None after parsing; after
`check.check`, every `Expr` in the returned program has a concrete `TensorType`.
`type` is left out of `==`, so parsed and checked trees compare equal. A generic
function (`fn[T](...)`) is specialised by `check`: its `TypeAnn`s then carry the
concrete dtype and the fixed dims, and each `TypeParam.value` says what T became.
A checked program has no `Call` and no `TupleLet`: `check` inlines every call into
plain `Let`s (see `inline.py`), so the stages after it never meet one.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

from ..errors import Loc
from .types import Dim, Signature, TensorType


@dataclass(frozen=True)
class TypeAnn:
    """A written type, not yet validated: `tensor<F32, [B, 4], @host>`."""

    dtype: str
    dims: tuple[Dim, ...]
    placement: str
    loc: Loc
    dim_locs: tuple[Loc, ...] = field(default=(), compare=False)
    dtype_loc: Loc | None = field(default=None, compare=False)
    placement_loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Expr:
    loc: Loc
    type: TensorType | None = field(default=None, compare=False, kw_only=True)


@dataclass(frozen=True)
class Name(Expr):
    id: str


@dataclass(frozen=True)
class Number(Expr):
    """A literal, `2`, `0.5`, `-1e-6`: an int when written as one, else a float. Only an
    operand of `+ - * /`; `check` gives it the other operand's type (its dtype and shape)."""

    value: int | float


@dataclass(frozen=True)
class Concat(Expr):
    axis: int
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True)
class Binary(Expr):
    """`lhs OP rhs`; the subclass names the operator."""

    lhs: Expr
    rhs: Expr


@dataclass(frozen=True)
class MatMul(Binary):
    """`lhs @ rhs`"""


@dataclass(frozen=True)
class Mul(Binary):
    """`lhs * rhs`"""


@dataclass(frozen=True)
class Add(Binary):
    """`lhs + rhs`"""


@dataclass(frozen=True)
class Sub(Binary):
    """`lhs - rhs`"""


@dataclass(frozen=True)
class Div(Binary):
    """`lhs / rhs`"""


@dataclass(frozen=True)
class Maximum(Binary):
    """`maximum(lhs, rhs)`"""


@dataclass(frozen=True)
class Broadcast(Expr):
    operand: Expr


@dataclass(frozen=True)
class Softmax(Expr):
    operand: Expr
    axis: int


@dataclass(frozen=True)
class Unary(Expr):
    """An elementwise function of one operand; the subclass names it."""

    operand: Expr


@dataclass(frozen=True)
class Neg(Unary):
    """`-operand`"""


@dataclass(frozen=True)
class Exp(Unary):
    """`exp(operand)`"""


@dataclass(frozen=True)
class Sqrt(Unary):
    """`sqrt(operand)`"""


@dataclass(frozen=True)
class Rsqrt(Unary):
    """`rsqrt(operand)`: 1 / sqrt(operand)"""


@dataclass(frozen=True)
class Sigmoid(Unary):
    """`sigmoid(operand)`: 1 / (1 + exp(-operand))"""


@dataclass(frozen=True)
class Reduce(Expr):
    """`f(operand, axis=N)`, keeping the rank (dim N becomes 1); the subclass names f."""

    operand: Expr
    axis: int


@dataclass(frozen=True)
class Sum(Reduce):
    """`sum(operand, axis=N)`"""


@dataclass(frozen=True)
class Max(Reduce):
    """`max(operand, axis=N)`"""


@dataclass(frozen=True)
class Mean(Reduce):
    """`mean(operand, axis=N)`"""


@dataclass(frozen=True)
class Transpose(Expr):
    """`transpose[perm=[...]] operand`: dim i of the result is dim perm[i] of the operand."""

    perm: tuple[int, ...]
    operand: Expr


@dataclass(frozen=True)
class Reshape(Expr):
    """`reshape[dims=[...]] operand`; `dim_locs` locate each written dim."""

    dims: tuple[Dim, ...]
    operand: Expr
    dim_locs: tuple[Loc, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Slice(Expr):
    """`slice[axis=a, start=s, size=n] operand`: dims s .. s+n-1 along a."""

    axis: int
    start: int
    size: int
    operand: Expr


@dataclass(frozen=True)
class Convert(Expr):
    """`convert[dtype=D] operand`: the operand's values as dtype D; `dtype_loc` locates D.
    D may name a type parameter until `check` gives it its dtype."""

    dtype: str
    operand: Expr
    dtype_loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Call(Expr):
    """`callee(args...)`: a call of a function of this file or of a used one. Not an
    operation of the op table: `check` inlines it, and the checked program has none."""

    callee: str
    args: tuple[Expr, ...]
    callee_loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class TypeParam:
    """A dtype variable of a generic function: the `T` of `fn[T](...)`; `check` sets `value`."""

    name: str
    loc: Loc
    value: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Param:
    name: str
    type: TypeAnn
    loc: Loc


@dataclass(frozen=True)
class Let:
    name: str
    value: Expr
    loc: Loc


@dataclass(frozen=True)
class TupleLet:
    """`let (a, b) = f(...);`: the results of a call, one name each; `loc` spans the names'
    parentheses and `name_locs` locate each name."""

    names: tuple[str, ...]
    value: Expr
    loc: Loc
    name_locs: tuple[Loc, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Use:
    """`use "FILE";`: `path` as written, relative to the folder of the file it is in."""

    path: str
    loc: Loc


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Param, ...]
    result_types: tuple[TypeAnn, ...]
    body: tuple[Let | TupleLet, ...]  # only `Let`s once checked
    results: tuple[Expr, ...]
    loc: Loc
    type_params: tuple[TypeParam, ...] = ()
    sig: Signature | None = field(default=None, compare=False)  # set by check


@dataclass(frozen=True)
class Program:
    functions: tuple[Function, ...]
    filename: str = field(default="<string>", compare=False)
    source: str = field(default="", compare=False, repr=False)
    uses: tuple[Use, ...] = ()


_OPERANDS = ("Expr", "tuple[Expr, ...]")  # the annotations of operand fields: one, or a call's arguments


def children(expr: Expr) -> tuple[Expr, ...]:
    """The operand expressions of `expr`, left to right (its `Expr` fields, in order, a
    call's arguments included)."""
    out: list[Expr] = []
    for f in fields(expr):
        if f.type in _OPERANDS:
            value = getattr(expr, f.name)
            out.extend(value if isinstance(value, tuple) else (value,))
    return tuple(out)


def with_children(expr: Expr, new: Callable[[Expr], Expr]) -> Expr:
    """`expr` with each operand `e` replaced by `new(e)` (its type and attributes kept)."""
    changes = {}
    for f in fields(expr):
        if f.type in _OPERANDS:
            value = getattr(expr, f.name)
            changes[f.name] = tuple(map(new, value)) if isinstance(value, tuple) else new(value)
    return replace(expr, **changes)


def attributes(expr: Expr) -> dict[str, object]:
    """The compared fields of `expr` that are not operands, location or type: `{"axis": 3}`."""
    return {f.name: getattr(expr, f.name) for f in fields(expr)
            if f.compare and f.name != "loc" and f.type not in _OPERANDS}


def bound_names(let: Let | TupleLet) -> tuple[str, ...]:
    """The names a let statement defines."""
    return let.names if isinstance(let, TupleLet) else (let.name,)


def dump(program: Program) -> str:
    """An indented tree, one node a line; types are shown once `check` has set them, and a
    location in another file than the program's (an inlined callee's) names that file."""
    out: list[str] = []

    def ty(e: Expr) -> str:
        return f" : {e.type}" if e.type is not None else ""

    def at(loc: Loc) -> str:
        return f"@{loc.file + ':' if loc.file != program.filename else ''}{loc.line}:{loc.col}"

    def expr(e: Expr, depth: int) -> None:
        pad = "  " * depth
        if isinstance(e, Name):
            out.append(f"{pad}Name {e.id}{ty(e)}")
            return
        if isinstance(e, Call):
            out.append(f"{pad}Call {e.callee}  {at(e.loc)}")
            for arg in e.args:
                expr(arg, depth + 1)
            return
        show = lambda v: f"[{', '.join(map(str, v))}]" if isinstance(v, tuple) else str(v)
        attrs = "".join(f" {k}={show(v)}" for k, v in attributes(e).items())
        out.append(f"{pad}{type(e).__name__}{attrs}{ty(e)}  {at(e.loc)}")
        for child in children(e):
            expr(child, depth + 1)

    for use in program.uses:
        out.append(f'Use "{use.path}"  {at(use.loc)}')
    for fn in program.functions:
        tparams = ", ".join(t.name if t.value is None else f"{t.name}={t.value}" for t in fn.type_params)
        out.append(f"Function {fn.name}{f'[{tparams}]' if tparams else ''}  {at(fn.loc)}")
        for p in fn.params:
            out.append(f"  Param {p.name}: tensor<{p.type.dtype}, [{', '.join(map(str, p.type.dims))}], @{p.type.placement}>")
        for t in fn.result_types:
            out.append(f"  Result tensor<{t.dtype}, [{', '.join(map(str, t.dims))}], @{t.placement}>")
        for let in fn.body:
            out.append(f"  Let {', '.join(bound_names(let))}  {at(let.loc)}")
            expr(let.value, 2)
        out.append("  Return")
        for r in fn.results:
            expr(r, 2)
    return "\n".join(out) + "\n"
