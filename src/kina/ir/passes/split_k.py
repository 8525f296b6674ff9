"""split-k: a one-row matmul over a weight sums its k in fixed chunks, then adds them in order.

    linalg.fill ins(%zero) outs(%acc : memref<1x1x1536xf32>)
    linalg.generic {matmul} ins(%x, %w : memref<1x1x576xf32, ...>, memref<576x1536xf32, ...>)
                            outs(%acc)                                   // acc + x * w
becomes, with `chunks` = 8 (576 = 8 chunks of 72 k),
    linalg.fill ins(%zero) outs(%acc)
    %p = memref.alloc() : memref<8x1x1536xf32>
    linalg.fill ins(%zero) outs(%p)
    %xc = memref.reinterpret_cast %x to [8, 1, 72] strides [72, 72, 1]    // chunk c: x[.., 72c : 72c + 72]
    %wc = memref.reinterpret_cast %w to [8, 72, 1536] strides [72 * s, s, 1]    // rows 72c .. 72c + 71
    linalg.generic {matmul} ins(%xc, %wc) outs(%p)                      // p[c] = x's chunk c @ w's
    linalg.generic {c outermost: reduction} ins(%p) outs(%acc)           // acc + p[c], c = 0, 1, ...

Why: a decode row x[1, K] @ W[K, N] is read-bound, and the threads pass splits an op
along an output loop, here W's columns: each thread reads a short piece of every row
of W, which reads far below a whole row's rate on the machines measured
(docs/performance.md, "Split-k: whole rows per thread"). Chunks of k are blocks of
whole rows of W, so threads split the chunks' matmul along c: each part reads one
contiguous block. 8 chunks, not 16: the partial rows are half as many to write and
add, and on the Intel VM a decode step took 3.5-5% less (docs/performance.md, "Eight
chunks"); a matmul is then shared by at most 8 threads.

The smallest weight chunked is 128 KiB: SmolLM's k and v projections, [576, 192] in
F16 (221 KiB, rows of 384 bytes), took 31.6 us on two threads cut into columns (each
part reads 192 bytes of every row) and 22.5 us chunked; on one thread 18.3 / 19.2 us.

Which matmuls: plain or broadcast matmul generics on memrefs (matmul_form) with one
output row (batch dims and i all of size 1), a 2-d rhs (a weight) with a unit
innermost stride and static K and N, K a multiple of `chunks`, at least `min-bytes`
of rhs, and rows of at most `max-row-bytes` (longer rows split into columns of
whole pages, and their partial sums would be large). Others are left as they are.

In:  after bufferization (matmuls on memrefs), before threads and matmul-loops (which
take the chunks' batched matmul like any other).
Out: the same module, each such matmul as a batched matmul into a temporary of
`chunks` partial rows (marked `kina.one_row_at_a_time`: matmul-loops reads its rhs
rows one after another, and builds no other loop for it) and an in-order sum of them.

Guarantees: each output element is the sum, in ascending c, of the chunks' sums,
each in ascending k, starting from the element's value before the matmul: an order
fixed by this pass, the same for any thread count and CPU. It is not the order of
-O0 (one running sum over k), so the bits can differ from an unchunked build in the
last places.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, linalg, memref

from ..irbuild import DYN, affine_map, generic, index, matmul_maps
from ._pass import KinaPass, option
from ._util import NO_MATCH, ONE_ROW_AT_A_TIME, apply_patterns, batch_indices, clone_body, maps_of, matmul_form, unit_innermost


def _at_least_2(n: int) -> bool:
    return 2 <= n <= 1024


def _positive(n: int) -> bool:
    return n >= 1


@dataclass(frozen=True)
class SplitK(KinaPass):
    name = "split-k"
    summary = ("a one-row matmul over a weight in fixed chunks of k (blocks of whole rows, which threads split), "
               "their partial rows then added in order")
    optimisation = True
    chunks: int = option(8, "chunks of k (each a block of whole rhs rows; the most threads that share one)",
                         check=_at_least_2,
                         expected="an integer from 2 to 1024")
    min_bytes: int = option(128 << 10, "rhs bytes a matmul must read to be chunked", check=_positive,
                            expected="an integer >= 1")
    max_row_bytes: int = option(16 << 10, "the longest rhs row that is chunked (longer ones split well into columns)",
                                check=_positive, expected="an integer >= 1")

    def run(self, module_op) -> None:
        def matmul(op, rewriter):
            if not _takes(op, self):
                return NO_MATCH
            with rewriter.ip, op.location:
                _emit(op, self.chunks)
            rewriter.erase_op(op.operation)
        apply_patterns(module_op, {linalg.GenericOp: matmul})


def _takes(op, options: SplitK) -> bool:
    if matmul_form(op) not in ("plain", "broadcast"):
        return False
    lhs, rhs = list(op.opview.inputs)
    acc = list(op.opview.outputs)[0]
    types = [v.type for v in (lhs, rhs, acc)]
    if not all(isinstance(t, ir.MemRefType) and unit_innermost(t) for t in types):
        return False
    lhs_t, rhs_t, acc_t = (ir.MemRefType(t) for t in types)
    if rhs_t.rank != 2 or any(n != 1 for n in acc_t.shape[:-1]) or any(n != 1 for n in lhs_t.shape[:-1]):
        return False  # one output row against a weight (every batch dim and i of size 1)
    if batch_indices(maps_of(op)[1], acc_t.rank - 2, "rhs") != []:
        return False
    K, N = rhs_t.shape
    if DYN in (K, N) or K % options.chunks:
        return False
    width = rhs_t.element_type.width // 8
    return K * N * width >= options.min_bytes and N * width <= options.max_row_bytes


def _emit(op, chunks: int) -> None:
    lhs, rhs = list(op.opview.inputs)
    acc = list(op.opview.outputs)[0]
    rhs_t, acc_t = (ir.MemRefType(v.type) for v in (rhs, acc))
    K, N = rhs_t.shape
    part, sums = K // chunks, acc_t.element_type
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()

    def chunked(m: ir.Value, meta, shape: list[int], strides) -> ir.Value:
        """`m` viewed as `shape` from its own offset (`meta`: its strided metadata), with
        `strides` (ints, or index values)."""
        static = [s if isinstance(s, int) else dyn for s in strides]
        t = ir.MemRefType.get(shape, ir.MemRefType(m.type).element_type,
                              ir.StridedLayoutAttr.get(dyn, static), ir.MemRefType(m.type).memory_space)
        return memref.ReinterpretCastOp(t, m, [meta.offset], [], [s for s in strides if not isinstance(s, int)],
                                        [dyn], shape, static).result

    # chunk c of x is its k from c * part; chunk c of w is its rows from c * part
    xc = chunked(lhs, memref.ExtractStridedMetadataOp(lhs), [chunks, 1, part], [part, part, 1])
    meta = memref.ExtractStridedMetadataOp(rhs)
    row = meta.strides[0]
    wc = chunked(rhs, meta, [chunks, part, N], [arith.MulIOp(row, index(part)).result, row, 1])
    p = memref.AllocOp(ir.MemRefType.get([chunks, 1, N], sums), [], []).result
    linalg.fill(arith.ConstantOp(sums, 0.0).result, outs=[p])
    maps, iterators = matmul_maps(3)
    # p[c] = x's chunk c @ w's rows of c; a chunk's rows are w's rows, read one after another:
    # matmul-loops then builds that loop alone, not the one reading several rows side by side
    generic([xc, wc], [p], maps[:3], iterators, _body_of(op), attributes=[ONE_ROW_AT_A_TIME])
    # acc[.., 0, j] += p[c, 0, j], c outermost (in order), j innermost
    r = acc_t.rank
    d = [ir.AffineDimExpr.get(a) for a in range(r + 1)]  # (c, acc's dims...)
    generic([p], [acc], [affine_map(r + 1, [d[0], d[r - 1], d[r]]), affine_map(r + 1, d[1:])],
            ["reduction"] + ["parallel"] * r, lambda v, a: [arith.AddFOp(a, v).result])


def _body_of(op):
    """A body builder that clones `op`'s own body (acc + x * y, widened as it was) onto new block arguments."""
    block = op.regions[0].blocks[0]

    def body(*args):
        return clone_body(block, dict(zip(block.arguments, args)))[:1]
    return body
