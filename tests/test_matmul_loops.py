"""matmul-loops against -O0's plain loops, bit for bit, at the sizes its loop forms split on.

Every loop form of the pass (register tiles of `tile-rows` rows with a masked last block
of columns and blocks of k, a decode row with its sums in registers, one rhs row at a
time with prefetches, eight at a time, the vector, line and scalar tails) sums each
element over k in ascending order as fmul then fadd, as the reference body does, so
-O3 and -O0 give the same bits: F32, and F16/BF16 widened to F32 sums and rounded once.
The sizes: P = 1, 3 (fewer rows than a tile), 4, 5, 33 (whole tiles and a rest); K and N
not multiples of a vector, N below one vector, one block, and past several; K past one
block of k; rows a multiple of 4 KiB apart (tiles read a copy) and not (tiles read them in
place); symbolic and static dims; strided views (row stride > N); broadcast batches.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kina
from conftest import assert_same
from kina.driver.pipeline import Options

MATMUL = """
let f = fn[T](x: tensor<T, [P, K], @host>, w: tensor<T, [K, N], @host>) -> (tensor<T, [P, N], @host>) {
  (x @ w)
}
"""
BATCHED = """
let f = fn[T](x: tensor<T, [B, P, K], @host>, w: tensor<T, [K, N], @host>) -> (tensor<T, [B, P, N], @host>) {
  (x @ w)
}
"""
DTYPES = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16)}
# (P, K, N): decode rows and tiles, odd K and N, N < one vector (32 F32), < one tile block (96), > several
SHAPES = [(1, 5, 3), (1, 576, 192), (1, 33, 577), (3, 17, 100), (4, 8, 32), (5, 9, 129), (33, 65, 200),
          (8, 600, 96), (6, 1, 40), (2, 40, 7), (9, 16, 1000), (5, 24, 1024)]


# matmul-loops alone: split-k, which sums a decode row's k in chunks (another order than -O0's:
# tests/test_split_k.py), is kept off the weights these tests multiply
ALONE = "split-k{min-bytes=1099511627776}"


def _compile(source: str, level: int, T: str, dims=()):
    return kina.compile_source(source, "<matmul-loops>", Options(opt_level=level, dtypes=(("T", T),), dims=dims,
                                                                 pass_options=ALONE if level else "")).f


def _inputs(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32).astype(dtype) for s in shapes]


def _same_at_both_levels(source, T, args, dims=()):
    got, want = _compile(source, 3, T, dims)(*args)[0], _compile(source, 0, T, dims)(*args)[0]
    assert_same(got, want, what=f"{T} {[a.shape for a in args]} dims={dims} (-O3 vs -O0)")


@pytest.mark.parametrize("T", DTYPES)
def test_symbolic_dims_agree_at_O0_and_O3(T):
    o3, o0 = _compile(MATMUL, 3, T), _compile(MATMUL, 0, T)
    for i, (P, K, N) in enumerate(SHAPES):
        x, w = _inputs([(P, K), (K, N)], DTYPES[T], i)
        assert_same(o3(x, w)[0], o0(x, w)[0], what=f"{T} P={P} K={K} N={N} symbolic")


@pytest.mark.parametrize("T", DTYPES)
@pytest.mark.parametrize("P,K,N", [(1, 576, 192), (3, 17, 100), (33, 65, 200), (5, 600, 129), (2, 40, 7)])
def test_static_dims_agree_at_O0_and_O3(T, P, K, N):
    _same_at_both_levels(MATMUL, T, _inputs([(P, K), (K, N)], DTYPES[T], P + K + N), dims=(("P", P), ("K", K), ("N", N)))


@pytest.mark.parametrize("T", ["F32", "F16"])
def test_strided_views_agree_at_O0_and_O3(T):
    """Operands whose rows are farther apart than their length (a slice of a wider array):
    the loops read them at their own strides (register tiles: from a copy where the rows
    are a multiple of 4 KiB apart, the last case, else in place)."""
    o3, o0 = _compile(MATMUL, 3, T), _compile(MATMUL, 0, T)
    for i, (P, K, N, row) in enumerate([(1, 100, 70, 137), (5, 33, 129, 196), (33, 64, 40, 107), (9, 20, 200, 2048)]):
        xb, wb = _inputs([(P, K + 3), (K, row)], DTYPES[T], i)
        x, w = xb[:, 1:K + 1], wb[:, 5:N + 5]
        assert w.strides[0] != N * w.itemsize
        assert_same(o3(x, w)[0], o0(x, w)[0], what=f"{T} P={P} K={K} N={N} strided")


@pytest.mark.parametrize("T", ["F32", "F16"])
def test_broadcast_batches_agree_at_O0_and_O3(T):
    """x[B, P, K] @ W[K, N], the model's projections: each batch in the same loops."""
    for i, (B, P, K, N) in enumerate([(2, 1, 40, 100), (3, 5, 17, 33), (2, 8, 64, 200)]):
        _same_at_both_levels(BATCHED, T, _inputs([(B, P, K), (K, N)], DTYPES[T], i))


@pytest.mark.parametrize("passes", ["", "matmul-loops{pack=false}"])
def test_bf16_tiles_with_a_partial_block_build_on_any_x86(passes):
    """BF16 register tiles whose last block of columns is partial (N = 129): that block is
    copied element by element, even with pack=false, so the .so needs no __truncsfbf2 (a
    masked BF16 vector load lowers through it on x86 without AVX-512 BF16) and loads."""
    f = kina.compile_source(MATMUL, "<bf16 tiles>", Options(dtypes=(("T", "BF16"),), pass_options=passes)).f
    x, w = _inputs([(5, 33), (33, 129)], DTYPES["BF16"], 1)
    assert_same(f(x, w)[0], _compile(MATMUL, 0, "BF16")(x, w)[0], what=f"BF16 tiles {passes or 'default'}")


@pytest.mark.parametrize("step_rows", [1, 3, 4])
def test_step_rows_keep_the_order_of_the_sums(step_rows):
    """One rhs row at a time, `step-rows` rows added per load and store of the sums (the
    last K % step-rows alone): -O0's bits for K on and off a multiple, N on and off a vector."""
    f = kina.compile_source(MATMUL, "<step-rows>", Options(dtypes=(("T", "F32"),), pass_options=(
        f"{ALONE},matmul-loops{{step-rows={step_rows}}}"))).f
    o0 = _compile(MATMUL, 0, "F32")
    for i, (P, K, N) in enumerate([(1, 17, 100), (1, 576, 192), (2, 9, 40), (1, 4, 7)]):
        x, w = _inputs([(P, K), (K, N)], DTYPES["F32"], i)
        assert_same(f(x, w)[0], o0(x, w)[0], what=f"step-rows={step_rows} P={P} K={K} N={N}")


def test_a_function_of_many_tiled_matmuls_runs_within_the_stack():
    """48 chained prefill matmuls in one function, F16 (each packed block 192 KiB of F32 on
    the stack): they share one buffer at the function's entry, on 1 and 2 threads (a buffer
    per matmul, or per part a thread claims, overflowed the 8 MiB stack: a segfault)."""
    n = 48
    body = "".join(f"  let y{i} = {'x' if i == 0 else f'y{i - 1}'} @ w;\n" for i in range(n))
    source = (f"let f = fn(x: tensor<F16, [4, 576], @host>, w: tensor<F16, [576, 576], @host>) "
              f"-> (tensor<F16, [4, 576], @host>) {{\n{body}  (y{n - 1})\n}}\n")
    f = kina.compile_source(source, "<many tiles>").f
    x = _inputs([(4, 576)], np.float16, 3)[0]
    w = np.eye(576, dtype=np.float16)
    for threads in (1, 2):
        assert_same(f(x, w, threads=threads)[0], x, what=f"{n} matmuls by the identity on {threads} threads")


FUSED = """
let f = fn[T](q: tensor<T, [B, H, 1, Dh], @host>, k_past: tensor<T, [B, H, Dh, S], @host>,
              k_new: tensor<T, [B, H, Dh, 1], @host>, p: tensor<T, [B, H, 1, S+1], @host>,
              v_past: tensor<T, [B, H, S, Dh], @host>, v_new: tensor<T, [B, H, 1, Dh], @host>) -> (
  tensor<T, [B, H, Dh, S+1], @host>, tensor<T, [B, H, 1, S+1], @host>,
  tensor<T, [B, H, S+1, Dh], @host>, tensor<T, [B, H, 1, Dh], @host>) {
  let k = concat[axis=3] k_past k_new;
  let v = concat[axis=2] v_past v_new;
  (k, q @ k, v, p @ v)
}
"""


FUSED_GQA = """
let f = fn[T](q: tensor<T, [1, H, G, Dh], @host>, k_past: tensor<T, [1, H, Dh, S], @host>,
              k_new: tensor<T, [1, H, Dh, 1], @host>, p: tensor<T, [1, H, G, S+1], @host>,
              v_past: tensor<T, [1, H, S, Dh], @host>, v_new: tensor<T, [1, H, 1, Dh], @host>) -> (
  tensor<T, [1, H, Dh, S+1], @host>, tensor<T, [1, H, G, S+1], @host>,
  tensor<T, [1, H, S+1, Dh], @host>, tensor<T, [1, H, G, Dh], @host>) {
  let k = concat[axis=3] k_past k_new;
  let v = concat[axis=2] v_past v_new;
  (k, q @ k, v, p @ v)
}
"""


@pytest.mark.parametrize("T", ["F32", "F16"])
def test_grouped_query_rows_agree_at_O0_and_O3(T):
    """A grouped-query head's G query rows against its cache (G static: 2, 3, 5) go
    together, each row of K and V read once for all of them (group-rows): -O0's bits,
    fused (the concat written too) or in place (the cache's own buffer), the values'
    rows in registers (Dh 64) or not (Dh 40), with the scores' rows of any length, on
    one thread and two."""
    dt = DTYPES[T]
    for i, (H, G, Dh, S) in enumerate([(3, 3, 64, 100), (2, 2, 40, 31), (1, 5, 64, 257), (3, 3, 64, 0)]):
        dims = (("H", H), ("G", G), ("Dh", Dh))
        o3, o0 = _compile(FUSED_GQA, 3, T, dims), _compile(FUSED_GQA, 0, T, dims)
        q, k_past, k_new, p, v_past, v_new = _inputs(
            [(1, H, G, Dh), (1, H, Dh, S), (1, H, Dh, 1), (1, H, G, S + 1), (1, H, S, Dh), (1, H, 1, Dh)], dt, i)
        want = o0(q, k_past, k_new, p, v_past, v_new)
        for threads in (1, 2):
            kbuf, vbuf = kina.runtime.empty((1, H, Dh, S + 3), dt), kina.runtime.empty((1, H, S + 3, Dh), dt)
            kbuf[..., :S], vbuf[:, :, :S] = k_past, v_past
            for in_place in (False, True):
                outs = [kina.runtime.empty(w.shape, w.dtype) for w in want]
                args = [q, k_past, k_new, p, v_past, v_new]
                if in_place:
                    outs[0], outs[2] = kbuf[..., :S + 1], vbuf[:, :, :S + 1]
                    args[1], args[4] = kbuf[..., :S], vbuf[:, :, :S]
                o3.prepare(args, outs, threads=threads)()
                for n, (got, w) in enumerate(zip(outs, want)):
                    assert_same(got, w, what=f"{T} result {n}, H={H} G={G} Dh={Dh} S={S}, {threads} threads, "
                                             f"{'in place' if in_place else 'fused'} (-O3 vs -O0)")


@pytest.mark.parametrize("T", ["F32", "F16"])
def test_a_concat_onto_its_own_past_appends_in_place(T):
    """A cache held in one buffer per tensor: the filled part is passed as the past and the
    same buffer, one position longer, as the concat's result (kina.models' StoryCache).
    The fused matmuls find their slot to be rhs's own memory and leave it as it is; the
    results are -O0's on separate buffers, the new position lands after the past, and no
    position past it is written, on one thread and two."""
    o3, o0 = _compile(FUSED, 3, T), _compile(FUSED, 0, T)
    dt = DTYPES[T]
    for i, (B, H, Dh, S) in enumerate([(1, 2, 64, 0), (1, 3, 64, 31), (1, 8, 64, 100), (2, 1, 40, 257)]):
        q, k_past, k_new, p, v_past, v_new = _inputs(
            [(B, H, 1, Dh), (B, H, Dh, S), (B, H, Dh, 1), (B, H, 1, S + 1), (B, H, S, Dh), (B, H, 1, Dh)], dt, i)
        want = o0(q, k_past, k_new, p, v_past, v_new)
        for threads in (1, 2):
            kbuf = kina.runtime.empty((B, H, Dh, S + 9), dt)
            vbuf = kina.runtime.empty((B, H, S + 9, Dh), dt)
            kbuf[...], vbuf[...] = np.nan, np.nan
            kbuf[..., :S], vbuf[:, :, :S] = k_past, v_past
            scores, context = kina.runtime.empty(want[1].shape, dt), kina.runtime.empty(want[3].shape, dt)
            o3.prepare([q, kbuf[..., :S], k_new, p, vbuf[:, :, :S], v_new],
                       [kbuf[..., :S + 1], scores, vbuf[:, :, :S + 1], context], threads=threads)()
            what = f"{T} B={B} H={H} Dh={Dh} S={S}, {threads} threads, in place"
            for n, got in enumerate([kbuf[..., :S + 1], scores, vbuf[:, :, :S + 1], context]):
                assert_same(got, want[n], what=f"result {n}, {what}")
            assert np.isnan(kbuf[..., S + 1:]).all() and np.isnan(vbuf[:, :, S + 1:]).all(), what


@pytest.mark.parametrize("T", ["F16", "BF16"])
def test_fused_widening_matmuls_agree_at_O0_and_O3(T):
    """An F16 or BF16 model's attention: each matmul (F32 sums) also copies its cache into
    the concat's slot, which matmul-loops writes with non-temporal stores of whole lines of
    the narrow type. Slot rows on and off a 64-byte boundary (S + 1 a multiple of 32 or
    not), the scores' row longer and shorter than a vector, the values' row in registers
    (Dh 64) or not (Dh 40), on one thread and on the threaded entry's two."""
    o3, o0 = _compile(FUSED, 3, T), _compile(FUSED, 0, T)
    for i, (B, H, Dh, S) in enumerate([(1, 2, 64, 0), (1, 2, 64, 31), (1, 3, 64, 100), (2, 1, 40, 63), (1, 2, 40, 5)]):
        args = _inputs([(B, H, 1, Dh), (B, H, Dh, S), (B, H, Dh, 1), (B, H, 1, S + 1), (B, H, S, Dh), (B, H, 1, Dh)],
                       DTYPES[T], i)
        want = o0(*args)
        outs = [kina.runtime.empty(w.shape, w.dtype) for w in want]
        for threads in (1, 2):
            o3.prepare(args, outs, threads=threads)()
            for n, (got, w) in enumerate(zip(outs, want)):
                assert_same(got, w, what=f"{T} result {n}, B={B} H={H} Dh={Dh} S={S}, {threads} threads (-O3 vs -O0)")
