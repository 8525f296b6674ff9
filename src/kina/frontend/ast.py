"""The Kina AST: frozen dataclasses, one per grammar rule, each with a `loc`.

In:  built by `syntax.parse` from grammar.lark.
Out: a `Program` of `Function`s whose bodies are `Let`s over `Expr` trees. Which
     operation each `Expr` class is (its family, its messages) is its entry in `ops.OPS`.

Guarantees: nodes are immutable and compare by value (locations included), so a
test can write an expected tree literally. `type` is None after parsing; after
`check.check`, every `Expr` in the returned program has a concrete `TensorType`.
`type` is left out of `==`, so parsed and checked trees compare equal. A generic
function (`fn[T](...)`) is specialised by `check`: its `TypeAnn`s then carry the
concrete dtype and the fixed dims, and each `TypeParam.value` says what T became.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

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
class Function:
    name: str
    params: tuple[Param, ...]
    result_types: tuple[TypeAnn, ...]
    body: tuple[Let, ...]
    results: tuple[Expr, ...]
    loc: Loc
    type_params: tuple[TypeParam, ...] = ()
    sig: Signature | None = field(default=None, compare=False)  # set by check


@dataclass(frozen=True)
class Program:
    functions: tuple[Function, ...]
    filename: str = field(default="<string>", compare=False)
    source: str = field(default="", compare=False, repr=False)


def children(expr: Expr) -> tuple[Expr, ...]:
    """The operand expressions of `expr`, left to right (its `Expr` fields, in order)."""
    return tuple(v for v in (getattr(expr, f.name) for f in fields(expr)) if isinstance(v, Expr))


def attributes(expr: Expr) -> dict[str, object]:
    """The compared fields of `expr` that are not operands, location or type: `{"axis": 3}`."""
    return {f.name: getattr(expr, f.name) for f in fields(expr)
            if f.compare and f.name != "loc" and not isinstance(getattr(expr, f.name), Expr)}


def dump(program: Program) -> str:
    """An indented tree, one node a line; types are shown once `check` has set them."""
    out: list[str] = []

    def ty(e: Expr) -> str:
        return f" : {e.type}" if e.type is not None else ""

    def expr(e: Expr, depth: int) -> None:
        pad = "  " * depth
        if isinstance(e, Name):
            out.append(f"{pad}Name {e.id}{ty(e)}")
            return
        show = lambda v: f"[{', '.join(map(str, v))}]" if isinstance(v, tuple) else str(v)
        attrs = "".join(f" {k}={show(v)}" for k, v in attributes(e).items())
        out.append(f"{pad}{type(e).__name__}{attrs}{ty(e)}  @{e.loc.line}:{e.loc.col}")
        for child in children(e):
            expr(child, depth + 1)

    for fn in program.functions:
        tparams = ", ".join(t.name if t.value is None else f"{t.name}={t.value}" for t in fn.type_params)
        out.append(f"Function {fn.name}{f'[{tparams}]' if tparams else ''}  @{fn.loc.line}:{fn.loc.col}")
        for p in fn.params:
            out.append(f"  Param {p.name}: tensor<{p.type.dtype}, [{', '.join(map(str, p.type.dims))}], @{p.type.placement}>")
        for t in fn.result_types:
            out.append(f"  Result tensor<{t.dtype}, [{', '.join(map(str, t.dims))}], @{t.placement}>")
        for let in fn.body:
            out.append(f"  Let {let.name}  @{let.loc.line}:{let.loc.col}")
            expr(let.value, 2)
        out.append("  Return")
        for r in fn.results:
            expr(r, 2)
    return "\n".join(out) + "\n"
