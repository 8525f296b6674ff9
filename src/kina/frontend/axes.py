"""Which leading axes of a function are independent: the work the runtime may split.

In:  a checked `ast.Function`.
Out: `independent_axes(fn)`, a count k: for every index along the first k axes
     (counted from the left of the highest-rank parameter or result, lower-rank
     values aligned to the right as NumPy broadcasts), the results at that index
     depend only on the inputs at that index, or on inputs that are 1 (or absent)
     along the axis and so are shared.

The runtime uses it to run a call on several threads: it slices every parameter
and result of full extent along one of those axes into parts and calls the kernel
once per part (the kernels take any outer strides). Each part runs the same code
on the same values, so results are bit-identical for any thread count.

Guarantees: conservative. Only an axis whose extent is a symbolic dim counts (a
static one is a constant in the kernel's loops). An operation that mixes indices along an axis (concat
along it, softmax or a reduction over it, a matmul's row and contraction axes, a
reshape or transpose that moves it) stops the count there, and an op whose family
(`ops.FAMILIES`) has no entry in `KEEPS` stops it at 0. Imports nothing from `mlir` or `lark`.
"""
from __future__ import annotations

from . import ast, ops
from .types import Dim


def independent_axes(fn: ast.Function) -> int:
    values = [t for _, t in fn.sig.params] + list(fn.sig.results)
    rank = max((t.rank for t in values), default=0)
    k = rank
    exprs = [let.value for let in fn.body] + list(fn.results)
    while exprs:
        e = exprs.pop()
        exprs.extend(ast.children(e))
        k = min(k, _keeps(e, rank))
    # every value must agree along each counted axis (or be 1 there, or not have it), on a
    # symbolic dim: a static one is compiled into the kernel's loops, which would run over
    # the whole extent of a part
    for a in range(k):
        dims = {t.dims[a - (rank - t.rank)] for t in values if a - (rank - t.rank) >= 0} - {Dim(1)}
        if len(dims) > 1 or any(d.is_static for d in dims):
            return a
    return k


def _keeps(e: ast.Expr, rank: int) -> int:
    """How many leading axes (in the function's right-aligned frame) `e` keeps independent."""
    if isinstance(e, (ast.Name, ast.Number)):
        return rank
    op = ops.BY_NODE.get(type(e))
    keeps = KEEPS.get(op.family) if op else None
    return keeps(e, rank) if keeps else 0


def _shift(e: ast.Expr, rank: int) -> int:
    """Where `e`'s axis 0 sits in the function's frame."""
    return rank - e.type.rank


def _reshape(e: ast.Reshape, rank: int) -> int:  # the leading dims it leaves as they are
    old = e.operand.type.dims
    if len(old) != len(e.dims):
        return 0  # the operand's axes sit elsewhere in the frame
    return _shift(e, rank) + next((a for a, (x, y) in enumerate(zip(old, e.type.dims)) if x != y), len(old))


def _all(e: ast.Expr, rank: int) -> int:  # elementwise: index i of the result reads index i
    return rank


def _before_axis(e: ast.Expr, rank: int) -> int:  # the axes before the one it mixes
    return _shift(e, rank) + e.axis


# op family (ops.FAMILIES) -> how many leading axes an expression of it keeps independent
KEEPS = {
    "elementwise": _all, "unary": _all, "broadcast": _all, "convert": _all,
    "concat": _before_axis, "softmax": _before_axis, "reduce": _before_axis, "slice": _before_axis,
    "matmul": lambda e, rank: _shift(e, rank) + e.type.rank - 2,  # not its row and contraction axes
    "transpose": lambda e, rank: _shift(e, rank) + next((a for a, p in enumerate(e.perm) if p != a), len(e.perm)),
    "reshape": _reshape,
}
