"""split-k's order of sums, bit for bit: a decode row x[1, K] @ W[K, N] over a weight is
summed in `chunks` chunks of k (each in ascending k, from 0), then the chunks are added in
ascending order to the output's initial value; the same bits on any thread count. F32,
and F16/BF16 widened to F32 sums and rounded once. (The rewrite itself, and the matmuls
it leaves alone: tests/passes/split-k.mlir.)
"""
from __future__ import annotations

import numpy as np
import pytest

import kina
from conftest import assert_same
from kina.driver.pipeline import Options
from test_matmul_loops import DTYPES, _inputs

ROW = """
let f = fn[T](x: tensor<T, [1, 1, K], @host>, w: tensor<T, [K, N], @host>) -> (tensor<T, [1, 1, N], @host>) {
  (x @ w)
}
"""


def chunked(x: np.ndarray, w: np.ndarray, chunks: int) -> np.ndarray:
    """x[1, 1, K] @ w[K, N] in split-k's order, in F32: each chunk's sum over its k in
    ascending order (multiply, then add), then the chunks added in order to 0."""
    x32, w32 = x.astype(np.float32).reshape(-1), w.astype(np.float32)
    part = x32.shape[0] // chunks
    total = np.zeros(w.shape[1], np.float32)
    for c in range(chunks):
        p = np.zeros(w.shape[1], np.float32)
        for k in range(c * part, (c + 1) * part):
            p += x32[k] * w32[k]
        total += p
    return total.astype(x.dtype).reshape(1, 1, -1)


def _build(T: str, K: int, N: int, passes: str = ""):
    return kina.compile_source(ROW, "<split-k>", Options(dtypes=(("T", T),), dims=(("K", K), ("N", N)),
                                                         pass_options=passes)).f


@pytest.mark.parametrize("T", DTYPES)
def test_a_decode_row_sums_in_chunks_then_adds_them_in_order(T):
    K, N = 576, 320  # 8 chunks of 72 rows; 360 KiB of F32 weight, 180 KiB of F16 (chunked from 128 KiB)
    f = _build(T, K, N, "")
    x, w = _inputs([(1, 1, K), (K, N)], DTYPES[T], 3)
    want = chunked(x, w, 8)
    for threads in (1, 2, 3):
        assert_same(f(x, w, threads=threads)[0], want, what=f"{T} on {threads} threads")
    assert f.threaded, "the chunks' matmul is split between threads"


def test_the_options_choose_the_chunks_and_what_is_chunked():
    K, N = 576, 320
    x, w = _inputs([(1, 1, K), (K, N)], DTYPES["F32"], 4)
    assert_same(_build("F32", K, N, "split-k{chunks=4}")(x, w)[0], chunked(x, w, 4))
    plain = _build("F32", K, N, "split-k{min-bytes=1048576}")(x, w)[0]  # too small to chunk: one running sum
    assert_same(plain, chunked(x, w, 1))
    assert not np.array_equal(plain, chunked(x, w, 8))  # the test tells the orders apart
    assert_same(_build("F32", K, N, "split-k{chunks=16}")(x, w)[0], chunked(x, w, 16))
    x, w = _inputs([(1, 1, K), (K, 48)], DTYPES["F32"], 5)  # 108 KiB, under the default 128 KiB
    assert_same(_build("F32", K, 48)(x, w)[0], chunked(x, w, 1))
    assert not np.array_equal(chunked(x, w, 1), chunked(x, w, 8))
