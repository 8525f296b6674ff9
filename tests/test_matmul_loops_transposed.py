"""matmul-loops' transposed form against -O0's plain loops, bit for bit: a matmul whose
rhs runs along k as its lhs does (a tied head's table @ xᵀ, x @ Wᵀ, a weight stored
[out, in] against a prompt, w @ xᵀ), summed as dot products of rows through 16x16
squares transposed in registers, 16 columns of the other side per square and then
groups of 4 and 1; F32, and F16/BF16 widened to F32 sums; symbolic and static sizes,
strided rows, broadcast batches. (The other loop forms: tests/test_matmul_loops.py.)
"""
from __future__ import annotations

import pytest

import kina
from conftest import assert_same
from kina.driver.pipeline import Options
from test_matmul_loops import DTYPES, _compile, _inputs, _same_at_both_levels

TIED = """
let f = fn[T](t: tensor<T, [V, D], @host>, x: tensor<T, [B, D], @host>) -> (tensor<T, [B, V], @host>) {
  (transpose[perm=[1, 0]] (t @ transpose[perm=[1, 0]] x))
}
"""
BATCHED_TIED = """
let f = fn[T](t: tensor<T, [V, D], @host>, x: tensor<T, [H, B, D], @host>) -> (tensor<T, [H, V, B], @host>) {
  (t @ transpose[perm=[0, 2, 1]] x)
}
"""


@pytest.mark.parametrize("T", DTYPES)
def test_rows_dotted_with_a_transposed_rhs_agree_at_O0_and_O3(T):
    """table[V, D] @ x[B, D]ᵀ (a tied head): rhs columns run along k, so the rows are
    summed as dot products, `lanes` rows at a time through a square transposed in
    registers; V and D on and off whole blocks, B = 1 and more. F32 at symbolic sizes
    (every group, both orientations, strided rows, broadcast batches, the option) and
    static ones; F16/BF16 (rows widened as loaded, the other side widened once) static."""
    if T != "F32":
        for i, (V, D, B) in enumerate([(40, 37, 29), (100, 576, 1)]):
            _same_at_both_levels(TIED, T, _inputs([(V, D), (B, D)], DTYPES[T], i),
                                 dims=(("V", V), ("D", D), ("B", B)))
        return
    o3, o0 = _compile(TIED, 3, T), _compile(TIED, 0, T)
    # B = 16, 29 (16 + 4 + 4 + 4 + 1), 40: a block of rows against 16 columns at a time, then groups of 4 and 1
    cases = [(16, 16, 1), (40, 37, 1), (100, 576, 1), (33, 5, 3), (7, 64, 2), (64, 1, 1), (48, 40, 16),
             (40, 37, 29), (33, 70, 40), (3, 20, 50)]
    for i, (V, D, B) in enumerate(cases):
        t, x = _inputs([(V, D), (B, D)], DTYPES[T], i)
        assert_same(o3(t, x)[0], o0(t, x)[0], what=f"{T} V={V} D={D} B={B} transposed rhs")
    V, D, B = 200, 96, 23  # static: only the groups that run (16, 4, 1) are built
    t, x = _inputs([(V, D), (B, D)], DTYPES[T], 9)
    _same_at_both_levels(TIED, T, [t, x], dims=(("V", V), ("D", D), ("B", B)))
    odd = kina.compile_source(TIED, "<matmul-loops>", Options(  # the option changes the loops, not the sums
        dtypes=(("T", T),), dims=(("V", 40), ("D", 37), ("B", 29)),
        pass_options="matmul-loops{transposed-columns=3}")).f
    t, x = _inputs([(40, 37), (29, 37)], DTYPES[T], 11)
    assert_same(odd(t, x)[0], o0(t, x)[0], what=f"{T} transposed-columns=3")
    tb, x = _inputs([(50, 70), (2, 40)], DTYPES[T], 10)  # strided rows: a slice of a wider table
    assert_same(o3(tb[:, 3:43], x)[0], o0(tb[:, 3:43], x)[0], what=f"{T} strided table rows")
    for i, (H, V, D, B) in enumerate([(2, 48, 20, 1), (3, 17, 33, 2), (2, 40, 24, 21)]):
        _same_at_both_levels(BATCHED_TIED, T, _inputs([(V, D), (H, B, D)], DTYPES[T], 20 + i))


LINEAR = """
let f = fn[T](x: tensor<T, [P, K], @host>, w: tensor<T, [N, K], @host>) -> (tensor<T, [P, N], @host>) {
  (x @ transpose[perm=[1, 0]] w)
}
"""


@pytest.mark.parametrize("T", DTYPES)
def test_x_times_a_transposed_weight_agrees_at_O0_and_O3(T):
    """x[P, K] @ W[N, K]ᵀ (PyTorch's Linear layout): rhs columns run along k; the side
    with more rows is blocked (W's rows for a decode row, x's for a long prompt), chosen
    at run time when both sizes are symbolic; when only one is, the static side."""
    for P, K, N in [(40, 24, 5)] + ([(1, 576, 100)] if T != "F32" else []):  # static
        _same_at_both_levels(LINEAR, T, _inputs([(P, K), (N, K)], DTYPES[T], P * N),
                             dims=(("P", P), ("K", K), ("N", N)))
    if T != "F32":  # symbolic sizes: F32 (the widening is the same at any size)
        return
    o3, o0 = _compile(LINEAR, 3, T), _compile(LINEAR, 0, T)
    for i, (P, K, N) in enumerate([(1, 576, 100), (1, 16, 16), (3, 40, 33), (40, 20, 3), (17, 33, 17), (2, 5, 1)]):
        x, w = _inputs([(P, K), (N, K)], DTYPES[T], 30 + i)
        assert_same(o3(x, w)[0], o0(x, w)[0], what=f"{T} P={P} K={K} N={N} x @ Wᵀ")
