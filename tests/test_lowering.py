"""Lowering edge cases found by review: each compiles and matches the NumPy reference."""
import numpy as np
import pytest

from conftest import check_against_numpy


@pytest.mark.parametrize("name", ["expf", "log", "free", "malloc", "memset"])
def test_function_named_like_a_libc_symbol(name):
    # exported symbols are prefixed, so these cannot replace what the generated code calls
    # (libm's exp is a word of Kina, which no function may be named: tests/errors/calls.kina)
    source = (f"let {name} = fn(a: tensor<F32, [2, 4], @host>) -> (tensor<F32, [2, 4], @host>) {{\n"
              f"  (softmax(a, axis=1))\n}}\n")
    a = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    check_against_numpy(source, name, a, rtol=1e-6)


def test_matmul_whose_lhs_also_reads_the_fused_concat():
    source = """
let f = fn(q: tensor<F32, [1, 4], @host>, a: tensor<F32, [4, 2], @host>, b: tensor<F32, [4, 2], @host>)
  -> (tensor<F32, [1, 4], @host>, tensor<F32, [4, 4], @host>) {
  let x = concat[axis=1] a b;
  ((q @ x) @ x, x)
}
"""
    r = np.random.default_rng(0)
    args = [r.standard_normal(s).astype(np.float32) for s in [(1, 4), (4, 2), (4, 2)]]
    check_against_numpy(source, "f", *args, exact=(1,))


def test_square_concat_read_by_its_own_matmul():
    source = """
let f = fn(a: tensor<F32, [1, 1], @host>, b: tensor<F32, [0, 1], @host>) -> (tensor<F32, [1, 1], @host>) {
  let x = concat[axis=0] a b;
  (x @ x)
}
"""
    check_against_numpy(source, "f", np.full((1, 1), 3, np.float32), np.zeros((0, 1), np.float32))


def test_narrow_fused_copy_uses_scalar_stores_only():
    # narrower than one vector: every copy store is a scalar (non-temporal) one
    source = """
let f = fn(q: tensor<F32, [1, 5], @host>, a: tensor<F32, [5, 3], @host>, b: tensor<F32, [5, 2], @host>)
  -> (tensor<F32, [5, 5], @host>, tensor<F32, [1, 5], @host>) {
  let x = concat[axis=1] a b;
  (x, q @ x)
}
"""
    r = np.random.default_rng(1)
    args = [r.standard_normal(s).astype(np.float32) for s in [(1, 5), (5, 3), (5, 2)]]
    check_against_numpy(source, "f", *args, exact=(0,))


def test_f16_sums_run_in_f32():
    """F16 matmul and softmax accumulate in F32 and round once, as NumPy's matmul does:
    over K=512 an F16 accumulator would be several times less accurate."""
    import kina
    source = """
let f = fn(a: tensor<F16, [8, 512], @host>, b: tensor<F16, [512, 8], @host>) -> (tensor<F16, [8, 8], @host>, tensor<F16, [8, 512], @host>) {
  (a @ b, softmax(a, axis=1))
}
"""
    r = np.random.default_rng(3)
    a, b = (r.standard_normal(s).astype(np.float16) for s in [(8, 512), (512, 8)])
    mm, sm = kina.compile_source(source, "f16.kina").f(a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    rounded = exact.astype(np.float16).astype(np.float64)  # the best an F16 result can be
    assert np.max(np.abs(mm - exact)) <= 2 * np.max(np.abs(rounded - exact)) + 1e-3
    e = np.exp(a.astype(np.float64) - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(sm.astype(np.float64), e / e.sum(axis=1, keepdims=True), rtol=1e-3, atol=1e-6)


def test_softmax_exp_is_within_one_ulp_and_handles_special_values():
    """softmax([0, x]) at x <= -17.5 is exp(x) itself (1 + e**x rounds to 1), so those
    rows check exp_f32 (kina.ir.passes.exp_to_arith) directly, subnormal results included; above that, the
    sum and division add at most about one ulp more. scripts/exp_accuracy.py checks
    every f32 in [-104, 88.7] directly."""
    import kina
    source = "let f = fn(a: tensor<F32, [N, 2], @host>) -> (tensor<F32, [N, 2], @host>) {\n  (softmax(a, axis=1))\n}\n"
    f = kina.compile_source(source, "softmax_exp.kina").f

    def rows(x):
        return f(np.stack([np.zeros_like(x), x], axis=1))[0]

    def ulps(got, want):
        spacing = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
        return np.abs(got - want) / np.maximum(spacing, float(np.finfo(np.float32).smallest_subnormal))

    r = np.random.default_rng(7)
    deep = np.concatenate([r.uniform(-104, -17.5, 400_000), np.linspace(-104, -87, 100_000)]).astype(np.float32)
    assert ulps(rows(deep)[:, 1], np.exp(deep.astype(np.float64))).max() <= 1.0
    near = r.uniform(-17.5, 0, 400_000).astype(np.float32)
    e = np.exp(near.astype(np.float64))
    p = rows(near)
    assert ulps(p[:, 1], e / (1 + e)).max() <= 2.5 and ulps(p[:, 0], 1 / (1 + e)).max() <= 2.5
    special = rows(np.array([0, -0.0, -np.inf, -200, -103.99, np.nan], np.float32))
    np.testing.assert_array_equal(special[:, 1], [0.5, 0.5, 0, 0, 0, np.nan])
    np.testing.assert_array_equal(special[:4, 0], [0.5, 0.5, 1, 1])


@pytest.mark.parametrize("reused, body, results", [
    # scores, scaled, exp and probs share one buffer: only it and the two row reductions are allocated
    (True, "let s = q @ k;\n  let t = s * broadcast(c);\n  let p = softmax(t, axis=1);\n  let o = p @ v;", "o"),
    # t is read twice, so softmax cannot write over it: one more buffer
    (False, "let s = q @ k;\n  let t = s * broadcast(c);\n  let p = softmax(t, axis=1);\n  let o = p @ v;\n  let u = t * p;",
     "o, u"),
])
def test_dying_operands_are_updated_in_place(reused, body, results):
    from kina.driver.pipeline import run_stages
    out_types = ", ".join("tensor<F32, [1, 8], @host>" if r == "o" else "tensor<F32, [1, N], @host>"
                          for r in results.split(", "))
    source = (f"let f = fn(q: tensor<F32, [1, 8], @host>, k: tensor<F32, [8, N], @host>, v: tensor<F32, [N, 8], @host>,\n"
              f"  c: tensor<F32, [1, 1], @host>) -> ({out_types}) {{\n  {body}\n  ({results})\n}}\n")
    lowered = run_stages(source, "reuse.kina", until="to-llvm").module.operation.get_asm()
    assert lowered.count("llvm.call @malloc(") == (3 if reused else 4)
    r = np.random.default_rng(5)
    q, k, v, c = (r.standard_normal(s).astype(np.float32) for s in [(1, 8), (8, 40), (40, 8), (1, 1)])
    check_against_numpy(source, "f", q, k, v, c)


def sequential_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The summation order Kina's matmuls promise: for each output element, k ascending,
    fmul then fadd, each rounded to the dtype (NumPy's elementwise ops round each one)."""
    acc = np.zeros(a.shape[:-1] + b.shape[-1:], a.dtype)
    for k in range(a.shape[-1]):
        acc = acc + a[..., :, k:k + 1] * b[..., k:k + 1, :]
    return acc


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("K, N", [(1, 32), (7, 16), (64, 64), (300, 96), (33, 128), (9, 160), (70, 200), (5, 1000)])
def test_matmul_sums_in_ascending_k_order_bit_for_bit(K, N, static):
    """Rows kept in registers (N = 32..128 floats), rows streamed 8 at a time (the
    others), and both kinds of fused concat: all sum in ascending k, so all match the
    sequential float32 reference exactly."""
    import kina
    source = """
let f = fn(m: tensor<F32, [3, K], @host>, q: tensor<F32, [1, K], @host>, p: tensor<F32, [1, K+1], @host>,
  a: tensor<F32, [K, N], @host>, b: tensor<F32, [K, 1], @host>, c: tensor<F32, [1, N], @host>)
  -> (tensor<F32, [3, N], @host>, tensor<F32, [1, N+1], @host>, tensor<F32, [K, N+1], @host>,
      tensor<F32, [1, N], @host>, tensor<F32, [K+1, N], @host>) {
  let x = concat[axis=1] a b;
  let y = concat[axis=0] a c;
  (m @ a, q @ x, x, p @ y, y)
}
"""
    r = np.random.default_rng(K * N)
    m, q, p, a, b, c = (r.standard_normal(s).astype(np.float32) for s in [(3, K), (1, K), (1, K + 1), (K, N), (K, 1), (1, N)])
    plain, fused, x, fused_rows, y = kina.compile_source(source, "order.kina",
                                                         dims=dict(K=K, N=N) if static else None).f(m, q, p, a, b, c)
    np.testing.assert_array_equal(x, np.concatenate([a, b], axis=1))
    np.testing.assert_array_equal(y, np.concatenate([a, c], axis=0))
    np.testing.assert_array_equal(plain, sequential_matmul(m, a))
    np.testing.assert_array_equal(fused, sequential_matmul(q, x))
    np.testing.assert_array_equal(fused_rows, sequential_matmul(p, y))
