"""Mixed matmuls: F32 activations against F16 or BF16 weights (or the other way round).

The narrow operand is widened exactly and the product summed in F32, so every loop form
of matmul-loops (decode rows, register tiles, the transposed form, broadcast batches)
gives -O0's bits, split-k its own chunked order on any thread count, and the NumPy
reference the same values as an F32 matmul of the widened operands.
"""
from __future__ import annotations

import numpy as np
import pytest

import kina
from conftest import assert_same, check_against_numpy
from kina.driver.pipeline import Options
from test_matmul_loops import ALONE, DTYPES, SHAPES, _inputs
from test_split_k import chunked

PAIRS = [("F32", "F16"), ("F16", "F32"), ("F32", "BF16"), ("BF16", "F32")]
MIXED = """
let f = fn[A, B](x: tensor<A, [P, K], @host>, w: tensor<B, [K, N], @host>) -> (tensor<F32, [P, N], @host>) {
  (x @ w)
}
"""
MIXED_T = """
let f = fn[A, B](x: tensor<A, [P, K], @host>, w: tensor<B, [N, K], @host>) -> (tensor<F32, [P, N], @host>) {
  (x @ transpose[perm=[1, 0]] w)
}
"""
MIXED_BATCHED = """
let f = fn[A, B](x: tensor<A, [H, P, K], @host>, w: tensor<B, [K, N], @host>) -> (tensor<F32, [H, P, N], @host>) {
  (x @ w)
}
"""


def _compile(source: str, level: int, A: str, B: str, passes: str = ALONE, dims=()):
    return kina.compile_source(source, "<mixed>", Options(opt_level=level, dtypes=(("A", A), ("B", B)), dims=dims,
                                                          pass_options=passes if level else "")).f


@pytest.mark.parametrize("A,B", PAIRS)
def test_mixed_matmuls_agree_at_O0_and_O3(A, B):
    """Decode rows, tiles of rows, odd K and N, symbolic sizes, then x @ Wᵀ (the transposed
    form, each side loaded as its own type) and a broadcast batch: -O3's bits are -O0's."""
    forms = [(MIXED, lambda P, K, N: [(P, K), (K, N)]), (MIXED_T, lambda P, K, N: [(P, K), (N, K)]),
             (MIXED_BATCHED, lambda P, K, N: [(2, P, K), (K, N)])]
    for source, shapes in forms:
        o3, o0 = _compile(source, 3, A, B), _compile(source, 0, A, B)
        for i, (P, K, N) in enumerate(SHAPES if source is MIXED else SHAPES[::3]):
            x, w = (a.astype(DTYPES[t]) for a, t in zip(_inputs(shapes(P, K, N), np.float32, i), (A, B)))
            got = o3(x, w)[0]
            assert got.dtype == np.float32
            assert_same(got, o0(x, w)[0], what=f"{A} @ {B} P={P} K={K} N={N} ({source.split('(')[-1].strip()[:24]})")


@pytest.mark.parametrize("A,B", PAIRS[:3])
def test_mixed_matmul_is_the_f32_matmul_of_the_widened_operands(A, B):
    """The NumPy reference (the interpreter) against the compiled code; and the compiled
    mixed matmul against the F32 program on the widened operands, bit for bit."""
    x, w = (a.astype(DTYPES[t]) for a, t in zip(_inputs([(5, 70), (70, 33)], np.float32, 7), (A, B)))
    check_against_numpy(MIXED, "f", x, w, dtypes={"A": A, "B": B})
    f32 = _compile(MIXED, 3, "F32", "F32")(x.astype(np.float32), w.astype(np.float32))[0]
    assert_same(_compile(MIXED, 3, A, B)(x, w)[0], f32, what=f"{A} @ {B} against F32 @ F32")


@pytest.mark.parametrize("B", ["F16", "BF16"])
def test_split_k_sums_a_mixed_decode_row_in_its_order_on_any_thread_count(B):
    """x[1, K] F32 @ W[K, N] F16/BF16 over a weight: split-k's chunks, each thread count."""
    K, N = 512, 384
    x = _inputs([(1, 1, K)], np.float32, 3)[0]
    w = _inputs([(K, N)], DTYPES[B], 4)[0]
    row = """
let f = fn[B](x: tensor<F32, [1, 1, K], @host>, w: tensor<B, [K, N], @host>) -> (tensor<F32, [1, 1, N], @host>) {
  (x @ w)
}
"""
    f = kina.compile_source(row, "<mixed split-k>", Options(dtypes=(("B", B),), dims=(("K", K), ("N", N)),
                                                           pass_options="split-k{min-bytes=1024}")).f
    want = chunked(x, w.astype(np.float32), 8)
    for threads in (1, 2, 3):
        out = np.empty((1, 1, N), np.float32)
        f.call_unchecked([x, w], [out], threads)
        assert_same(out, want, what=f"F32 @ {B} split-k on {threads} threads")
