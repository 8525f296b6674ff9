"""fuse-dequant-matmul: a matmul whose rhs is a dequantization reads the blocks itself.

The reference IR dequantizes a block-quantized weight into an F32 tensor, then multiplies:

    %b = tensor.expand_shape %wq [[0], [1, 2]] : tensor<576x360xi8> into tensor<576x18x20xi8>
    %w = linalg.generic {kina.dequantize = "Q4_1"} ins(%b, %b, ... : ...) outs(%e : tensor<18x32x576xf32>)
           // over (kb, e, n): d * q + m, each byte read through its own map (n, kb, offset(e))
    %wf = tensor.collapse_shape %w [[0, 1], [2]] : tensor<18x32x576xf32> into tensor<576x576xf32>
    %y = linalg.generic {matmul} ins(%x, %wf) outs(%zero)          // acc + x * w
becomes one generic that dequantizes each weight as the matmul reads it, never materialised:

    %wt = the parameter %wq retyped tensor<36x5760xi8>: its 16-column tiles (below)
    %y4 = linalg.generic {kina.quantized = "Q4_1"} ins(%x3, %wt, %wt, ...) outs(%zero4)
           // over (b..., i, jt, kb, e, jl): acc[b, i, jt, jl] + x[b, i, kb, e] * (d * q + m)
    %y = tensor.collapse_shape %y4 ...                          // [.., I, N / 16, 16] -> [.., I, N]

The domain runs k as (kb, e), block by block in order, so every output element still sums
over k in ascending order with the same body: the bits of the two generics. x is viewed
[.., I, K / block, block] (an expand_shape) and the output [.., I, N / 16, 16], so every map
but the bytes' is a projection.

A weight parameter that only fused matmuls read takes the tiled layout (`tile`, 16 columns):
byte c of column n's run is at [n / 16, c * 16 + n % 16], so one vector load reads byte c of
16 columns (quantized-matmul-loops loads them so). The parameter's new layout is recorded as
the module attribute `kina.layouts` ({"function": {"param": "tiled16"}}), which the sidecar
carries: the runtime then passes `QuantizedArray.tiled()` for it. A weight that something
else reads too (a convert), or whose N is not a multiple of 16, keeps GGUF's row layout and
the fused generic reads it at (n, kb, offset(e)).

In:  any module; before bufferization (on tensors). Out: the same module with each such
matmul fused; the dequantizations left unread are erased.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import func, linalg, tensor

from ... import dtypes
from ..blocks import DEQUANTIZE, ElementBody, Sym
from ..irbuild import DYN, generic, mac, mixed
from ._pass import KinaPass, option
from ._util import functions, iterators_of, maps_of, matmul_form

QUANTIZED = "kina.quantized"  # a string attribute: the format a fused quantized matmul reads
TILED = "kina.tiled"  # a unit attribute: the fused matmul reads its weight's 16-column tiles
LAYOUTS = "kina.layouts"  # a module attribute: {function: {parameter: layout}}


@dataclass(frozen=True)
class FuseDequantMatmul(KinaPass):
    name = "fuse-dequant-matmul"
    summary = "a matmul of dequantized weights reads the blocks itself (one generic); their parameter in 16-column tiles"
    optimisation = True
    tile: int = option(16, "columns a tiled weight holds side by side (0: keep GGUF's rows)",
                       check=lambda n: n in (0, 16), expected="0 or 16")

    def run(self, module_op) -> None:
        layouts = {}
        for fn in functions(module_op):
            found = [p for op in _walk(fn) if (p := _pair(op)) is not None]
            if not found:
                continue
            with fn.location:
                tiled = self._tileable(fn, found)
            for matmul, deq, collapse in found:
                with ir.InsertionPoint(matmul.operation), matmul.location:
                    fused = _fuse(matmul, deq, tiled.get(_source(deq)), self.tile)
                matmul.results[0].replace_all_uses_with(fused)
                matmul.operation.erase()
                if not list(collapse.result.uses):
                    collapse.operation.erase()
                    deq.operation.erase()
            names = _param_names(fn)
            for arg, new_type in tiled.items():
                for use in list(arg.uses):  # the row views of the old layout, read by nothing now
                    if not list(use.owner.results[0].uses):
                        use.owner.erase()
                arg.set_type(new_type)
                layouts.setdefault(fn.sym_name.value, {})[names[arg.arg_number]] = f"tiled{self.tile}"
            types = [a.type for a in fn.regions[0].blocks[0].arguments]
            fn.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(types, list(ir.FunctionType(fn.function_type.value).results)))
        if layouts:
            module_op.attributes[LAYOUTS] = ir.DictAttr.get(
                {f: ir.DictAttr.get({p: ir.StringAttr.get(v) for p, v in ps.items()}) for f, ps in layouts.items()})

    def _tileable(self, fn, found) -> dict:
        """Each parameter whose every reader is a fused pair's dequantization, and whose columns come
        in whole tiles, with its tiled type."""
        if not self.tile:
            return {}
        deqs = {d.operation for _, d, _ in found}
        out = {}
        for arg in fn.regions[0].blocks[0].arguments:
            views = [u.owner for u in arg.uses]
            t = arg.type
            if not views or not isinstance(t, ir.RankedTensorType) or t.rank != 2 or \
                    t.element_type != ir.IntegerType.get_signless(8) or t.shape[0] == DYN or t.shape[0] % self.tile:
                continue
            if all(v.name == "tensor.expand_shape" and all(u.owner in deqs for u in v.results[0].uses)
                   for v in views):
                out[arg] = ir.RankedTensorType.get([t.shape[0] // self.tile, t.shape[1] * self.tile], t.element_type)
        return out


def _walk(fn):
    out = []
    for block in fn.regions[0].blocks:
        out.extend(block.operations)
    return out


def _param_names(fn) -> list[str]:
    """The parameters' names, from their name locations (as kina.ir.lower gives them)."""
    names = []
    for a in fn.regions[0].blocks[0].arguments:
        text = str(a.location)  # a name location prints loc("name"(...)), a file's loc("file":line:col)
        named = text.startswith('loc("') and text[5:].split('"', 1)[1].startswith("(")
        names.append(text.split('"')[1] if named else f"arg{a.arg_number}")
    return names


def _pair(op):
    """(matmul, dequantization, collapse) when `op` is a matmul of 2-D dequantized weights."""
    op = op.opview if hasattr(op, "opview") else op
    if not isinstance(op, linalg.GenericOp) or matmul_form(op) not in ("plain", "broadcast"):
        return None
    rhs = list(op.inputs)[1]
    collapse = rhs.owner.opview if isinstance(rhs, ir.OpResult) else None
    if not isinstance(collapse, tensor.CollapseShapeOp):
        return None
    src = collapse.operands[0]
    deq = src.owner.opview if isinstance(src, ir.OpResult) else None
    if not isinstance(deq, linalg.GenericOp) or DEQUANTIZE not in deq.attributes or src.type.rank != 3:
        return None
    # the forms the lowering makes: F32 values, activations of F32, F16 or BF16, summed in F32
    x, acc = list(op.inputs)[0], list(op.outputs)[0]
    f32 = ir.F32Type.get()
    if src.type.element_type != f32 or acc.type.element_type != f32 or \
            x.type.element_type not in (f32, ir.F16Type.get(), ir.BF16Type.get()):
        return None
    return op, deq, collapse


def _source(deq) -> ir.Value:
    """The bytes a dequantization reads, before their [N, K / block, size] view."""
    blocks = list(deq.inputs)[0]
    return blocks.owner.operands[0]


def _fuse(matmul, deq, tiled_type, tile: int) -> ir.Value:
    fmt = dtypes.by_name(ir.StringAttr(deq.attributes[DEQUANTIZE]).value)
    x, _ = list(matmul.inputs)
    acc = list(matmul.outputs)[0]
    rank = acc.type.rank  # (b..., i, j)
    nb = rank - 2
    lhs_map = maps_of(matmul)[0]
    I, K = x.type.shape[-2], x.type.shape[-1]
    N = acc.type.shape[-1]
    kb_n, bs = K // fmt.block, fmt.block
    # x viewed [.., I, K / block, block]
    x_shape = [*x.type.shape[:-1], kb_n, bs]
    x4 = tensor.ExpandShapeOp(ir.RankedTensorType.get(x_shape, x.type.element_type), x,
                              _groups([[a] for a in range(x.type.rank - 1)] + [[x.type.rank - 1, x.type.rank]]),
                              *mixed([_size(x, a) for a in range(x.type.rank - 1)] + [kb_n, bs])).result
    x_batch = [e.maybe_downcast() for e in lhs_map.results][:-2]  # each: a batch loop or 0
    if tiled_type is not None:
        # domain (b..., i, jt, kb, e, jl)
        n_dims = nb + 5
        d = [ir.AffineDimExpr.get(a) for a in range(n_dims)]
        i, jt, kb, e, jl = d[nb], d[nb + 1], d[nb + 2], d[nb + 3], d[nb + 4]
        out_shape = [*acc.type.shape[:-1], N // tile, tile]
        out = tensor.ExpandShapeOp(ir.RankedTensorType.get(out_shape, acc.type.element_type), acc,
                                   _groups([[a] for a in range(rank - 1)] + [[rank - 1, rank]]),
                                   *mixed([_size(acc, a) for a in range(rank - 1)] + [N // tile, tile])).result
        out_map = ir.AffineMap.get(n_dims, 0, [*d[:nb], i, jt, jl])
        offsets = ElementBody.record(fmt, Sym(e))
        byte_maps = [ir.AffineMap.get(n_dims, 0, [jt, (kb * fmt.size + off) * tile + jl]) for off in offsets]
        src = _source(deq)
        iterators = ["parallel"] * (nb + 2) + ["reduction", "reduction", "parallel"]
        e_dim = nb + 3
    else:
        n_dims = nb + 4  # (b..., i, kb, e, j)
        d = [ir.AffineDimExpr.get(a) for a in range(n_dims)]
        i, kb, e, j = d[nb], d[nb + 1], d[nb + 2], d[nb + 3]
        out, out_map = acc, ir.AffineMap.get(n_dims, 0, [*d[:nb], i, j])
        offsets = ElementBody.record(fmt, Sym(e))
        byte_maps = [ir.AffineMap.get(n_dims, 0, [j, kb, off]) for off in offsets]
        src = list(deq.inputs)[0]
        iterators = ["parallel"] * (nb + 1) + ["reduction", "reduction", "parallel"]
        e_dim = nb + 2
    x_map = ir.AffineMap.get(n_dims, 0, [*(_shift(b, d) for b in x_batch), i, kb, e])

    def body(xv, *args):
        *byte_args, a = args
        reader = ElementBody({str(o): v for o, v in zip(offsets, byte_args)})
        jj = Sym(e, lambda: linalg.IndexOp(ir.IntegerAttr.get(ir.IntegerType.get_signless(64), e_dim)).result)
        w = fmt.element(reader, jj).value
        return [mac(xv, w, a)]
    (fused,) = generic([x4, *[src] * len(offsets)], [out], [x_map, *byte_maps, out_map], iterators, body)
    fused.owner.attributes[QUANTIZED] = ir.StringAttr.get(fmt.name)
    if tiled_type is None:
        return fused
    fused.owner.attributes[TILED] = ir.UnitAttr.get()
    return tensor.CollapseShapeOp(acc.type, fused,
                                  _groups([[a] for a in range(rank - 1)] + [[rank - 1, rank]])).result


def _shift(e, d):
    """A batch result of the matmul's lhs map (a dim of (b..., i, k, j), or 0) in the fused domain,
    whose batch dims come first as the matmul's do."""
    if isinstance(e, ir.AffineDimExpr):
        return d[e.position]
    return e


def _size(v: ir.Value, a: int):
    n = v.type.shape[a]
    if n != DYN:
        return n
    from ..irbuild import index
    return tensor.DimOp(v, index(a)).result


def _groups(groups) -> ir.ArrayAttr:
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, a) for a in g]) for g in groups])
