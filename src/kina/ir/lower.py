"""Lower a checked Kina program to the reference IR: upstream MLIR on tensors.

In:  an `ast.Program` returned by `check.check` (every expression typed).
Out: an `mlir.ir.Module` of `func`, `tensor`, `linalg`, `arith` and `math` ops on
     tensors, built with the MLIR Python bindings. Nothing else: no memref, no
     bufferization, no fusion, no buffer reuse, no C-interface attributes. Every
     optimisation and the ABI are passes that run on this IR (see `kina.ir.passes`).

For `examples/storylm0_kv_step.kina` it reads:

    func.func @kv_step(%q_new: tensor<1x2x1x2xf32>, %k_past: tensor<1x2x2x3xf32>, ...)
        -> (tensor<1x2x2x4xf32>, tensor<1x2x4x2xf32>, tensor<1x2x1x2xf32>) {
      %0 = tensor.empty() : tensor<1x2x2x4xf32>
      %1 = tensor.insert_slice %k_past into %0[0, 0, 0, 0] [1, 2, 2, 3] [1, 1, 1, 1] ...
      %k_next = tensor.insert_slice %k_new into %1[0, 0, 0, 3] [1, 2, 2, 1] [1, 1, 1, 1] ...
      ...
      %scores = linalg.generic {matmul maps} ins(%q_new, %k_next ...) outs(%zeros ...)
      ...
      return %k_next, %v_next, %context : ...
    }

Guarantees:
  * one `func.func @<name>` per Kina function, its parameters and results the
    Kina ones; values are named after the parameters, lets and dim names they
    come from (`Location.name`, printed with `use_name_loc_as_prefix`), and every
    op carries the `FileLineColLoc` of the Kina expression it came from;
  * concat is a `tensor.empty` plus one `tensor.insert_slice` per operand, in
    order; never `tensor.concat`;
  * matmul is `linalg.fill` of zero then a `linalg.generic` over (batch..., i, k, j)
    (`matmul_maps`) whose body is `mac`: acc + x * y, summed over k in ascending order;
  * `*`/`+` are `linalg.generic`s; a `broadcast` operand maps its stretched dims to 0;
  * softmax is the stable decomposition: max, exp(x - max), sum, divide;
  * each op's IR comes from its family's lowering (`LOWERINGS`), which builds the op's
    `mlir` body from its entry in `ops.OPS` on each element;
  * F16 and BF16 compute in F32 and round once in the ops marked `wide` (`ops.WIDE`);
  * a symbolic dim becomes `?`, its value a `tensor.dim` of the first parameter
    that binds it.
The printed module is plain MLIR that the pinned `mlir-opt` parses, verifies and
round-trips unchanged.
"""
from __future__ import annotations

import ast as pyast
from functools import lru_cache
from math import prod
from typing import Callable

from mlir import ir
from mlir.dialects import arith, func, linalg, math, tensor

from ..frontend import ast, ops
from . import blocks
from ..frontend.ops import WIDE
from .irbuild import (DYN, affine_map, broadcast_matmul_maps, element_type, extend, generic, index, mac, mixed,
                      reassociation, slice_args, tensor_type)
from ..frontend.types import Dim, TensorType, nearest


def lower(program: ast.Program, context: ir.Context | None = None) -> ir.Module:
    ctx = context or ir.Context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create(loc=_loc(program.functions[0].loc) if program.functions else None)
        with ir.InsertionPoint(module.body):
            for fn in program.functions:
                _FunctionLowering(fn).run()
    return module


def _loc(loc, name: str | None = None) -> ir.Location:
    file_loc = ir.Location.file(loc.file, loc.line, loc.col)
    return ir.Location.name(name, childLoc=file_loc) if name else file_loc


# -- one lowering per op family ----------------------------------------------------

LOWERINGS: dict[str, Callable] = {}  # op family (ops.FAMILIES) -> its lowering


def lowers(family: str):
    """Register `fn(lowering, expr) -> ir.Value` as the lowering of the ops of `family`."""
    def register(fn):
        LOWERINGS[family] = fn
        return fn
    return register


def element(body: str, **values: ir.Value) -> ir.Value:
    """The ops on one element that an `ops.Op.mlir` body names, built on `values`:
    "arith.divf(1.0, arith.addf(1.0, math.exp(arith.negf(x))))". A number is an
    `arith.constant` of the first value's type, made before the ops, once for each
    number; an op's result has the type of its first operand."""
    tree = _parse_body(body)
    numbers = sorted((n for n in pyast.walk(tree) if isinstance(n, pyast.Constant)), key=lambda n: n.col_offset)
    like = next(iter(values.values())).type
    constants = {}
    for n in numbers:
        if n.value not in constants:
            constants[n.value] = arith.ConstantOp(like, n.value).result

    def build(node) -> ir.Value:
        if isinstance(node, pyast.Name):
            return values[node.id]
        if isinstance(node, pyast.Constant):
            return constants[node.value]
        operands = [build(a) for a in node.args]
        name = f"{node.func.value.id}.{node.func.attr}"
        return ir.Operation.create(name, results=[operands[0].type], operands=operands).result
    return build(tree)


@lru_cache(maxsize=None)
def _parse_body(body: str) -> pyast.expr:
    return pyast.parse(body, mode="eval").body


class _FunctionLowering:
    def __init__(self, fn: ast.Function):
        self.fn = fn
        self.values: dict[str, ir.Value] = {}
        self.symbols: dict[str, ir.Value] = {}
        self.dim_cache: dict[Dim, ir.Value] = {}

    def run(self) -> None:
        sig = self.fn.sig
        with _loc(self.fn.loc):
            ftype = ir.FunctionType.get([tensor_type(t) for _, t in sig.params], [tensor_type(t) for t in sig.results])
            op = func.FuncOp(self.fn.name, ftype)
            block = op.add_entry_block(arg_locs=[_loc(p.loc, p.name) for p in self.fn.params])
        with ir.InsertionPoint(block):
            for (name, t), p, arg in zip(sig.params, self.fn.params, block.arguments):
                self.values[name] = arg
                for axis, d in enumerate(t.dims):
                    if d.symbol and d.symbol not in self.symbols:
                        at = p.type.dim_locs[axis] if axis < len(p.type.dim_locs) else p.loc
                        with _loc(at):
                            axis_value = index(axis)
                        with _loc(at, d.symbol):
                            self.symbols[d.symbol] = tensor.DimOp(arg, axis_value).result
            for let in self.fn.body:
                self.values[let.name] = self.expr(let.value, let.name)
            results = [self.expr(r) for r in self.fn.results]
            with _loc(self.fn.loc):
                func.ReturnOp(results)

    def expr(self, e: ast.Expr, name: str | None = None) -> ir.Value:
        """Lower `e`; the value it yields is named `name` (a let's) when given."""
        if isinstance(e, ast.Name):
            return self.values[e.id]
        with _loc(e.loc):
            value = LOWERINGS[ops.of(e).family](self, e)
        if name:  # the op that yields the let's value carries its name
            op = value.owner
            getattr(op, "operation", op).location = _loc(e.loc, name)
        return value

    # -- helpers for the lowerings -----------------------------------------------
    def size(self, d: Dim) -> int | ir.Value:
        """A dim as a builder size: an int when static, else an index value (computed once)."""
        if d.is_static:
            return d.const
        if d not in self.dim_cache:
            acc = index(d.const) if d.const else None
            for name, c in d.terms:
                v = self.symbols[name]
                if c != 1:
                    v = arith.MulIOp(v, index(c)).result
                acc = v if acc is None else arith.AddIOp(acc, v).result
            self.dim_cache[d] = acc
        return self.dim_cache[d]

    def empty(self, t: TensorType) -> ir.Value:
        return tensor.EmptyOp([self.size(d) for d in t.dims], element_type(t.dtype)).result

    def fill(self, t: TensorType, value: float) -> ir.Value:
        cst = arith.ConstantOp(element_type(t.dtype), value).result
        return linalg.fill(cst, outs=[self.empty(t)])

    def convert(self, v: ir.Value, t: TensorType) -> ir.Value:
        """Elementwise `v` as dtype `t.dtype` (`cast` on each element), a new tensor."""
        elt = element_type(t.dtype)
        ident = ir.AffineMap.get_identity(t.rank)
        return generic([v], [self.empty(t)], [ident, ident], ["parallel"] * t.rank, lambda x, _: [cast(x, elt)])[0]


def cast(x: ir.Value, to: ir.Type) -> ir.Value:
    """One element as type `to`: extf or truncf (to nearest even; F16 and BF16, of one width,
    through F32), sitofp, extsi or trunci (wrapping). The checker refuses a float to an integer."""
    def floating(t):
        return not isinstance(t, ir.IntegerType)
    if floating(x.type) and floating(to):
        if x.type.width == to.width:
            x = arith.ExtFOp(ir.F32Type.get(), x).result
        return (arith.ExtFOp if to.width > x.type.width else arith.TruncFOp)(to, x).result
    if floating(to):
        return arith.SIToFPOp(to, x).result
    return (arith.ExtSIOp if to.width > x.type.width else arith.TruncIOp)(to, x).result


def _wide(t: TensorType, op: ops.Op) -> TensorType:
    """The type a `wide` op computes `t` in: F32 for F16 and BF16 (`ops.WIDE`)."""
    return TensorType(WIDE.get(t.dtype, t.dtype), t.dims, t.placement) if op.wide else t


@lowers("concat")
def _concat(low: _FunctionLowering, e: ast.Concat) -> ir.Value:
    out, offset, rank = low.empty(e.type), Dim(), e.type.rank
    for operand in (e.lhs, e.rhs):
        src = low.expr(operand)
        if not any(d == Dim(0) for d in operand.type.dims):  # a 0-sized slice would not verify
            offsets = [low.size(offset) if a == e.axis else 0 for a in range(rank)]
            out = tensor.InsertSliceOp(src, out, *slice_args(offsets, [low.size(d) for d in operand.type.dims])).result
        offset = offset + operand.type.dims[e.axis]
    return out


@lowers("matmul")
def _matmul(low: _FunctionLowering, e: ast.MatMul) -> ir.Value:
    """The product summed in k order (`mac`); a block-quantized rhs is dequantized first
    (kina.ir.blocks: ordinary ops on its bytes, into F32), against which the activations are
    widened as an F16 matrix would be: the sums run in F32, rounded once to lhs's dtype."""
    lhs, rhs = low.expr(e.lhs), low.expr(e.rhs)
    rhs_t = e.rhs.type
    if rhs_t.is_blocked:
        rhs = blocks.dequantize(low, rhs, rhs_t)
        rhs_t = TensorType("F32", rhs_t.dims, rhs_t.placement)
    maps, iterators = broadcast_matmul_maps(e.lhs.type, rhs_t, e.type)
    wide = _wide(e.type, ops.of(e))
    acc = generic([lhs, rhs], [low.fill(wide, 0.0)], maps[:3], iterators, lambda x, y, a: [mac(x, y, a)])[0]
    return acc if wide == e.type else low.convert(acc, e.type)


@lowers("elementwise")
def _elementwise(low: _FunctionLowering, e: ast.Binary) -> ir.Value:
    """One `linalg.generic` whose body is the op's `mlir` (its float or integer form); a
    number operand is an `arith.constant` in its body."""
    t, n = e.type, e.type.rank
    inputs, maps = [], []
    for operand in (e.lhs, e.rhs):
        if isinstance(operand, ast.Number):
            continue
        if isinstance(operand, ast.Broadcast):
            src_dims = operand.operand.type.dims
            inputs.append(low.expr(operand.operand))
            maps.append(affine_map(n, [ir.AffineConstantExpr.get(0) if sd == Dim(1) and rd != Dim(1)
                                       else ir.AffineDimExpr.get(a) for a, (sd, rd) in enumerate(zip(src_dims, t.dims))]))
        else:
            inputs.append(low.expr(operand))
            maps.append(ir.AffineMap.get_identity(n))
    op = ops.of(e).mlir[0 if t.is_float else 1]

    def body(*args):
        tensors, xy = iter(args), []
        for v in (e.lhs, e.rhs):
            if isinstance(v, ast.Number):
                with _loc(v.loc):
                    xy.append(constant(t.dtype, v.value))
            else:
                xy.append(next(tensors))
        return [element(op, x=xy[0], y=xy[1])]
    ident = ir.AffineMap.get_identity(n)
    return generic(inputs, [low.empty(t)], [*maps, ident], ["parallel"] * n, body)[0]


def constant(dtype: str, value: int | float) -> ir.Value:
    """A number as an `arith.constant` of `dtype` (its nearest value, `types.nearest`)."""
    return arith.ConstantOp(element_type(dtype), nearest(dtype, value)).result


@lowers("softmax")
def _softmax(low: _FunctionLowering, e: ast.Softmax) -> ir.Value:
    """max, exp(x - max), sum, divide (in F32 for F16 and BF16, rounded once at the end)."""
    x = low.expr(e.operand)
    t, n, axis = _wide(e.type, ops.of(e)), e.type.rank, e.axis
    if t != e.type:
        x = low.convert(x, t)
    reduced = TensorType(t.dtype, t.dims[:axis] + t.dims[axis + 1:], t.placement)
    full = ir.AffineMap.get_identity(n)
    proj = affine_map(n, [ir.AffineDimExpr.get(a) for a in range(n) if a != axis])
    reduce_its = ["reduction" if a == axis else "parallel" for a in range(n)]
    par = ["parallel"] * n
    mx = generic([x], [low.fill(reduced, float("-inf"))], [full, proj], reduce_its,
                 lambda v, acc: [arith.MaximumFOp(v, acc).result])[0]
    ex = generic([x, mx], [low.empty(t)], [full, proj, full], par,
                 lambda v, m, _: [math.ExpOp(arith.SubFOp(v, m).result).result])[0]
    sm = generic([ex], [low.fill(reduced, 0.0)], [full, proj], reduce_its,
                 lambda v, acc: [arith.AddFOp(v, acc).result])[0]
    narrow = element_type(e.type.dtype)

    def divide(v, s, _):
        q = arith.DivFOp(v, s).result
        return [q if t == e.type else arith.TruncFOp(narrow, q).result]
    return generic([ex, sm], [low.empty(e.type)], [full, proj, full], par, divide)[0]


# -- unary functions, reductions, transpose, reshape, slice ---------------------------

@lowers("unary")
def _unary(low: _FunctionLowering, e: ast.Unary) -> ir.Value:
    """One elementwise `linalg.generic` whose body is the op's `mlir`. A `wide` op of F16
    or BF16 extends each element to F32, computes there and rounds once (as NumPy's F16
    functions do)."""
    t, op = e.type, ops.of(e)
    fn = op.mlir[0 if t.is_float else 1]
    narrow = element_type(t.dtype)

    def body(x, _):
        if op.wide and t.dtype in WIDE:
            return [arith.TruncFOp(narrow, element(fn, x=extend(x))).result]
        return [element(fn, x=x)]
    ident = ir.AffineMap.get_identity(t.rank)
    return generic([low.expr(e.operand)], [low.empty(t)], [ident, ident], ["parallel"] * t.rank, body)[0]


def _keep_rank(low: _FunctionLowering, v: ir.Value, t: TensorType, axis: int) -> ir.Value:
    """`v`, a reduction over `axis` (rank t.rank - 1), as type `t` (dim `axis` 1): a `tensor.expand_shape`
    that joins the unit dim to its neighbour's group."""
    groups = [[r if r < axis else r + 1] for r in range(t.rank - 1)]  # the result dim of each reduced dim
    if groups:  # (from rank 0 there are none)
        groups[max(axis - 1, 0)] = sorted(groups[max(axis - 1, 0)] + [axis])
    dyn, static = mixed([low.size(d) for d in t.dims])
    return tensor.ExpandShapeOp(tensor_type(t), v, reassociation(groups), dyn, static).result


@lowers("reduce")
def _reduce(low: _FunctionLowering, e: ast.Reduce) -> ir.Value:
    """A `linalg.generic` reducing `axis` into a tensor without it, as softmax's max and sum
    are (a `wide` op of F16 and BF16 in F32, rounded once), then `tensor.expand_shape` to
    keep the rank. The accumulator starts at the op's `start` (-inf is the smallest integer
    for I32/I64) and takes each element through its `mlir`; mean then divides by the dim's size."""
    x, src, op = low.expr(e.operand), e.operand.type, ops.of(e)
    axis, n = e.axis, src.rank
    t = _wide(src, op)
    if t != src:
        x = low.convert(x, t)
    reduced = TensorType(t.dtype, t.dims[:axis] + t.dims[axis + 1:], t.placement)
    full = ir.AffineMap.get_identity(n)
    proj = affine_map(n, [ir.AffineDimExpr.get(a) for a in range(n) if a != axis])
    iterators = ["reduction" if a == axis else "parallel" for a in range(n)]
    if t.is_float:
        start, combine = op.start, op.mlir[0]
    else:
        start, combine = int(max(op.start, -(1 << (element_type(t.dtype).width - 1)))), op.mlir[1]
    acc = generic([x], [low.fill(reduced, start)], [full, proj], iterators,
                  lambda v, a: [element(combine, x=v, acc=a)])[0]
    out = TensorType(e.type.dtype, reduced.dims, t.placement)
    if op.divide_by_size:
        size = low.size(src.dims[axis])
        f = element_type(t.dtype)
        count = arith.ConstantOp(f, float(size)).result if isinstance(size, int) else \
            arith.SIToFPOp(f, arith.IndexCastOp(ir.IntegerType.get_signless(64), size).result).result
        narrow = element_type(out.dtype)

        def divide(v, _):
            q = arith.DivFOp(v, count).result
            return [q if t == src else arith.TruncFOp(narrow, q).result]
        ident = ir.AffineMap.get_identity(n - 1)
        acc = generic([acc], [low.empty(out)], [ident, ident], ["parallel"] * (n - 1), divide)[0]
    elif reduced.dtype != out.dtype:
        acc = low.convert(acc, out)
    return _keep_rank(low, acc, e.type, axis)


@lowers("transpose")
def _transpose(low: _FunctionLowering, e: ast.Transpose) -> ir.Value:
    """`linalg.transpose`: result dim i is operand dim perm[i], as Kina's perm says."""
    return linalg.transpose(low.expr(e.operand), outs=[low.empty(e.type)], permutation=list(e.perm)).results[0]


@lowers("convert")
def _convert(low: _FunctionLowering, e: ast.Convert) -> ir.Value:
    """One elementwise `linalg.generic` of `cast` (a convert to the operand's dtype is gone after
    check); from a block format, its dequantization (into F32, then cast if another dtype)."""
    x = low.expr(e.operand)
    if e.operand.type.is_blocked:
        x = blocks.dequantize(low, x, e.operand.type)
        return x if e.type.dtype == "F32" else low.convert(x, e.type)
    return low.convert(x, e.type)


def reshape_groups(src: tuple[Dim, ...], dst: tuple[Dim, ...]) -> list[tuple[list[int], list[int]]]:
    """Runs of consecutive dims of `src` and `dst` that hold the same elements, first to last,
    each run non-empty on both sides: [B, 512] -> [B, 8, 64] is ([0], [0]), ([1], [1, 2]).
    Two runs match when their static products and their symbolic dims (as factors) are equal.
    When nothing finer matches, one run of everything."""
    def key(dims):
        return prod(d.const for d in dims if d.is_static), sorted(str(d) for d in dims if not d.is_static)
    everything = [(list(range(len(src))), list(range(len(dst))))]
    if Dim(0) in src + dst:  # 0 times anything is 0: products say nothing about the runs
        return everything
    runs, i0, j0 = [], 0, 0
    for i in range(1, len(src) + 1):
        j = next((j for j in range(j0 + 1, len(dst) + 1) if key(src[i0:i]) == key(dst[j0:j])), None)
        if j is not None:
            runs.append((list(range(i0, i)), list(range(j0, j))))
            i0, j0 = i, j
    if not runs:
        return everything
    runs[-1][0].extend(range(i0, len(src)))  # what is left is dims of size 1
    runs[-1][1].extend(range(j0, len(dst)))
    return runs


@lowers("reshape")
def _reshape(low: _FunctionLowering, e: ast.Reshape) -> ir.Value:
    """`tensor.collapse_shape` of each run of `reshape_groups` to one dim, then
    `tensor.expand_shape` of it to the run's result dims; a step that would change
    nothing is left out, so [B, 512] -> [B, 8, 64] is one expand_shape. (Bufferization
    copies a strided operand that cannot be collapsed in place.)"""
    x, src, dst = low.expr(e.operand), e.operand.type, e.type
    elt = element_type(dst.dtype)
    if Dim(0) in dst.dims:  # no elements (and a 0 beside a ? in one group makes bufferization fail)
        return low.empty(dst)
    if src.rank == 0 or dst.rank == 0:  # one element: every other dim is 1
        if src.rank:
            return tensor.CollapseShapeOp(tensor_type(dst), x, reassociation([])).result
        dyn, static = mixed([low.size(d) for d in dst.dims])
        return tensor.ExpandShapeOp(tensor_type(dst), x, reassociation([]), dyn, static).result
    runs = reshape_groups(src.dims, dst.dims)
    value = x
    if any(len(s) > 1 for s, _ in runs):
        mid = [DYN if any(not src.dims[a].is_static for a in s) else prod(src.dims[a].const for a in s)
               for s, _ in runs]
        value = tensor.CollapseShapeOp(ir.RankedTensorType.get(mid, elt), value, reassociation([s for s, _ in runs])).result
    if any(len(d) > 1 for _, d in runs):
        dyn, static = mixed([low.size(d) for d in dst.dims])
        value = tensor.ExpandShapeOp(tensor_type(dst), value, reassociation([d for _, d in runs]), dyn, static).result
    if value == x:  # the same shape: still an op of its own, so that a let can name it
        value = tensor.CastOp(tensor_type(dst), x).result
    return value


@lowers("slice")
def _slice(low: _FunctionLowering, e: ast.Slice) -> ir.Value:
    """`tensor.extract_slice` with unit strides: offset `start` and size `size` along `axis`.
    A result with a dim of 0 is a `tensor.empty` (an offset into a dim of 0, or at the end
    of one, does not verify; every empty tensor is the same)."""
    src = e.operand.type
    if Dim(0) in e.type.dims:
        low.expr(e.operand)
        return low.empty(e.type)
    offsets = [e.start if a == e.axis else 0 for a in range(src.rank)]
    sizes = [e.size if a == e.axis else low.size(d) for a, d in enumerate(src.dims)]
    return tensor.ExtractSliceOp(tensor_type(e.type), low.expr(e.operand), *slice_args(offsets, sizes)).result
