"""The op table: every Kina operation, defined once.

In:  nothing but `kina.frontend.ast` (the node classes the entries name).
Out: `OPS`, one `Op` per operation, in grammar.lark's order; `of(expr)`, the entry of a node;
     `WIDE`, the dtypes that compute in F32 where an entry says `wide`.

Every stage reads its part of an entry and has one piece of code per *family*, not per op:

    syntax.py     builds `op.node` for the grammar rule `-> op.name`; its messages list the words
    rules.py      RULES[op.family], the checker's rule; `op.floating` refuses integers; messages
                  call the op `op.shown`
    axes.py       which leading axes stay independent, by family
    ir/lower.py   LOWERINGS[op.family], which builds `op.mlir` on each element
    interpreter   evaluates `op.numpy` with NumPy (the tests' reference)
    editors/pygments_lexer.py  highlights grammar.lark's words, so every word op here

so a new op of an existing family is a grammar rule, its AST class and one entry. The
one-op families (concat, matmul, softmax, transpose, reshape, slice, convert) keep their rule and
lowering in rules.py and lower.py; their entries name them. tests/test_op_table.py fails
when an `ast.Expr` class lacks an entry, a grammar rule or any stage's part.

Guarantees: imports neither `mlir`, `lark` nor NumPy: MLIR ops and NumPy are named as
text, which `kina.ir.lower` and `kina.interpreter` read (see `Op.mlir` and `Op.numpy`).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import ast

# The families: ops of one family share a checker rule, a lowering and an axes rule.
FAMILIES = {
    "elementwise": "x OP y, equal shapes, with broadcast(...) and numbers; mlir combines elements x and y",
    "unary": "f(x) on each element; mlir computes it from the element x",
    "reduce": "f(x, axis=N), keeping the rank; mlir combines an element x into the accumulator acc",
    "broadcast": "broadcast(x): only an operand of an elementwise op, whose rule and lowering read it",
    "concat": "concat[axis=N] x y", "matmul": "x @ y", "softmax": "softmax(x, axis=N)",
    "transpose": "transpose[perm=[...]] x", "reshape": "reshape[dims=[...]] x",
    "slice": "slice[axis=N, start=S, size=K] x", "convert": "convert[dtype=D] x",
}

# F16 and BF16 compute in F32 and round once, in the ops marked `wide` (compiled and interpreted alike).
WIDE = {"F16": "F32", "BF16": "F32"}


@dataclass(frozen=True)
class Op:
    """One operation.

    `mlir` is (on floats, on integers): the ops on one element, written as calls,
    "arith.divf(1.0, arith.addf(1.0, math.exp(arith.negf(x))))"; "" where the dtype is
    refused or the family builds its own IR. `numpy` is a NumPy expression over the
    operands `x`, `y`, the node's attributes (`axis`, `perm`, ...) and the node `e`,
    in the compute dtype (F32 for a `wide` op of F16 or BF16)."""

    name: str  # its grammar rule (`-> name`), and the word that starts it unless it has a `symbol`
    node: type  # the ast class syntax.py builds for it
    family: str  # a key of FAMILIES
    symbol: str = ""  # written as this operator, not as a word
    called: str = ""  # what messages call it, when not `name`: "'+'", "unary '-'"
    floating: bool = False  # needs a floating dtype
    wide: bool = False  # F16 and BF16 compute in WIDE's dtype and round once
    mlir: tuple[str, str] = ("", "")
    start: float = 0.0  # a reduction's first accumulator; -inf is the smallest integer for I32/I64
    divide_by_size: bool = False  # a reduction divided by the size of its axis (mean)
    numpy: str = ""

    @property
    def shown(self) -> str:
        return self.called or self.name


OPS = (
    Op("add", ast.Add, "elementwise", symbol="+", called="'+'",
       mlir=("arith.addf(x, y)", "arith.addi(x, y)"), numpy="np.add(x, y)"),
    Op("sub", ast.Sub, "elementwise", symbol="-", called="'-'",
       mlir=("arith.subf(x, y)", "arith.subi(x, y)"), numpy="np.subtract(x, y)"),
    Op("mul", ast.Mul, "elementwise", symbol="*", called="'*'",
       mlir=("arith.mulf(x, y)", "arith.muli(x, y)"), numpy="np.multiply(x, y)"),
    Op("div", ast.Div, "elementwise", symbol="/", called="'/'", floating=True,  # no integer division
       mlir=("arith.divf(x, y)", ""), numpy="np.divide(x, y)"),
    Op("matmul", ast.MatMul, "matmul", symbol="@", floating=True, wide=True,
       numpy="matmul_k_ascending(x, y) if e.type.dtype in WIDE else np.matmul(x, y)"),
    Op("neg", ast.Neg, "unary", symbol="-", called="unary '-'",
       mlir=("arith.negf(x)", "arith.subi(0, x)"), numpy="np.negative(x)"),
    Op("concat", ast.Concat, "concat", numpy="np.concatenate([x, y], axis=axis)"),
    Op("transpose", ast.Transpose, "transpose", numpy="np.transpose(x, perm)"),
    Op("reshape", ast.Reshape, "reshape", numpy="reshape(e, x)"),
    Op("slice", ast.Slice, "slice", numpy="np.take(x, np.arange(start, start + size), axis=axis)"),
    Op("convert", ast.Convert, "convert", numpy="x.astype(numpy_dtype(dtype))"),  # bit-exact, as compiled
    Op("broadcast", ast.Broadcast, "broadcast", numpy="x"),  # NumPy's broadcasting in + - * / stretches it
    Op("softmax", ast.Softmax, "softmax", floating=True, wide=True, numpy="softmax(x, axis)"),
    Op("exp", ast.Exp, "unary", floating=True, wide=True, mlir=("math.exp(x)", ""), numpy="np.exp(x)"),
    Op("sqrt", ast.Sqrt, "unary", floating=True, wide=True, mlir=("math.sqrt(x)", ""), numpy="np.sqrt(x)"),
    Op("rsqrt", ast.Rsqrt, "unary", floating=True, wide=True, mlir=("math.rsqrt(x)", ""), numpy="1 / np.sqrt(x)"),
    Op("sigmoid", ast.Sigmoid, "unary", floating=True, wide=True,
       mlir=("arith.divf(1.0, arith.addf(1.0, math.exp(arith.negf(x))))", ""), numpy="1 / (1 + np.exp(-x))"),
    Op("maximum", ast.Maximum, "elementwise", mlir=("arith.maximumf(x, y)", "arith.maxsi(x, y)"),
       numpy="np.maximum(x, y)"),  # NaN propagates in both; -0.0 and +0.0 compare equal (compiled: +0.0)
    Op("sum", ast.Sum, "reduce", wide=True, mlir=("arith.addf(x, acc)", "arith.addi(x, acc)"),
       numpy="np.sum(x, axis=axis, keepdims=True, dtype=x.dtype)"),  # integers wrap, as compiled
    Op("max", ast.Max, "reduce", start=float("-inf"), mlir=("arith.maximumf(x, acc)", "arith.maxsi(x, acc)"),
       numpy="np.max(x, axis=axis, keepdims=True, initial=lowest(x.dtype))"),
    Op("mean", ast.Mean, "reduce", floating=True, wide=True, divide_by_size=True, mlir=("arith.addf(x, acc)", ""),
       numpy="np.sum(x, axis=axis, keepdims=True) / x.dtype.type(x.shape[axis])"),  # 0 / 0 is NaN
)

BY_NAME = {op.name: op for op in OPS}
BY_NODE = {op.node: op for op in OPS}


def of(e: ast.Expr) -> Op:
    """The entry of the operation `e` is."""
    return BY_NODE[type(e)]


def listing(names: list[str]) -> str:
    """"a, b or c"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
