"""broadcast-loops: elementwise ops with an operand constant along the innermost dim (a
row's maximum, sum or scale), as loops that load it once per row.

The same body computes each element from the same operands, so -O3 gives -O0's bits, any
thread count the same bits (the threads pass's parts are views of one workspace, the case
the pass is for), and the NumPy reference the same values.
"""
from __future__ import annotations

import numpy as np
import pytest

import kina
from conftest import assert_same, check_against_numpy
from kina.driver.pipeline import Options

SOFTMAX = """
let f = fn(x: tensor<F32, [H, P, S], @host>) -> (tensor<F32, [H, P, S], @host>) {
  (softmax(x, axis=2))
}
"""
ROWS = """
let f = fn(x: tensor<F32, [P, D], @host>, m: tensor<F32, [P, 1], @host>, g: tensor<F32, [1, D], @host>)
  -> (tensor<F32, [P, D], @host>) {
  ((x - broadcast(m)) * broadcast(g) / broadcast(m) + 0.5)
}
"""
SHAPES = [(1, 1, 1), (3, 5, 7), (9, 33, 256), (2, 300, 17)]


@pytest.mark.parametrize("H,P,S", SHAPES)
def test_softmax_rows_give_the_same_bits_on_any_thread_count(H, P, S):
    """exp-to-arith and sum-loops make -O3's softmax other bits than -O0's; the threads'
    parts, views of one workspace (the pass's case), give the one-thread bits."""
    f = kina.compile_source(SOFTMAX, "<broadcast-loops>").f
    x = np.random.default_rng(H + P + S).standard_normal((H, P, S)).astype(np.float32) * 4
    want = f(x, threads=1)[0]
    for threads in (2, 3):
        assert_same(f(x, threads=threads)[0], want, what=f"softmax [{H}, {P}, {S}] on {threads} threads")


def test_softmax_rows_match_numpy():
    x = np.random.default_rng(1).standard_normal((4, 33, 100)).astype(np.float32) * 4
    check_against_numpy(SOFTMAX, "f", x)


@pytest.mark.parametrize("P,D", [(1, 64), (7, 65), (300, 64)])
def test_rows_against_their_own_values_agree_at_O0_and_O3(P, D):
    """Elementwise only (no sum, no exp): -O3 on 1 and 2 threads gives -O0's bits."""
    rng = np.random.default_rng(P)
    x, m, g = (rng.standard_normal(s).astype(np.float32) for s in ((P, D), (P, 1), (1, D)))
    o3, o0 = (kina.compile_source(ROWS, "<broadcast-loops>", Options(opt_level=level)).f for level in (3, 0))
    for threads in (1, 2):
        assert_same(o3(x, m, g, threads=threads)[0], o0(x, m, g)[0], what=f"rows [{P}, {D}] on {threads} threads")
    check_against_numpy(ROWS, "f", x, m, g)
