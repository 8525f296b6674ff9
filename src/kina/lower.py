"""Lower a checked Kina program to MLIR (func, tensor, linalg, arith, math).

In:  an `ast.Program` returned by `check.check` (every expression typed).
Out: an `mlir.ir.Module`, built with the MLIR Python bindings' builders.

Guarantees:
  * one `func.func @kina_<name>` per Kina function, with `llvm.emit_c_interface`, in
    destination-passing style: parameters then one out-buffer per result, each a
    memref with unit innermost stride and any outer strides (see `memref_type`);
    the body works on tensors between `to_tensor` and `materialize_in_destination`;
  * concat is `tensor.empty` (or the result's out-buffer) + one
    `tensor.insert_slice` per operand; never `tensor.concat`;
  * matmul is a `linalg.generic` over (batch..., i, k, j): the innermost loop runs
    along j, unit stride in both the rhs and the result; after bufferization,
    `matmuls_to_loops` turns it into unroll-and-jammed loops (same k order); a
    one-row matmul whose rhs is a let-bound concat along its column or
    contraction axis also writes that concat, in the same pass
    (`_fusable_concats`), with the same summation order, so fused and unfused
    results are bit-identical;
  * `*`/`+` with `broadcast` are `linalg.generic`s whose broadcast operand maps
    stretched dims to the constant 0;
  * softmax is the stable decomposition: max, exp(x - max), sum, divide; after
    bufferization, innermost-dim sums run as vector partial sums in a fixed order
    (`sums_to_loops`) and f32 exp is expanded into arith ops (`exps_to_arith`,
    <= 1 ulp), so every element's bits are the same for any size and target CPU;
  * an elementwise op or softmax whose operand dies there writes over that
    operand's tensor, so bufferization updates the buffer in place;
  * F16 and BF16 matmuls and softmaxes compute in F32 and round once (`WIDE`);
  * a symbolic dim becomes `?`, its value computed from `tensor.dim` of the
    parameter that binds it;
  * every op carries the `FileLineColLoc` of the Kina expression it came from.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, bufferization, func, linalg, math, tensor

from . import ast
from .diagnostics import KinaError
from .types import DTYPES, Dim, TensorType

DYN = ir.ShapedType.get_dynamic_size()
# Exported names are prefixed, so that a Kina function called `exp` or `free` cannot
# replace the libm/libc function the generated code calls.
SYMBOL_PREFIX = "kina_"
DYN_STRIDE = ir.ShapedType.get_dynamic_stride_or_offset()
WIDE = {"F16": "F32", "BF16": "F32"}  # the dtypes whose sums (matmul, softmax) run in F32


def lower(program: ast.Program, context: ir.Context | None = None) -> ir.Module:
    ctx = context or ir.Context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create(loc=_loc(program.functions[0].loc) if program.functions else None)
        with ir.InsertionPoint(module.body):
            for fn in program.functions:
                _FunctionLowering(fn).run()
    return module


def require_host(program: ast.Program) -> None:
    """Only @host programs compile; @device ones parse and check but stop here."""
    for fn in program.functions:
        for p in fn.params:
            if p.type.placement != "host":
                raise KinaError(p.type.placement_loc or p.loc,
                                f"parameter '{p.name}' is @{p.type.placement}: only @host tensors can be compiled",
                                source=program.source)
        for ann in fn.result_types:
            if ann.placement != "host":
                raise KinaError(ann.placement_loc or ann.loc, "only @host results can be compiled", source=program.source)


def _loc(loc) -> ir.Location:
    return ir.Location.file(loc.file, loc.line, loc.col)


def element_type(dtype: str) -> ir.Type:
    return {"f16": ir.F16Type.get, "bf16": ir.BF16Type.get, "f32": ir.F32Type.get, "f64": ir.F64Type.get,
            "i32": lambda: ir.IntegerType.get_signless(32), "i64": lambda: ir.IntegerType.get_signless(64),
            }[DTYPES[dtype][0]]()


def tensor_type(t: TensorType) -> ir.RankedTensorType:
    return ir.RankedTensorType.get([d.const if d.is_static else DYN for d in t.dims], element_type(t.dtype))


def memref_type(t: TensorType) -> ir.MemRefType:
    """The boundary type: any outer strides and offset, unit innermost stride.

    So the caller can pass views (a cache's filled prefix, a slice) without a copy,
    while the innermost loops still see unit stride and vectorise.
    """
    strides = [DYN_STRIDE] * (t.rank - 1) + [1] if t.rank else []
    layout = ir.StridedLayoutAttr.get(DYN_STRIDE, strides)
    return ir.MemRefType.get([d.const if d.is_static else DYN for d in t.dims], element_type(t.dtype), layout)


def _rewrite_each(module: ir.Module, match, rewrite) -> int:
    """Walk `module`; for every op that `match(op)` gives a truthy answer, build
    `rewrite(op, answer)` in its place (and at its location), then erase the op.
    Returns how many were rewritten. The post-bufferization rewrites use it."""
    found = []

    def visit(op):
        answer = match(op)
        if answer:
            found.append((op, answer))
        return ir.WalkResult.ADVANCE

    with module.context:
        module.operation.walk(visit)
        for op, answer in found:
            with ir.InsertionPoint(op), op.location:
                rewrite(op, answer)
            op.erase()
    return len(found)


def copies_to_linalg(module: ir.Module) -> int:
    """After bufferization: rewrite every `memref.copy` as a `linalg.copy`.

    A copy into a strided subview (what concat's insert_slice becomes) would
    otherwise lower to a call to `memrefCopy` from MLIR's C runner library; as a
    linalg op it lowers to plain loops that LLVM vectorises. Returns the count.
    """
    return _rewrite_each(module, lambda op: op.name == "memref.copy",
                         lambda op, _: linalg.copy(op.operands[0], outs=[op.operands[1]]))


def _affine_dims(n: int) -> list:
    return [ir.AffineDimExpr.get(i) for i in range(n)]


def _map(n: int, exprs) -> ir.AffineMap:
    return ir.AffineMap.get(n, 0, list(exprs))


def _matmul_maps(rank: int):
    """Maps of lhs, rhs, result (and a fused concat slot) over (batch..., i, k, j)."""
    nb = rank - 2
    n = nb + 3  # iteration domain: batch..., i, k, j
    d = _affine_dims(n)
    b, i, k, j = d[:nb], d[nb], d[nb + 1], d[nb + 2]
    maps = [_map(n, [*b, i, k]), _map(n, [*b, k, j]), _map(n, [*b, i, j]), _map(n, [*b, k, j])]
    return maps, ["parallel"] * nb + ["parallel", "reduction", "parallel"]


def _fusable_concats(fn: ast.Function) -> set[str]:
    """Let-bound concats read as the rhs of a matmul that the matmul can produce itself.

    That is a decode-shaped matmul (one lhs row, static) whose rhs is concatenated
    along its column or contraction axis: fusing the copy into the matmul reads each
    operand once instead of twice (copy, then matmul), which is what makes the
    KV-cache step memory-bound at one pass over the cache.
    """
    concats = {let.name: let.value for let in fn.body if isinstance(let.value, ast.Concat)}
    found: set[str] = set()

    def visit(e: ast.Expr) -> None:
        if isinstance(e, ast.MatMul) and isinstance(e.rhs, ast.Name) and e.rhs.id in concats:
            cat, rank = concats[e.rhs.id], e.type.rank
            if e.lhs.type.dims[-2] == Dim(1) and cat.axis in (rank - 1, rank - 2):
                found.add(e.rhs.id)
        for child in ast.children(e):
            visit(child)

    for expr in [let.value for let in fn.body] + list(fn.results):
        visit(expr)
    return found


def _single_use(fn: ast.Function) -> set[str]:
    """Lets computed by an op (not aliases of another name) that are read exactly once.

    Their tensor may become the destination of the elementwise op that reads them
    (see `_FunctionLowering.reusable`), so bufferization updates that buffer in
    place instead of allocating another.
    """
    uses: dict[str, int] = {}

    def visit(e: ast.Expr) -> None:
        if isinstance(e, ast.Name):
            uses[e.id] = uses.get(e.id, 0) + 1
        for child in ast.children(e):
            visit(child)

    for expr in [let.value for let in fn.body] + list(fn.results):
        visit(expr)
    return {let.name for let in fn.body if uses.get(let.name) == 1 and not isinstance(let.value, ast.Name)}


class _FunctionLowering:
    def __init__(self, fn: ast.Function):
        self.fn = fn
        self.values: dict[str, ir.Value] = {}
        self.symbols: dict[str, ir.Value] = {}
        self.dim_cache: dict[Dim, ir.Value] = {}

    def run(self) -> None:
        """Destination-passing at the boundary: `fn(in_0, ..., in_n, out_0, ..., out_m)`.

        Each parameter is a strided buffer read through `bufferization.to_tensor`;
        each result is materialized into the caller's buffer, so the caller owns
        every result and nothing computed here escapes or leaks.
        """
        sig = self.fn.sig
        with _loc(self.fn.loc):
            ftype = ir.FunctionType.get([memref_type(t) for _, t in sig.params] + [memref_type(t) for t in sig.results], [])
            op = func.FuncOp(SYMBOL_PREFIX + self.fn.name, ftype)
            op.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
            block = op.add_entry_block()
        with ir.InsertionPoint(block):
            for (name, t), p, arg in zip(sig.params, self.fn.params, block.arguments):
                with _loc(p.loc):
                    value = bufferization.ToTensorOp(tensor_type(t), arg, restrict=True).result
                self.values[name] = value
                for axis, d in enumerate(t.dims):
                    if d.symbol and d.symbol not in self.symbols:
                        with _loc(p.loc):
                            self.symbols[d.symbol] = tensor.DimOp(value, self._index(axis)).result
            outs = block.arguments[len(sig.params):]
            # A result computed by a let is written straight into its out-buffer: its
            # op's destination is that buffer, so no temporary and no copy.
            self.dest: dict[str, ir.Value] = {}
            for r, t, out in zip(self.fn.results, sig.results, outs):
                if isinstance(r, ast.Name) and r.id not in self.dest and r.id not in self.values:
                    with _loc(r.loc):
                        self.dest[r.id] = bufferization.ToTensorOp(tensor_type(t), out, restrict=True, writable=True).result
            self.pending = {}  # concats to be computed inside the matmul that reads them
            self.single_use = _single_use(self.fn)
            fusable = _fusable_concats(self.fn)
            for let in self.fn.body:
                if let.name in fusable:
                    self.pending[let.name] = (let.name, let.value, self.dest.get(let.name))
                else:
                    self.values[let.name] = self.expr(let.value, self.dest.get(let.name))
            for r, out in zip(self.fn.results, outs):
                value = self.expr(r)
                with _loc(r.loc):
                    bufferization.MaterializeInDestinationOp(None, value, out, restrict=True, writable=True)
            with _loc(self.fn.loc):
                func.ReturnOp([])

    # -- helpers -------------------------------------------------------------
    def _index(self, value: int) -> ir.Value:
        return arith.ConstantOp(ir.IndexType.get(), value).result

    def size(self, d: Dim) -> int | ir.Value:
        """A dim as a builder size: an int when static, else an index value."""
        if d.is_static:
            return d.const
        if d not in self.dim_cache:
            acc = self._index(d.const) if d.const else None
            for name, c in d.terms:
                v = self.symbols[name]
                if c != 1:
                    v = arith.MulIOp(v, self._index(c)).result
                acc = v if acc is None else arith.AddIOp(acc, v).result
            self.dim_cache[d] = acc
        return self.dim_cache[d]

    def empty(self, t: TensorType) -> ir.Value:
        return tensor.EmptyOp([self.size(d) for d in t.dims], element_type(t.dtype)).result

    def fill(self, t: TensorType, value: float) -> ir.Value:
        cst = arith.ConstantOp(element_type(t.dtype), value).result
        return linalg.fill(cst, outs=[self.empty(t)])

    @staticmethod
    def _mixed(values):
        static = [v if isinstance(v, int) else DYN for v in values]
        dynamic = [v for v in values if not isinstance(v, int)]
        return dynamic, static

    def generic(self, inputs, init, maps, iterators, body):
        """A linalg.generic with one result; `body(*block_args) -> yielded value`."""
        return self.generic_n(inputs, [init], maps, iterators, lambda *args: [body(*args)])[0]

    def generic_n(self, inputs, inits, maps, iterators, body):
        """A linalg.generic with one result per init; `body(*block_args) -> [yielded values]`."""
        op = linalg.GenericOp(
            result_tensors=[v.type for v in inits], inputs=inputs, outputs=inits,
            indexing_maps=ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
            iterator_types=ir.ArrayAttr.get([ir.Attribute.parse(f"#linalg.iterator_type<{it}>") for it in iterators]))
        block = op.regions[0].blocks.append(*[v.type.element_type for v in [*inputs, *inits]])
        with ir.InsertionPoint(block):
            linalg.YieldOp(body(*block.arguments))
        return list(op.results)

    def _slice_args(self, rank: int, axis: int, offset: Dim, sizes: tuple[Dim, ...]):
        offsets = [self.size(offset) if a == axis else 0 for a in range(rank)]
        dyn_off, st_off = self._mixed(offsets)
        dyn_size, st_size = self._mixed([self.size(d) for d in sizes])
        return dyn_off, dyn_size, [], st_off, st_size, [1] * rank

    def extract(self, value: ir.Value, t: TensorType, axis: int, offset: Dim, sizes: tuple[Dim, ...]) -> ir.Value:
        """`value[..., offset:offset+sizes[axis], ...]` along `axis` (whole along the others)."""
        part = tensor_type(TensorType(t.dtype, sizes, t.placement))
        return tensor.ExtractSliceOp(part, value, *self._slice_args(t.rank, axis, offset, sizes)).result

    def insert(self, part: ir.Value, into: ir.Value, rank: int, axis: int, offset: Dim, sizes: tuple[Dim, ...]) -> ir.Value:
        return tensor.InsertSliceOp(part, into, *self._slice_args(rank, axis, offset, sizes)).result

    def reusable(self, operand: ast.Expr) -> bool:
        """Is `operand`'s tensor dead after the op that reads it? A subexpression's
        tensor is used once by construction; a let's when `_single_use` says so."""
        if isinstance(operand, ast.Name):
            return operand.id in self.single_use
        return not isinstance(operand, ast.Broadcast)

    def destination(self, t: TensorType, dest: ir.Value | None, candidates) -> ir.Value:
        """Where an elementwise op of type `t` writes: `dest` if given, else the tensor of
        a dying operand of the same type (updated in place: no new buffer), else a new one."""
        if dest is not None:
            return dest
        for operand, value in candidates:
            if operand.type == t and self.reusable(operand):
                return value
        return self.empty(t)

    # -- expressions ---------------------------------------------------------
    def expr(self, e: ast.Expr, dest: ir.Value | None = None) -> ir.Value:
        """Lower `e`; its final op writes into `dest` when given, else into a new tensor."""
        if isinstance(e, ast.Name):
            if e.id in self.pending:  # needed before (or without) its fusing matmul: compute it now
                name, cat, cat_dest = self.pending.pop(e.id)
                self.values[name] = self.expr(cat, cat_dest)
            return self.values[e.id]
        with _loc(e.loc):
            if isinstance(e, ast.ELEMENTWISE):
                return self.elementwise(e, dest)
            if isinstance(e, ast.Softmax):
                return self.softmax(e, dest)
            out = dest if dest is not None else self.empty(e.type)
            if isinstance(e, ast.Concat):
                return self.concat(e, out)
            if isinstance(e, ast.MatMul):
                return self.matmul(e, out)
        raise AssertionError(f"cannot lower {e!r}")

    def concat(self, e: ast.Concat, out: ir.Value) -> ir.Value:
        # One insert_slice per operand into the destination. Bufferization turns each
        # into a copy into a subview of the destination buffer; `copies_to_linalg`
        # then makes those copies loops rather than calls to the memrefCopy runtime.
        offset = Dim()
        for operand in (e.lhs, e.rhs):
            src = self.expr(operand)
            if not any(d == Dim(0) for d in operand.type.dims):  # a 0-sized slice would not verify
                out = self.insert(src, out, e.type.rank, e.axis, offset, operand.type.dims)
            offset = offset + operand.type.dims[e.axis]
        return out

    # -- wide accumulation: F16 and BF16 sums run in F32, as NumPy's do ----------
    @staticmethod
    def _wide(t: TensorType) -> TensorType:
        return TensorType(WIDE.get(t.dtype, t.dtype), t.dims, t.placement)

    def _ext(self, v: ir.Value) -> ir.Value:
        f32 = ir.F32Type.get()
        return v if v.type == f32 or v.type == ir.F64Type.get() else arith.ExtFOp(f32, v).result

    def _convert(self, v: ir.Value, t: TensorType, out: ir.Value) -> ir.Value:
        """Elementwise `v` into `out`, widened or narrowed to `out`'s element type."""
        elt = out.type.element_type
        cast = (lambda x, _: arith.ExtFOp(elt, x).result) if elt.width > v.type.element_type.width else \
            (lambda x, _: arith.TruncFOp(elt, x).result)
        ident = ir.AffineMap.get_identity(t.rank)
        return self.generic([v], out, [ident, ident], ["parallel"] * t.rank, cast)

    def _mac(self, x, y, acc):
        return arith.AddFOp(acc, arith.MulFOp(self._ext(x), self._ext(y)).result).result

    def matmul(self, e: ast.MatMul, out: ir.Value) -> ir.Value:
        lhs = self.expr(e.lhs)  # first: if it reads the concat too, that computes the concat on its own
        if isinstance(e.rhs, ast.Name) and e.rhs.id in self.pending:
            return self.matmul_fused_concat(e, lhs, out, *self.pending.pop(e.rhs.id))
        rhs = self.expr(e.rhs)
        maps, iterators = _matmul_maps(e.type.rank)
        wide = self._wide(e.type)
        init = out if wide == e.type else self.empty(wide)
        zero = arith.ConstantOp(element_type(wide.dtype), 0.0).result
        acc = self.generic([lhs, rhs], linalg.fill(zero, outs=[init]), maps[:3], iterators, self._mac)
        return acc if wide == e.type else self._convert(acc, wide, out)

    def matmul_fused_concat(self, e: ast.MatMul, lhs: ir.Value, out: ir.Value, name: str, cat: ast.Concat,
                            dest) -> ir.Value:
        """`lhs @ concat(a, b)` in one pass over `a` and `b`, also writing the concat.

        The matmul is split along the concat axis: by output column when it is the
        rhs's last axis, by contraction index when it is the second-to-last. Each
        part is one linalg.generic that reads its operand once and yields both the
        product and the operand's copy into the concat's slot. Each output element
        sums over k in the same order as the unfused matmul, so results are identical.
        """
        rank, axis = e.type.rank, cat.axis
        with _loc(cat.loc):
            concat_out = dest if dest is not None else self.empty(cat.type)
        maps, iterators = _matmul_maps(rank)
        wide = self._wide(e.type)
        zero = arith.ConstantOp(element_type(wide.dtype), 0.0).result
        acc = linalg.fill(zero, outs=[out if wide == e.type else self.empty(wide)])
        offset = Dim()
        for part in (cat.lhs, cat.rhs):
            src, dims = self.expr(part), part.type.dims
            if not any(d == Dim(0) for d in dims):
                with _loc(cat.loc):
                    slot = self.extract(concat_out, cat.type, axis, offset, dims)
                if axis == rank - 1:
                    out_dims = e.type.dims[:-1] + (dims[-1],)
                    acc_part, lhs_part = self.extract(acc, wide, axis, offset, out_dims), lhs
                else:
                    lhs_dims = e.lhs.type.dims[:-1] + (dims[-2],)
                    acc_part, lhs_part = acc, self.extract(lhs, e.lhs.type, rank - 1, offset, lhs_dims)
                product, copied = self.generic_n([lhs_part, src], [acc_part, slot], maps, iterators,
                                                 lambda x, y, a, _: [self._mac(x, y, a), y])
                with _loc(cat.loc):
                    concat_out = self.insert(copied, concat_out, rank, axis, offset, dims)
                acc = self.insert(product, acc, rank, axis, offset, out_dims) if axis == rank - 1 else product
            offset = offset + dims[axis]
        self.values[name] = concat_out
        return acc if wide == e.type else self._convert(acc, wide, out)

    def elementwise(self, e: ast.Mul | ast.Add, dest: ir.Value | None) -> ir.Value:
        t, n = e.type, e.type.rank
        inputs, maps = [], []
        for operand in (e.lhs, e.rhs):
            if isinstance(operand, ast.Broadcast):
                src_dims = operand.operand.type.dims
                inputs.append(self.expr(operand.operand))
                maps.append(_map(n, [ir.AffineConstantExpr.get(0) if sd == Dim(1) and rd != Dim(1) else ir.AffineDimExpr.get(a)
                                     for a, (sd, rd) in enumerate(zip(src_dims, t.dims))]))
            else:
                inputs.append(self.expr(operand))
                maps.append(ir.AffineMap.get_identity(n))
        maps.append(ir.AffineMap.get_identity(n))
        out = self.destination(t, dest, zip((e.lhs, e.rhs), inputs))
        if t.is_float:
            op = arith.MulFOp if isinstance(e, ast.Mul) else arith.AddFOp
        else:
            op = arith.MulIOp if isinstance(e, ast.Mul) else arith.AddIOp
        return self.generic(inputs, out, maps, ["parallel"] * n, lambda x, y, _: op(x, y).result)

    def softmax(self, e: ast.Softmax, dest: ir.Value | None) -> ir.Value:
        """max, exp(x - max), sum, divide. exp writes over x when x dies here, and the
        division over exp's result unless the softmax has a destination: one buffer."""
        x = self.expr(e.operand)
        t, n, axis = self._wide(e.type), e.type.rank, e.axis
        dying = self.reusable(e.operand)
        if t != e.type:
            x, dying = self._convert(x, e.type, self.empty(t)), True
        reduced = TensorType(t.dtype, t.dims[:axis] + t.dims[axis + 1:], t.placement)
        full, proj = ir.AffineMap.get_identity(n), _map(n, [ir.AffineDimExpr.get(a) for a in range(n) if a != axis])
        reduce_its = ["reduction" if a == axis else "parallel" for a in range(n)]
        par = ["parallel"] * n
        mx = self.generic([x], self.fill(reduced, float("-inf")), [full, proj], reduce_its,
                          lambda v, acc: arith.MaximumFOp(v, acc).result)
        ex = self.generic([x, mx], x if dying else self.empty(t), [full, proj, full], par,
                          lambda v, m, _: math.ExpOp(arith.SubFOp(v, m).result).result)
        sm = self.generic([ex], self.fill(reduced, 0.0), [full, proj], reduce_its,
                          lambda v, acc: arith.AddFOp(v, acc).result)
        out = dest if dest is not None else ex if t == e.type else self.empty(e.type)
        if t == e.type:
            return self.generic([ex, sm], out, [full, proj, full], par, lambda v, s, _: arith.DivFOp(v, s).result)
        narrow = out.type.element_type
        return self.generic([ex, sm], out, [full, proj, full], par,
                            lambda v, s, _: arith.TruncFOp(narrow, arith.DivFOp(v, s).result).result)


def exps_to_arith(module: ir.Module) -> int:
    """Replace every f32 `math.exp` by `exp_f32`'s arith ops (in place, so it runs at
    any stage; kinac runs it after bufferization). Returns the count."""
    return _rewrite_each(module, lambda op: op.name == "math.exp" and op.results[0].type == ir.F32Type.get(),
                         lambda op, _: op.results[0].replace_all_uses_with(exp_f32(op.operands[0])))


def exp_f32(x: ir.Value) -> ir.Value:
    """e**x for an f32 `x`, as plain arith ops: the same IEEE operations whether LLVM
    runs them on vectors or one at a time, so every element gets the same bits
    wherever it sits, for any size, static or symbolic, and any target CPU (libm's
    expf is a call that blocks vectorisation; a vector math library would give the
    vectorised body and the scalar tail of a loop different bits).

    Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, with ln2 split in two so that
    k * C1 is exact; e**r by the degree-7 polynomial of Cephes' expf; then the two
    halves of 2**k multiplied in, so that results in the subnormal range round once.
    Measured error <= 1 ulp against float64 over every f32 in [-104, 88.7]
    (tests/test_lowering.py); e**-inf = 0, e**inf = inf, NaN stays NaN.
    """
    f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
    c = lambda v: arith.ConstantOp(f32, v).result
    i = lambda v: arith.ConstantOp(i32, v).result
    mul = lambda a, b: arith.MulFOp(a, b).result
    add = lambda a, b: arith.AddFOp(a, b).result
    cmp = lambda pred, a, b: arith.CmpFOp(pred, a, b).result
    sel = lambda cond, a, b: arith.SelectOp(cond, a, b).result
    lo, hi = -104.0, 88.72283935546875  # beyond them e**x is 0 and inf in f32
    nan = cmp(arith.CmpFPredicate.UNO, x, x)
    xs = sel(nan, c(0.0), arith.MinimumFOp(arith.MaximumFOp(x, c(lo)).result, c(hi)).result)
    # round to nearest even by adding and taking away 1.5 * 2**23 (exact for |x| < 2**22):
    # math.roundeven would be a libm call, not vectorised, on CPUs without SSE4.1
    magic = c(12582912.0)
    k = arith.SubFOp(add(mul(xs, c(1.44269504088896341)), magic), magic).result
    r = add(add(xs, mul(k, c(-0.693359375))), mul(k, c(2.12194440e-4)))
    y = c(1.9875691500e-4)
    for coeff in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        y = add(mul(y, r), c(coeff))
    y = add(add(mul(y, mul(r, r)), r), c(1.0))
    ki = arith.FPToSIOp(i32, k).result
    half = arith.ShRSIOp(ki, i(1)).result
    scale = lambda n: arith.BitcastOp(f32, arith.ShLIOp(arith.AddIOp(n, i(127)).result, i(23)).result).result
    y = mul(mul(y, scale(half)), scale(arith.SubIOp(ki, half).result))
    y = sel(cmp(arith.CmpFPredicate.OLT, x, c(lo)), c(0.0), y)
    y = sel(cmp(arith.CmpFPredicate.OGT, x, c(hi)), c(float("inf")), y)
    return sel(nan, x, y)


# The matmul loops (see `matmuls_to_loops`): how many rhs rows one pass over j
# reads side by side, and how many bytes of a row one vector step covers.
UNROLL_K = 8
VECTOR_BYTES = 128
NT_ALIGN = 64  # bytes: what a non-temporal vector store needs
REGISTER_ROW_BYTES = 512  # a matmul's output rows up to this long keep their sums in registers


def _matmul_kind(op) -> str | None:
    """"plain" for a bufferized `linalg.generic` exactly as `matmul` emits it: ins
    (b..., i, k) and (b..., k, j), one out (b..., i, j), body `acc + x * y`; "fused"
    for the same with a second out (b..., k, j) that receives y (a concat's copy,
    see `_fusable_concats`); None for anything else."""
    if op.name != "linalg.generic":
        return None
    ins, outs = list(op.opview.inputs), list(op.opview.outputs)
    if len(ins) != 2 or len(outs) not in (1, 2) or not all(isinstance(v.type, ir.MemRefType) for v in ins + outs):
        return None
    rank = ir.MemRefType(outs[0].type).rank
    if rank < 2:
        return None
    maps, iterators = _matmul_maps(rank)
    if [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]] != maps[:2 + len(outs)]:
        return None
    if [str(a) for a in op.attributes["iterator_types"]] != [f"#linalg.iterator_type<{it}>" for it in iterators]:
        return None
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if [o.name for o in body] != ["arith.mulf", "arith.addf", "linalg.yield"]:
        return None
    x, y, acc = list(block.arguments)[:3]
    mul, add, yld = body
    copied = [y] if len(outs) == 2 else []
    if list(mul.operands) == [x, y] and list(add.operands) == [acc, mul.result] and \
            list(yld.operands) == [add.result, *copied]:
        return "fused" if copied else "plain"
    return None


def matmuls_to_loops(module: ir.Module, unroll: int = UNROLL_K, vector_bytes: int = VECTOR_BYTES) -> int:
    """After bufferization: rewrite each matmul `linalg.generic` as explicit loops. Returns the count.

    convert-linalg-to-loops would give (batch..., i, k, j) loops whose j loop streams
    one rhs row at a time. Here, for each (batch..., i) and each block of `unroll`
    consecutive k, one j loop reads those rows side by side (several read streams at
    once) and adds their products to the accumulator in the order k, k+1, ...: every
    output element still sums over k in ascending order, as fmul then fadd, so
    results are bit-identical to the plain loops. The j loop steps by explicit
    vectors of `vector_bytes` with a scalar tail; the last K mod `unroll` rows go
    one at a time. Works for any static or symbolic sizes and any outer strides.

    A fused matmul (one that also copies its rhs into a concat's slot) goes one row
    at a time and writes the copy with non-temporal stores: the copy is not read
    again here, so it need not be read into the cache before it is written, nor
    evict what is there. Vector ones must be aligned, so each row's j loop starts
    with scalar steps up to the first `NT_ALIGN`-byte boundary of the slot row;
    those and the tail are non-temporal too, so that every cache line of the slot
    is written by non-temporal stores alone (a line written partly both ways
    measured 2x slower). `fence_nontemporal_stores` then orders them before the
    function returns.

    A matmul whose output rows are short (a whole number of vectors, at most
    `REGISTER_ROW_BYTES`, like one attention head's values; checked at run time
    when the length is symbolic) instead keeps the whole output row in vector
    registers while k runs, in the same k order: each rhs row costs its loads (and,
    fused, its non-temporal stores) and nothing else, one read stream (and one
    write stream) like a plain copy. A fused one needs every slot row to start on an
    `NT_ALIGN` boundary, which is checked at run time (the slot is a caller's
    buffer); a misaligned slot takes the row-at-a-time loops above.
    """
    from mlir.dialects import memref, scf, vector
    return _rewrite_each(module, _matmul_kind, lambda op, kind: _emit_matmul_loops(
        op, unroll if kind == "plain" else 1, vector_bytes, memref, scf, vector))


def _index(v: int) -> ir.Value:
    return arith.ConstantOp(ir.IndexType.get(), v).result


def _dim(memref, m: ir.Value, a: int) -> ir.Value:
    """Dim `a` of memref `m` as an index value (a constant when static)."""
    n = ir.MemRefType(m.type).shape[a]
    return _index(n) if n != DYN else memref.DimOp(m, _index(a)).result


def _loop(scf, lo, hi, step, body, carried=()) -> list:
    """scf.for from lo to hi by step; `body(iv, *carried)` returns the next carried values
    (None when nothing is carried). Returns the final carried values."""
    loop = scf.ForOp(lo, hi, step, list(carried))
    with ir.InsertionPoint(loop.body):
        scf.YieldOp(body(loop.induction_variable, *loop.inner_iter_args) or [])
    return list(loop.results)


def _nest(scf, sizes, body, outer=()) -> None:
    """Loops over every index of `sizes`, outermost first, calling `body(indices)` inside."""
    if len(outer) == len(sizes):
        body(list(outer))
    else:
        _loop(scf, _index(0), sizes[len(outer)], _index(1), lambda iv: _nest(scf, sizes, body, (*outer, iv)))


def _emit_matmul_loops(op, unroll: int, vector_bytes: int, memref, scf, vector) -> None:
    lhs, rhs = list(op.opview.inputs)
    acc, *slot = list(op.opview.outputs)
    slot = slot[0] if slot else None  # a fused matmul's concat slot, written with non-temporal stores
    acc_t = ir.MemRefType(acc.type)
    rank, elt = acc_t.rank, acc_t.element_type
    cst, zero, one = _index, _index(0), _index(1)
    sizes = [_dim(memref, acc, a) for a in range(rank)]  # batch..., I, N
    K, N = _dim(memref, lhs, rank - 1), sizes[-1]
    elt_bytes = elt.width // 8
    width = max(1, vector_bytes // elt_bytes)
    vtype = ir.VectorType.get([width], elt)
    use_vectors = acc_t.shape[-1] == DYN or acc_t.shape[-1] >= width
    # the row lengths (in vectors) whose sums stay in registers: any that fits when N is symbolic
    most, n_static = REGISTER_ROW_BYTES // (width * elt_bytes), acc_t.shape[-1]
    if n_static == DYN:
        register_vectors = list(range(1, most + 1))
    else:
        register_vectors = [n_static // width] if n_static % width == 0 and 0 < n_static // width <= most else []
    if slot is not None:  # where slot rows start, to align the non-temporal stores
        meta = memref.ExtractStridedMetadataOp(slot)
        slot_base = memref.ExtractAlignedPointerAsIndexOp(slot).result
        slot_offset, slot_strides = meta.offset, list(meta.strides)

    def slot_address(indices):
        """The byte address of slot[*indices, 0, ...]."""
        lin = slot_offset
        for i, stride in zip(indices, slot_strides):
            lin = arith.AddIOp(lin, arith.MulIOp(i, stride).result).result
        return arith.AddIOp(slot_base, arith.MulIOp(lin, cst(elt_bytes)).result).result

    def rows(outer, k0, count):
        """acc[outer, :] += lhs[outer, k] * rhs[b, k, :] for k = k0, ..., k0+count-1, in order
        (and slot[b, k, :] = rhs[b, k, :], with non-temporal stores, when fused)."""
        b = outer[:-1]
        ks = [k0] + [arith.AddIOp(k0, cst(u)).result for u in range(1, count)]
        xs = [memref.LoadOp(lhs, [*outer, k]).result for k in ks]

        def step(j, vec):
            if vec:
                load = lambda m, ix: vector.LoadOp(vtype, m, ix).result
                store = lambda v, m, ix: vector.StoreOp(v, m, ix)
                xv = [vector.BroadcastOp(vtype, x).result for x in xs]
            else:
                load = lambda m, ix: memref.LoadOp(m, ix).result
                store = lambda v, m, ix: memref.StoreOp(v, m, ix)
                xv = xs
            a = load(acc, [*outer, j])
            for x, k in zip(xv, ks):
                y = load(rhs, [*b, k, j])
                a = arith.AddFOp(a, arith.MulFOp(x, y).result).result
                if slot is not None and vec:
                    vector.StoreOp(y, slot, [*b, k, j], nontemporal=True, alignment=NT_ALIGN)
                elif slot is not None:
                    memref.StoreOp(y, slot, [*b, k, j], nontemporal=True)
            store(a, acc, [*outer, j])

        start = zero
        if slot is not None and use_vectors:  # scalar steps up to the slot row's first NT_ALIGN boundary (at most N)
            addr = slot_address([*b, ks[0]])
            gap = arith.RemUIOp(arith.SubIOp(cst(NT_ALIGN), arith.RemUIOp(addr, cst(NT_ALIGN)).result).result,
                                cst(NT_ALIGN)).result
            start = arith.MinUIOp(arith.DivUIOp(gap, cst(elt_bytes)).result, N).result
            _loop(scf, zero, start, one, lambda j: step(j, False))
        n_vec = start
        if use_vectors:
            w = cst(width)
            left = arith.SubIOp(N, start).result
            n_vec = arith.AddIOp(start, arith.SubIOp(left, arith.RemUIOp(left, w).result).result).result
            _loop(scf, start, n_vec, w, lambda j: step(j, True))
        _loop(scf, n_vec, N, one, lambda j: step(j, False))

    def rows_in_registers(outer, n_vectors):
        """acc[outer, :] += lhs[outer, k] * rhs[b, k, :] (and, fused, slot[b, k, :] = rhs[b, k, :])
        for every k, in order, with the row of sums (`n_vectors` vectors) carried in registers."""
        b = outer[:-1]
        js = [cst(v * width) for v in range(n_vectors)]

        def add_row(k, *sums):
            x = vector.BroadcastOp(vtype, memref.LoadOp(lhs, [*outer, k]).result).result
            new = []
            for j, a in zip(js, sums):
                y = vector.LoadOp(vtype, rhs, [*b, k, j]).result
                new.append(arith.AddFOp(a, arith.MulFOp(x, y).result).result)
                if slot is not None:
                    vector.StoreOp(y, slot, [*b, k, j], nontemporal=True, alignment=NT_ALIGN)
            return new
        sums = _loop(scf, zero, K, one, add_row, [vector.LoadOp(vtype, acc, [*outer, j]).result for j in js])
        for j, a in zip(js, sums):
            vector.StoreOp(a, acc, [*outer, j])

    def vectors_in_registers(outer):
        """N / width if the row of sums is a whole number of vectors and, when fused, every
        slot row starts on an NT_ALIGN boundary; 0 if not."""
        bad = arith.RemUIOp(N, cst(width)).result
        if slot is not None:
            row = arith.MulIOp(slot_strides[-2], cst(elt_bytes)).result
            for misaligned in (slot_address(outer[:-1]), row):
                bad = arith.OrIOp(bad, arith.RemUIOp(misaligned, cst(NT_ALIGN)).result).result
        ok = arith.CmpIOp(arith.CmpIPredicate.eq, bad, zero).result
        return arith.SelectOp(ok, arith.DivUIOp(N, cst(width)).result, zero).result

    def rows_one_at_a_time(outer):
        u = cst(unroll)
        k_main = arith.SubIOp(K, arith.RemUIOp(K, u).result).result
        _loop(scf, zero, k_main, u, lambda k: rows(outer, k, unroll))
        _loop(scf, k_main, K, one, lambda k: rows(outer, k, 1))

    def per_row(outer):
        if not register_vectors:
            return rows_one_at_a_time(outer)

        def case(switch, i, n_vectors):
            rows_in_registers(outer, n_vectors)
            scf.YieldOp([])

        def default(switch):
            rows_one_at_a_time(outer)
            scf.YieldOp([])
        scf.IndexSwitchOp([], vectors_in_registers(outer), register_vectors, case, default)

    _nest(scf, sizes[:-1], per_row)


REDUCTION_BYTES = 256  # a sum's vector of partial sums: independent add chains to hide the add latency


def _sum_kind(op) -> bool:
    """Is `op` a bufferized `linalg.generic` summing its input over the innermost
    (unit-stride) dim into an output of the other dims, as `softmax` emits it?"""
    if op.name != "linalg.generic":
        return False
    ins, outs = list(op.opview.inputs), list(op.opview.outputs)
    if len(ins) != 1 or len(outs) != 1 or not all(isinstance(v.type, ir.MemRefType) for v in ins + outs):
        return False
    src = ir.MemRefType(ins[0].type)
    n = src.rank
    if n < 1 or ir.MemRefType(outs[0].type).rank != n - 1 or src.get_strides_and_offset()[0][-1] != 1:
        return False
    maps = [ir.AffineMap.get_identity(n), _map(n, [ir.AffineDimExpr.get(a) for a in range(n - 1)])]
    if [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]] != maps:
        return False
    kinds = ["parallel"] * (n - 1) + ["reduction"]
    if [str(a) for a in op.attributes["iterator_types"]] != [f"#linalg.iterator_type<{k}>" for k in kinds]:
        return False
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    v, acc = list(block.arguments)
    return [o.name for o in body] == ["arith.addf", "linalg.yield"] and \
        set(body[0].operands) == {v, acc} and list(body[1].operands) == [body[0].result]


def sums_to_loops(module: ir.Module, lanes_bytes: int = REDUCTION_BYTES) -> int:
    """After bufferization: rewrite each innermost-dim sum (`_sum_kind`) as explicit
    loops in a fixed order, the same for every size, static or symbolic, and every
    target CPU. Returns the count.

    A sum in loop order is one chain of dependent adds, as slow as the add latency.
    Here lane l of a vector of partial sums (`lanes_bytes` wide) adds the elements
    at l, l + L, l + 2L, ... of the row's leading whole vectors; the lanes are then
    added pairwise (halves, then quarters, ...), that total is added to the
    output's initial value, and the remaining elements follow in order. Pairwise
    partial sums are also more accurate than one running sum.
    """
    from mlir.dialects import memref, scf, vector
    return _rewrite_each(module, _sum_kind, lambda op, _: _emit_sum_loops(op, lanes_bytes, memref, scf, vector))


def _emit_sum_loops(op, lanes_bytes: int, memref, scf, vector) -> None:
    (src,), (dst,) = list(op.opview.inputs), list(op.opview.outputs)
    src_t = ir.MemRefType(src.type)
    n, elt = src_t.rank, src_t.element_type
    zero, one = _index(0), _index(1)
    lanes = max(1, lanes_bytes // (elt.width // 8))
    vtype = ir.VectorType.get([lanes], elt)
    size = [_dim(memref, src, a) for a in range(n)]

    def row(outer):
        length = size[-1]
        whole = arith.SubIOp(length, arith.RemUIOp(length, _index(lanes)).result).result
        partial = arith.ConstantOp(vtype, ir.DenseElementsAttr.get_splat(vtype, ir.FloatAttr.get(elt, 0.0))).result
        partial, = _loop(scf, zero, whole, _index(lanes),
                         lambda j, p: [arith.AddFOp(p, vector.LoadOp(vtype, src, [*outer, j]).result).result], [partial])
        width = lanes
        while width > 1:  # pairwise: halves, quarters, ...
            width //= 2
            half = ir.VectorType.get([width], elt)
            lo = vector.ExtractStridedSliceOp(half, partial, [0], [width], [1]).result
            hi = vector.ExtractStridedSliceOp(half, partial, [width], [width], [1]).result
            partial = arith.AddFOp(lo, hi).result
        total = arith.AddFOp(memref.LoadOp(dst, outer).result, vector.ExtractOp(partial, [], [0]).result).result
        total, = _loop(scf, whole, length, one,
                       lambda j, t: [arith.AddFOp(t, memref.LoadOp(src, [*outer, j]).result).result], [total])
        memref.StoreOp(total, dst, outer)

    _nest(scf, size[:-1], row)


def fence_nontemporal_stores(module: ir.Module) -> int:
    """Put a fence before each return of a function that makes non-temporal stores.

    Non-temporal stores are weakly ordered; the fence makes them visible, like any
    other store, to whoever reads the results once the call has returned.
    """
    from mlir.dialects import llvm
    returns = []

    def visit(fn):
        if fn.name != "func.func":
            return ir.WalkResult.ADVANCE
        nontemporal, rets = [], []

        def inner(op):
            if op.name in ("vector.store", "memref.store") and "nontemporal" in op.attributes:
                nontemporal.append(op)
            elif op.name == "func.return":
                rets.append(op)
            return ir.WalkResult.ADVANCE

        fn.walk(inner)
        if nontemporal:
            returns.extend(rets)
        return ir.WalkResult.SKIP

    with module.context:
        module.operation.walk(visit)
        for ret in returns:
            with ir.InsertionPoint(ret), ret.location:
                llvm.FenceOp(llvm.AtomicOrdering.seq_cst)
    return len(returns)
