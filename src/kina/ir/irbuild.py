"""Builders for the upstream MLIR the reference IR is made of, shared by `kina.ir.lower`
and Kina's passes (`kina.ir.passes`).

In:  Kina types and MLIR values, inside an active `ir.Context`, location and insertion point.
Out: MLIR types, affine maps and ops (`linalg.generic`, slices, a matmul's body).

Guarantees: the forms built here are the ones the passes recognise (`matmul_maps`
and `mac` define what a matmul is), so a change to one changes both sides at once.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg

from ..frontend.ops import WIDE
from ..frontend.types import DTYPES, Dim, TensorType

DYN = ir.ShapedType.get_dynamic_size()


def print_ir(module: ir.Module, locations: bool = False) -> str:
    """The module as kinac prints it: SSA values named after the source's names."""
    return module.operation.get_asm(enable_debug_info=locations, use_name_loc_as_prefix=True)


def element_type(dtype: str) -> ir.Type:
    return {"f16": ir.F16Type.get, "bf16": ir.BF16Type.get, "f32": ir.F32Type.get, "f64": ir.F64Type.get,
            "i8": lambda: ir.IntegerType.get_signless(8), "i32": lambda: ir.IntegerType.get_signless(32),
            "i64": lambda: ir.IntegerType.get_signless(64),
            }[DTYPES[dtype][0]]()


def tensor_type(t: TensorType) -> ir.RankedTensorType:
    """The tensor type of `t`; a block format's is its bytes, i8 [..., N, K / block * size]."""
    return ir.RankedTensorType.get([d.const if d.is_static else DYN for d in t.storage_dims()],
                                   element_type(t.dtype))


def index(value: int) -> ir.Value:
    return arith.ConstantOp(ir.IndexType.get(), value).result


def reassociation(groups) -> ir.ArrayAttr:
    """The reassociation attribute of tensor.collapse_shape / expand_shape: one list of dims per group."""
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, a) for a in g]) for g in groups])


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


def broadcast_matmul_maps(lhs: TensorType, rhs: TensorType, result: TensorType) -> tuple[list[ir.AffineMap], list[str]]:
    """The lhs, rhs and result maps of `lhs @ rhs` whose batch dims broadcast (np.matmul):
    an operand's missing batch dims are left out of its map, and a batch dim of size 1
    stretched to the result's reads index 0. Without broadcasting, `matmul_maps`."""
    maps, iterators = matmul_maps(result.rank)
    nb = result.rank - 2
    d = [ir.AffineDimExpr.get(a) for a in range(nb + 3)]

    def operand(t: TensorType, last):
        first = nb - (t.rank - 2)  # the result batch dim of the operand's dim 0
        batch = [ir.AffineConstantExpr.get(0) if dim == Dim(1) and result.dims[first + a] != Dim(1)
                 else d[first + a] for a, dim in enumerate(t.dims[:-2])]
        return affine_map(nb + 3, batch + last)
    return [operand(lhs, d[nb:nb + 2]), operand(rhs, d[nb + 1:]), maps[2]], iterators


def extend(v: ir.Value) -> ir.Value:
    """`v` widened as `ops.WIDE` says (f16 and bf16 to f32), else `v`."""
    for narrow, wide in WIDE.items():
        if v.type == element_type(narrow):
            return arith.ExtFOp(element_type(wide), v).result
    return v


def mac(x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    """A matmul's body: acc + x * y (x and y widened to acc's type)."""
    return arith.AddFOp(acc, arith.MulFOp(extend(x), extend(y)).result).result


def generic(inputs, inits, maps, iterators, body, attributes=()) -> list[ir.Value]:
    """A `linalg.generic` with one result per tensor init (none on memrefs, which it writes);
    `body(*block_args)` returns the yielded values; `attributes` are unit attributes to set."""
    op = linalg.GenericOp(
        result_tensors=[v.type for v in inits if isinstance(v.type, ir.RankedTensorType)], inputs=inputs,
        outputs=inits, indexing_maps=ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
        iterator_types=ir.ArrayAttr.get([ir.Attribute.parse(f"#linalg.iterator_type<{it}>") for it in iterators]))
    for name in attributes:
        op.attributes[name] = ir.UnitAttr.get()
    block = op.regions[0].blocks.append(*[v.type.element_type for v in [*inputs, *inits]],
                                        arg_locs=[op.location] * (len(inputs) + len(inits)))
    with ir.InsertionPoint(block):
        linalg.YieldOp(body(*block.arguments))
    return list(op.results)


def mixed(values):
    """Builder operands for mixed static/dynamic sizes: (dynamic values, static ints with DYN)."""
    return [v for v in values if not isinstance(v, int)], [v if isinstance(v, int) else DYN for v in values]


def slice_args(offsets, sizes):
    """The operands of an extract_slice/insert_slice with unit strides, from ints and index values."""
    dyn_off, st_off = mixed(offsets)
    dyn_size, st_size = mixed(sizes)
    return dyn_off, dyn_size, [], st_off, st_size, [1] * len(sizes)
