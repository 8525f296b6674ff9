"""matmul-loops, its register tiles: a matmul's rows a tile at a time, the sums in registers.

    linalg.generic {matmul} ins(%x, %w : memref<32x576xf32>, memref<576x1536xf32>) outs(%acc ...)
becomes
    scf.for %k0 = 0 to 576 step 128 {                      // a block of rhs rows
      scf.for %jb = 0 to 1536 step 96 {                    // a block of columns (384 bytes of sums a row)
        [a copy of the block into %pack, rows back to back, where rhs rows are 4 KiB apart]
        scf.for %i0 = 0 to 32 step 4 {                     // a tile of 4 rows
          %s = 4 x 3 vectors<32xf32> of sums, loaded from %acc
          scf.for %k = %k0 to %k0 + 128 iter_args(%s) {    // each rhs vector loaded once for the tile
            %s' = %s + broadcast(%x[%i0 + r, %k]) * %w[%k, %jb + 32 v]   // in k order
          }
          stores of %s' to %acc
        }
      }
    } {kina.matmul_strategy = "register-tiles"}

In:  a `Matmul` whose `Choice` has `tiles` (a matmul with at least `tile-rows` rows).
Out: `Tiles(mat).run(b, rows_end)` emits rows [0, rows_end) of batch `b`: for each block
     of `tile-k-rows` rhs rows and each block of columns (`tile-row-bytes` of sums per
     row), every tile of rows in turn, so that block of rhs is read from cache by all of
     them. Where the rows of rhs are a multiple of 4 KiB apart (checked at run time) the
     block is read from a copy on the stack with its rows back to back (they would share
     a few cache sets and evict each other: 256x512x4096 ran at half the rate), and F16 or
     BF16 weights always are, widened once, not once per tile of rows; F16 or BF16 rows of
     lhs likewise go to a small F32 copy, a tile's rows of the block, before its k loop.
     Between blocks of k the sums go to acc and come back (exact); the last block of
     columns, partial, uses masked loads and stores.

Guarantees: each element still sums over k in ascending order, as fmul then fadd (or
fma, with that option): the same bits as the other strategies.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from ...irbuild import DYN, index
from .._util import loop
from .loops import Matmul

PACK_ALIAS_BYTES = 4096  # rhs rows a multiple of this apart share cache sets: a register tile reads a copy
# the most bytes of a widened block of rhs (F16/BF16 weights copied as F32 for the register
# tiles): tile-k-rows shrinks to fit half the Intel VM's 48 KiB L1D, beside the narrow rows
# it is copied from (128 rows of 96 columns, 48 KiB, took 58.8 ms for SmolLM's all-F16
# prefill of 32 on two threads; 64 rows, 52.5 ms; docs/performance.md, "Widened blocks
# of half the L1")
WIDENED_BLOCK_BYTES = 24 << 10


class Tiles:
    """The register tiles of one matmul: their vectors, and the buffers on the stack that a
    block of rhs (and a tile's rows of a narrow lhs) is copied into. Made after `mat`, at
    the same insertion point: it emits the test whether rhs's rows alias in the cache."""

    def __init__(self, mat: Matmul):
        self.mat = mat
        options, elt, elt_bytes, narrow = mat.options, mat.elt, mat.elt_bytes, mat.narrow
        # a register tile's vectors: `vector-bytes`, or one row of the tile if that is shorter
        # (tile-row-bytes=64, a target without AVX-512: 4 rows x 1 vector<16xf32> of sums are 8
        # of AVX2's 16 registers)
        t_bytes = min(options.vector_bytes, options.tile_row_bytes)
        self.width = max(1, t_bytes // elt_bytes)
        self.vtype, self.nv = ir.VectorType.get([self.width], elt), max(1, options.tile_row_bytes // t_bytes)
        # a block of rhs copied rows back to back, on the stack (one buffer per function and type): rhs rows a
        # power of two apart (N = 512, 4096) would otherwise fall into a few cache sets and
        # evict each other while the row tiles read the block
        k_static = ir.MemRefType(mat.rhs.type).shape[-2]
        pack_rows = options.tile_k_rows if k_static == DYN else max(1, min(options.tile_k_rows, k_static))
        if narrow != elt:
            pack_rows = max(1, min(pack_rows, WIDENED_BLOCK_BYTES // (self.nv * self.width * elt_bytes)))
        self.pack_rows = pack_rows
        # in the sums' type: a narrow rhs (F16, BF16 weights) is widened once as it is copied, not
        # once per tile of rows that reads it
        pack_type = ir.MemRefType.get([pack_rows, self.nv * self.width], elt)
        # BF16 is always packed, its last partial block copied element by element: LLVM lowers a
        # masked BF16 vector load, on x86 without AVX-512, through __truncsfbf2 (not in every libgcc)
        self.bf16 = str(narrow) == "bf16"
        self.pack_buffer = mat.stack_buffer(pack_type) if options.pack or self.bf16 else None
        # rhs of the sums' own type is copied only where its rows are a multiple of
        # PACK_ALIAS_BYTES apart (known at run time: a weight's columns split by threads keep its
        # stride): elsewhere the tiles read it in place, faster than copying it first (the Intel
        # VM: 32x512x512 F32, 101 -> 127 GFLOP/s; 256x1536x576, 146 -> 170); a narrow one
        # is always copied, widened once for all the tiles
        self.pack_aliased = None
        if self.pack_buffer is not None and narrow == elt:
            stride_bytes = arith.MulIOp(mat.rhs_k_stride, index(elt_bytes)).result
            self.pack_aliased = arith.CmpIOp(arith.CmpIPredicate.eq, arith.RemUIOp(
                stride_bytes, index(PACK_ALIAS_BYTES)).result, mat.zero).result
        # a narrow lhs (F16 activations): each tile's rows of a block of k, widened once for all the
        # tile's columns (widening each scalar as the k loop reads it cost as much as the multiplies)
        self.lhs_elt = ir.MemRefType(mat.lhs.type).element_type
        self.lhs_buffer = mat.stack_buffer(ir.MemRefType.get([options.tile_rows, pack_rows], elt)) \
            if self.lhs_elt != elt else None

    def run(self, b, rows_end):
        """Rows 0 to rows_end (a multiple of `tile-rows`) of batch b in register tiles: for
        each block of `tile-k-rows` rows of rhs (k in order: the sums go to acc and come
        back between blocks) and each block of its columns, every tile of rows, so that
        block of rhs stays in cache; the last block of columns, partial, masked."""
        mat = self.mat
        mr, nv = mat.options.tile_rows, self.nv
        bw, step, kc = index(nv * self.width), index(mr), index(self.pack_rows)
        full = arith.SubIOp(mat.N, arith.RemUIOp(mat.N, bw).result).result
        mask_t = ir.VectorType.get([self.width], ir.IntegerType.get_signless(1))
        pad = arith.ConstantOp(mat.nvtype(self.vtype), ir.DenseElementsAttr.get_splat(mat.nvtype(self.vtype), ir.FloatAttr.get(mat.narrow, 0.0)))
        zeros = arith.ConstantOp(self.vtype, ir.DenseElementsAttr.get_splat(self.vtype, ir.FloatAttr.get(mat.elt, 0.0))) if self.bf16 else None

        def pack(jb, masked, k_lo, k_hi):
            js = [arith.AddIOp(jb, index(v * self.width)).result for v in range(nv)]
            masks = [vector.CreateMaskOp(mask_t, [arith.SubIOp(mat.N, j).result]).result for j in js] if masked else []
            offsets = [index(v * self.width) for v in range(nv)]

            def copy_row(k):
                row = arith.SubIOp(k, k_lo).result
                for v, (j, o) in enumerate(zip(js, offsets)):
                    ix = [*mat.rhs_at(b), k, j]
                    if masked and self.bf16:  # zeros, then the columns below N one by one
                        vector.StoreOp(zeros.result, packed, [row, o])
                        loop(j, arith.MinUIOp(arith.AddIOp(j, index(self.width)).result, mat.N).result, mat.one, lambda c, j=j, o=o:
                             memref.StoreOp(mat.widen(memref.LoadOp(mat.rhs, [*mat.rhs_at(b), k, c]).result), packed,
                                            [row, arith.AddIOp(o, arith.SubIOp(c, j).result).result]))
                        continue
                    y = vector.MaskedLoadOp(mat.nvtype(self.vtype), mat.rhs, ix, masks[v], pad.result).result if masked else \
                        vector.LoadOp(mat.nvtype(self.vtype), mat.rhs, ix).result
                    vector.StoreOp(mat.widen(y), packed, [row, o])
            loop(k_lo, k_hi, mat.one, copy_row)
        packed = self.pack_buffer

        def k_block(k_lo):
            k_hi = arith.MinUIOp(arith.AddIOp(k_lo, kc).result, mat.K).result
            for lo, hi, masked in ((mat.zero, full, False), (full, mat.N, True)):
                def column_block(jb, masked=masked):
                    def tiles_from(src):  # src: the block's copy (packed first), or None for rhs in place
                        if src is not None:
                            pack(jb, masked, k_lo, k_hi)
                        loop(mat.zero, rows_end, step, lambda i: self.tile(b, i, mr, jb, nv, masked, k_lo, k_hi, src))
                    if packed is None or self.pack_aliased is None:
                        tiles_from(packed)
                    else:  # copied only where the rows are a multiple of PACK_ALIAS_BYTES apart
                        if_op = scf.IfOp(self.pack_aliased, has_else=True)
                        for block, src in ((if_op.then_block, packed), (if_op.else_block, None)):
                            with ir.InsertionPoint(block):
                                tiles_from(src)
                                scf.YieldOp([])
                loop(lo, hi, bw, column_block)
        loop(mat.zero, mat.K, kc, k_block)

    def tile(self, b, i0, mr, jb, nv, masked, k_lo, k_hi, packed):
        """acc[b, i0:i0+mr, jb:jb+nv*t_width] += lhs[b, i0:i0+mr, k_lo:k_hi] @ rhs[b, k_lo:k_hi, jb:jb+nv*t_width],
        each element in k order, with the mr x nv vectors of sums in registers while k runs;
        `masked`: the columns from N on are neither read nor written; rhs's block read from
        `packed` (its copy, rows back to back) if given."""
        mat = self.mat
        rows = [i0] + [arith.AddIOp(i0, index(r)).result for r in range(1, mr)]
        js = [jb] + [arith.AddIOp(jb, index(v * self.width)).result for v in range(1, nv)]
        mask_t = ir.VectorType.get([self.width], ir.IntegerType.get_signless(1))
        masks = [vector.CreateMaskOp(mask_t, [arith.SubIOp(mat.N, j).result]).result for j in js] if masked else []
        pads = {t: arith.ConstantOp(t, ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(t.element_type, 0.0))).result
                for t in dict.fromkeys((self.vtype, mat.nvtype(self.vtype)))} if masked else {}  # in order: the same IR each run

        def load(t, m, ix, v):
            if not masked:
                return vector.LoadOp(t, m, ix).result
            return vector.MaskedLoadOp(t, m, ix, masks[v], pads[t]).result

        offsets = [index(v * self.width) for v in range(nv)]  # columns of the packed block
        if self.lhs_buffer is not None:  # the tile's rows of a narrow lhs, widened once for all its columns
            for r, i in enumerate(rows):
                self.widen_lhs_row(b, i, r, k_lo, k_hi)
            buffer_rows = [index(r) for r in range(mr)]

        def add_row(k, *sums):
            if packed is not None:
                row = arith.SubIOp(k, k_lo).result
                ys = [vector.LoadOp(self.vtype, packed, [row, o]).result for o in offsets]  # widened when packed
            else:
                ys = [mat.widen(load(mat.nvtype(self.vtype), mat.rhs, [*mat.rhs_at(b), k, j], v)) for v, j in enumerate(js)]
            new = []
            for r, i in enumerate(rows):
                x = memref.LoadOp(self.lhs_buffer, [buffer_rows[r], arith.SubIOp(k, k_lo).result]).result if self.lhs_buffer is not None \
                    else mat.widen(memref.LoadOp(mat.lhs, [*mat.lhs_at(b), i, k]).result)
                x = vector.BroadcastOp(self.vtype, x).result
                new += [mat.mac(sums[r * nv + v], x, y) for v, y in enumerate(ys)]
            return new
        at = [(i, v, j) for i in rows for v, j in enumerate(js)]
        sums = loop(k_lo, k_hi, mat.one, add_row, [load(self.vtype, mat.acc, [*b, i, j], v) for i, v, j in at])
        for a, (i, v, j) in zip(sums, at):
            if masked:
                vector.MaskedStoreOp(mat.acc, [*b, i, j], masks[v], a)
            else:
                vector.StoreOp(a, mat.acc, [*b, i, j])

    def widen_lhs_row(self, b, i, r, k_lo, k_hi):
        """lhs_buffer[r, :k_hi - k_lo] = lhs[b, i, k_lo:k_hi] widened: vectors of 16 (one F32 line), then
        the last elements one by one (no masked load: a BF16 one needs a libcall on some x86)."""
        mat = self.mat
        x_t, row = ir.VectorType.get([mat.line], self.lhs_elt), index(r)
        n = arith.SubIOp(k_hi, k_lo).result
        whole = arith.SubIOp(n, arith.RemUIOp(n, index(mat.line)).result).result
        loop(mat.zero, whole, index(mat.line), lambda c: vector.StoreOp(
            mat.widen(vector.LoadOp(x_t, mat.lhs, [*mat.lhs_at(b), i, arith.AddIOp(k_lo, c).result]).result), self.lhs_buffer, [row, c]))
        loop(whole, n, mat.one, lambda c: memref.StoreOp(
            mat.widen(memref.LoadOp(mat.lhs, [*mat.lhs_at(b), i, arith.AddIOp(k_lo, c).result]).result), self.lhs_buffer, [row, c]))
