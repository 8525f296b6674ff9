"""Lower a checked Kina program to the reference IR: upstream MLIR on tensors.

In:  an `ast.Program` returned by `check.check` (every expression typed).
Out: an `mlir.ir.Module` of `func`, `tensor`, `linalg`, `arith` and `math` ops on
     tensors, built with the MLIR Python bindings. Nothing else: no memref, no
     bufferization, no fusion, no buffer reuse, no C-interface attributes. Every
     optimisation and the ABI are passes that run on this IR (see `kina.passes`).

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
  * F16 and BF16 matmuls and softmaxes compute in F32 and round once (`WIDE`);
  * a symbolic dim becomes `?`, its value a `tensor.dim` of the first parameter
    that binds it.
The printed module is plain MLIR that the pinned `mlir-opt` parses, verifies and
round-trips unchanged.
"""
from __future__ import annotations

from typing import Callable

from mlir import ir
from mlir.dialects import arith, func, linalg, math, tensor

from . import ast
from .types import DTYPES, Dim, TensorType

DYN = ir.ShapedType.get_dynamic_size()
WIDE = {"F16": "F32", "BF16": "F32"}  # the dtypes whose sums (matmul, softmax) run in F32


def lower(program: ast.Program, context: ir.Context | None = None) -> ir.Module:
    ctx = context or ir.Context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create(loc=_loc(program.functions[0].loc) if program.functions else None)
        with ir.InsertionPoint(module.body):
            for fn in program.functions:
                _FunctionLowering(fn).run()
    return module


def print_ir(module: ir.Module, locations: bool = False) -> str:
    """The module as kinac prints it: SSA values named after the source's names."""
    return module.operation.get_asm(enable_debug_info=locations, use_name_loc_as_prefix=True)


def _loc(loc, name: str | None = None) -> ir.Location:
    file_loc = ir.Location.file(loc.file, loc.line, loc.col)
    return ir.Location.name(name, childLoc=file_loc) if name else file_loc


def element_type(dtype: str) -> ir.Type:
    return {"f16": ir.F16Type.get, "bf16": ir.BF16Type.get, "f32": ir.F32Type.get, "f64": ir.F64Type.get,
            "i32": lambda: ir.IntegerType.get_signless(32), "i64": lambda: ir.IntegerType.get_signless(64),
            }[DTYPES[dtype][0]]()


def tensor_type(t: TensorType) -> ir.RankedTensorType:
    return ir.RankedTensorType.get([d.const if d.is_static else DYN for d in t.dims], element_type(t.dtype))


def index(value: int) -> ir.Value:
    return arith.ConstantOp(ir.IndexType.get(), value).result


def affine_map(n: int, exprs) -> ir.AffineMap:
    """The affine map (d0, ..., d{n-1}) -> (exprs)."""
    return ir.AffineMap.get(n, 0, list(exprs))


def matmul_maps(rank: int) -> tuple[list[ir.AffineMap], list[str]]:
    """Maps of lhs (b..., i, k), rhs (b..., k, j), result (b..., i, j), and a second
    (b..., k, j) output (a fused concat's slot), over the domain (batch..., i, k, j)."""
    nb = rank - 2
    n = nb + 3
    d = [ir.AffineDimExpr.get(a) for a in range(n)]
    b, i, k, j = d[:nb], d[nb], d[nb + 1], d[nb + 2]
    maps = [affine_map(n, [*b, i, k]), affine_map(n, [*b, k, j]), affine_map(n, [*b, i, j]), affine_map(n, [*b, k, j])]
    return maps, ["parallel"] * nb + ["parallel", "reduction", "parallel"]


def extend(v: ir.Value) -> ir.Value:
    """`v` widened to f32 when it is f16 or bf16 (the WIDE rule), else `v`."""
    f32 = ir.F32Type.get()
    return v if v.type == f32 or v.type == ir.F64Type.get() else arith.ExtFOp(f32, v).result


def mac(x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    """A matmul's body: acc + x * y (x and y widened to acc's type)."""
    return arith.AddFOp(acc, arith.MulFOp(extend(x), extend(y)).result).result


def generic(inputs, inits, maps, iterators, body) -> list[ir.Value]:
    """A `linalg.generic` with one result per init; `body(*block_args)` returns the yielded values."""
    op = linalg.GenericOp(
        result_tensors=[v.type for v in inits], inputs=inputs, outputs=inits,
        indexing_maps=ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
        iterator_types=ir.ArrayAttr.get([ir.Attribute.parse(f"#linalg.iterator_type<{it}>") for it in iterators]))
    block = op.regions[0].blocks.append(*[v.type.element_type for v in [*inputs, *inits]],
                                        arg_locs=[op.location] * (len(inputs) + len(inits)))
    with ir.InsertionPoint(block):
        linalg.YieldOp(body(*block.arguments))
    return list(op.results)


def _mixed(values):
    """Builder operands for mixed static/dynamic sizes: (dynamic values, static ints with DYN)."""
    return [v for v in values if not isinstance(v, int)], [v if isinstance(v, int) else DYN for v in values]


def slice_args(offsets, sizes):
    """The operands of an extract_slice/insert_slice with unit strides, from ints and index values."""
    dyn_off, st_off = _mixed(offsets)
    dyn_size, st_size = _mixed(sizes)
    return dyn_off, dyn_size, [], st_off, st_size, [1] * len(sizes)


# -- one lowering per expression kind ---------------------------------------------

LOWERINGS: dict[type, Callable] = {}


def lowers(kind: type):
    """Register `fn(lowering, expr) -> ir.Value` as the lowering of `kind` expressions."""
    def register(fn):
        LOWERINGS[kind] = fn
        return fn
    return register


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
            value = LOWERINGS[type(e)](self, e)
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
        """Elementwise `v` as dtype `t.dtype` (widened or narrowed), a new tensor."""
        elt = element_type(t.dtype)
        cast = (lambda x, _: [arith.ExtFOp(elt, x).result]) if elt.width > v.type.element_type.width else \
            (lambda x, _: [arith.TruncFOp(elt, x).result])
        ident = ir.AffineMap.get_identity(t.rank)
        return generic([v], [self.empty(t)], [ident, ident], ["parallel"] * t.rank, cast)[0]


def _wide(t: TensorType) -> TensorType:
    return TensorType(WIDE.get(t.dtype, t.dtype), t.dims, t.placement)


@lowers(ast.Concat)
def _concat(low: _FunctionLowering, e: ast.Concat) -> ir.Value:
    out, offset, rank = low.empty(e.type), Dim(), e.type.rank
    for operand in (e.lhs, e.rhs):
        src = low.expr(operand)
        if not any(d == Dim(0) for d in operand.type.dims):  # a 0-sized slice would not verify
            offsets = [low.size(offset) if a == e.axis else 0 for a in range(rank)]
            out = tensor.InsertSliceOp(src, out, *slice_args(offsets, [low.size(d) for d in operand.type.dims])).result
        offset = offset + operand.type.dims[e.axis]
    return out


@lowers(ast.MatMul)
def _matmul(low: _FunctionLowering, e: ast.MatMul) -> ir.Value:
    lhs, rhs = low.expr(e.lhs), low.expr(e.rhs)
    maps, iterators = matmul_maps(e.type.rank)
    wide = _wide(e.type)
    acc = generic([lhs, rhs], [low.fill(wide, 0.0)], maps[:3], iterators, lambda x, y, a: [mac(x, y, a)])[0]
    return acc if wide == e.type else low.convert(acc, e.type)


@lowers(ast.Mul)
@lowers(ast.Add)
def _elementwise(low: _FunctionLowering, e: ast.Binary) -> ir.Value:
    t, n = e.type, e.type.rank
    inputs, maps = [], []
    for operand in (e.lhs, e.rhs):
        if isinstance(operand, ast.Broadcast):
            src_dims = operand.operand.type.dims
            inputs.append(low.expr(operand.operand))
            maps.append(affine_map(n, [ir.AffineConstantExpr.get(0) if sd == Dim(1) and rd != Dim(1)
                                       else ir.AffineDimExpr.get(a) for a, (sd, rd) in enumerate(zip(src_dims, t.dims))]))
        else:
            inputs.append(low.expr(operand))
            maps.append(ir.AffineMap.get_identity(n))
    if t.is_float:
        op = arith.MulFOp if isinstance(e, ast.Mul) else arith.AddFOp
    else:
        op = arith.MulIOp if isinstance(e, ast.Mul) else arith.AddIOp
    ident = ir.AffineMap.get_identity(n)
    return generic(inputs, [low.empty(t)], [*maps, ident], ["parallel"] * n, lambda x, y, _: [op(x, y).result])[0]


@lowers(ast.Softmax)
def _softmax(low: _FunctionLowering, e: ast.Softmax) -> ir.Value:
    """max, exp(x - max), sum, divide (in F32 for F16 and BF16, rounded once at the end)."""
    x = low.expr(e.operand)
    t, n, axis = _wide(e.type), e.type.rank, e.axis
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
