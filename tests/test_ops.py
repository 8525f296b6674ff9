"""The decoder ops (issue 13), compiled and compared with the NumPy interpreter, one line each.

Each line is a whole function, `f(x, y, ...) -> (result)`, written by `fn` from an
expression, its result dims and its parameters' dims, then run through
`conftest.check_against_numpy` on seeded random inputs. `exact=E` asks for bit-equality
with the interpreter: data movement (transpose, reshape, slice), single IEEE operations
(+ - * /, maximum, negation, sqrt, rsqrt, max) and F16/BF16 matmuls are exact; exp, sigmoid and
F32 sums are compared within the helper's tolerance (libm vs Cephes, and NumPy's
pairwise sums vs the compiled order). Static and symbolic dims are both covered, and a
few properties follow: static and symbolic programs give the same bits, a broadcast
matmul gives the same bits at -O0 and -O3, and views are read in place.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kina
from conftest import assert_same, check_against_numpy
from kina.driver.pipeline import Options
from kina.runtime import numpy_dtype

E = (0,)  # the one result is exact
SIZES = {"B": 2, "S": 5, "H": 3, "T": 0}


def fn(expr: str, result: str, dtype: str = "F32", **params: str) -> str:
    """`let f = fn(name: tensor<dtype, [dims]>, ...) -> (tensor<dtype, [result]>) { (expr) }`."""
    ty = lambda dims: f"tensor<{dtype}, [{dims}], @host>"
    ps = ", ".join(f"{n}: {ty(d)}" for n, d in params.items())
    return f"let f = fn({ps}) -> ({ty(result)}) {{\n  ({expr})\n}}\n"


def arrays(source: str, seed: int = 0, positive: bool = False) -> list[np.ndarray]:
    """Seeded inputs for `source`'s parameters, symbolic dims at SIZES (positive: for sqrt)."""
    rng = np.random.default_rng(seed)
    out = []
    for _, t in kina.frontend.check.check(kina.frontend.syntax.parse(source)).functions[0].sig.params:
        shape = tuple(d.evaluate(SIZES) for d in t.dims)
        if t.is_float:
            v = rng.standard_normal(shape)
            out.append((np.abs(v) + 0.1 if positive else v).astype(numpy_dtype(t.dtype)))
        else:
            out.append(rng.integers(-50, 50, shape).astype(numpy_dtype(t.dtype)))
    return out


def run(source: str, exact=(), positive: bool = False, **tol):
    return check_against_numpy(source, "f", *arrays(source, positive=positive), exact=exact, **tol)


# -- transpose, reshape, slice: data movement, bit-exact -------------------------------------

@pytest.mark.parametrize("source", [
    fn("transpose[perm=[0, 2, 1, 3]] x", "2, 8, 1, 4", x="2, 1, 8, 4"),
    fn("transpose[perm=[0, 2, 1, 3]] x", "B, H, 1, S", x="B, 1, H, S"),
    fn("transpose[perm=[1, 0]] x", "S, 3", x="3, S"),
    fn("transpose[perm=[2, 0, 1]] x", "S, 2, 3", "I32", x="2, 3, S"),
    fn("transpose[perm=[0, 1]] x", "2, 3", "F16", x="2, 3"),
    fn("transpose[perm=[1, 0]] x", "T, 2", x="2, T"),
    fn("transpose[perm=[0]] x", "S", "BF16", x="S"),
])
def test_transpose(source):
    run(source, exact=E)


@pytest.mark.parametrize("source", [
    fn("reshape[dims=[B, 1, 8, 4]] x", "B, 1, 8, 4", x="B, 1, 32"),       # split the last dim
    fn("reshape[dims=[B, 32]] x", "B, 32", x="B, 8, 4"),                  # merge the last two
    fn("reshape[dims=[2, 12]] x", "2, 12", x="4, 6"),                     # neither: collapse, then expand
    fn("reshape[dims=[2, B, 12]] x", "2, B, 12", x="B, 4, 6"),            # a symbolic dim moves among static ones
    fn("reshape[dims=[1, S, 1]] x", "1, S, 1", x="S"),                    # unit dims around a symbolic one
    fn("reshape[dims=[S, H]] x", "S, H", "I64", x="S, 1, H"),
    fn("reshape[dims=[S+1, 6]] x", "S+1, 6", x="S+1, 2, 3", s="S"),       # a compound dim passes through
    fn("reshape[dims=[]] x", "", x="1, 1"),                               # to rank 0 and back
    fn("reshape[dims=[1, 1]] x", "1, 1", x=""),
    fn("reshape[dims=[2, 3]] x", "2, 3", "F16", x="2, 3"),                # the same shape
    fn("reshape[dims=[0, 5]] x", "0, 5", x="2, 0"),                       # no elements
    fn("reshape[dims=[0, S]] x", "0, S", x="0, 0, S"),
    fn("reshape[dims=[T, 4]] x", "T, 4", x="T, 2, 2"),
])
def test_reshape(source):
    run(source, exact=E)


@pytest.mark.parametrize("source", [
    fn("slice[axis=3, start=2, size=2] x", "2, 1, 3, 2", x="2, 1, 3, 4"),
    fn("slice[axis=1, start=0, size=3] x", "B, 3", x="B, 7"),
    fn("slice[axis=0, start=1, size=1] x", "1, 4", x="S+2, 4", s="S"),    # within the static part of S+2
    fn("slice[axis=1, start=4, size=0] x", "B, 0", "I32", x="B, 4"),
    fn("slice[axis=0, start=0, size=3] x", "3, S", "BF16", x="3, S"),     # all of it
    fn("slice[axis=0, start=0, size=0] x", "0, 2", x="0, 2"),             # of a dim of 0
])
def test_slice(source):
    run(source, exact=E)


# -- + - * / with broadcast and numbers ----------------------------------------------------------

@pytest.mark.parametrize("source", [
    fn("x - y", "B, 3", x="B, 3", y="B, 3"),
    fn("x / y", "B, 3", x="B, 3", y="B, 3"),
    fn("x - broadcast(y)", "B, S", x="B, S", y="B, 1"),
    fn("broadcast(y) / x", "B, S", "F16", x="B, S", y="1, S"),
    fn("x - y - x", "4", "I32", x="4", y="4"),                            # (x - y) - x
    fn("x / y * x / y", "3", "BF16", x="3", y="3"),                       # ((x / y) * x) / y
    fn("x * 2", "S", x="S"),
    fn("2 - x", "S", x="S"),
    fn("1 / x", "3, 2", "F64", x="3, 2"),
    fn("x + 1e-6", "S", "BF16", x="S"),
    fn("x * -0.5 + 3", "S", "F16", x="S"),
    fn("x - -2 * x", "5", "I64", x="5"),                                  # x - ((-2) * x)
    fn("x * 0.1", "2", "F32", x="2"),                                     # 0.1 rounded to F32 once
])
def test_binary(source):
    run(source, exact=E)


def test_a_number_is_rounded_once_to_the_dtype():
    # 1 + 2^-8 + 2^-30 is just above a tie of bf16: rounding it through F32 first would give 1.
    source = fn("x * 1.0039062509313226", "1", "BF16", x="1")
    (got,) = check_against_numpy(source, "f", np.ones(1, ml_dtypes.bfloat16), exact=E)
    assert got[0] == ml_dtypes.bfloat16(1.0078125)


# -- maximum: the shapes, broadcast and numbers of + - * /; NaN propagates -----------------------

@pytest.mark.parametrize("source", [
    fn("maximum(x, y)", "B, 3", x="B, 3", y="B, 3"),
    fn("maximum(x, y)", "B, S", "F16", x="B, S", y="B, S"),
    fn("maximum(x, y)", "S", "BF16", x="S", y="S"),
    fn("maximum(x, y)", "2, 3", "F64", x="2, 3", y="2, 3"),
    fn("maximum(x, y)", "B, 3", "I32", x="B, 3", y="B, 3"),
    fn("maximum(x, y)", "4", "I64", x="4", y="4"),
    fn("maximum(x, 0.0)", "B, S", x="B, S"),                              # ReLU
    fn("maximum(x, 0)", "B, S", "I32", x="B, S"),
    fn("maximum(-0.5, x)", "S", "BF16", x="S"),
    fn("maximum(x, broadcast(y))", "B, S", "F16", x="B, S", y="B, 1"),
    fn("maximum(x, y) * 2 - maximum(y, x)", "3", x="3", y="3"),
])
def test_maximum(source):
    run(source, exact=E)


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16", "I32"])
def test_maximum_is_numpys_at_nan_infinities_zeros_and_extremes(dtype):
    # -0.0 and +0.0 compare equal: the compiled code gives +0.0 (IEEE 754 maximum), np.maximum either one
    if dtype == "I32":
        x, y = [np.iinfo(np.int32).min, np.iinfo(np.int32).max, -5, 3, 0], [0, 0, 3, -5, 0]
    else:
        x, y = [-0.0, 0.0, np.nan, 1, -np.inf, np.nan, 3, -2, np.inf], [0.0, -0.0, 1, np.nan, np.nan, np.nan, -3, 2, 1]
    x, y = (np.array(v, numpy_dtype(dtype)) for v in (x, y))
    (got,) = check_against_numpy(fn("maximum(x, y)", "S", dtype, x="S", y="S"), "f", x, y, exact=E)
    assert_same(got, np.maximum(x, y))


# -- convert: one rounding to nearest even (floats), exact widening, wrapping integers ---------------

def convert(src: str, dst: str, dims: str = "B, S") -> str:
    """`f(x: src) -> (convert[dtype=dst] x)`."""
    return (f"let f = fn(x: tensor<{src}, [{dims}], @host>) -> (tensor<{dst}, [{dims}], @host>) {{\n"
            f"  (convert[dtype={dst}] x)\n}}\n")


@pytest.mark.parametrize("src,dst", [("F32", "F16"), ("F16", "F32"), ("F32", "BF16"), ("BF16", "F32"),
                                     ("F64", "F32"), ("I32", "F32"), ("I32", "I64"), ("I64", "I32"),
                                     ("F16", "BF16"), ("F32", "F32"), ("I32", "I32")])
def test_convert(src, dst):
    x = (np.random.default_rng(0).standard_normal((2, 5)) * 3e4).astype(numpy_dtype(src))  # past F16's range too
    if src.startswith("I"):
        x = np.random.default_rng(0).integers(-2**31, 2**31 - 1, (2, 5)).astype(numpy_dtype(src))
    (got,) = check_against_numpy(convert(src, dst), "f", x, exact=E)
    assert_same(got, x.astype(numpy_dtype(dst)))


def test_convert_to_a_type_parameter_and_to_its_own_dtype():
    source = ("let f = fn[T](x: tensor<T, [S], @host>) -> (tensor<T, [S], @host>) {\n"
              "  (convert[dtype=T] (convert[dtype=F32] x * convert[dtype=F32] x))\n}\n")
    x = np.array([300, -2, 0.5], np.float16)
    for dtype in ("F16", "F32"):
        (got,) = check_against_numpy(source, "f", x.astype(numpy_dtype(dtype)), exact=E, dtypes={"T": dtype})
        with np.errstate(over="ignore"):  # 300 * 300 is past F16's largest value: inf
            want = np.array([90000, 4, 0.25], np.float32).astype(numpy_dtype(dtype))
        assert_same(got, want)
    checked = kina.frontend.check.check(kina.frontend.syntax.parse(source), {"T": "F32"})
    assert "Convert" not in kina.frontend.ast.dump(checked)  # to its own dtype: the operand itself, no op


# -- unary functions -------------------------------------------------------------------------------

@pytest.mark.parametrize("source,exact", [
    (fn("-x", "B, S", x="B, S"), E),
    (fn("-x", "B, S", "I32", x="B, S"), E),
    (fn("-x * y", "3", x="3", y="3"), E),                                 # (-x) * y
    (fn("sqrt(x)", "B, S", x="B, S"), E),
    (fn("rsqrt(x)", "B, S", x="B, S"), E),
    (fn("rsqrt(x)", "B, S", "F64", x="B, S"), E),
    (fn("rsqrt(x)", "2, 8", "F16", x="2, 8"), E),
    (fn("sqrt(x)", "S", "BF16", x="S"), E),
    (fn("exp(x)", "B, S", x="B, S"), ()),
    (fn("exp(x)", "B, S", "F64", x="B, S"), ()),
    (fn("sigmoid(x)", "B, S", x="B, S"), ()),
    (fn("x * sigmoid(x)", "4, 8", "F16", x="4, 8"), ()),                 # silu
])
def test_unary(source, exact):
    run(source, exact=exact, positive="sqrt" in source)


# -- reductions keep the rank ----------------------------------------------------------------------

@pytest.mark.parametrize("source,exact", [
    (fn("sum(x, axis=1)", "B, 1", x="B, S"), ()),
    (fn("sum(x, axis=0)", "1, S", x="B, S"), ()),
    (fn("sum(x, axis=1)", "2, 1, 4", "I32", x="2, 3, 4"), E),
    (fn("sum(x, axis=1)", "B, 1", "F16", x="B, 64"), (),),
    (fn("max(x, axis=2)", "B, 1, 1", x="B, 1, S"), E),
    (fn("max(x, axis=0)", "1, 3", "I64", x="S, 3"), E),
    (fn("max(x, axis=1)", "2, 1", "BF16", x="2, 9"), E),
    (fn("max(x, axis=0)", "1, S", "F16", x="4, S"), E),
    (fn("mean(x, axis=2)", "B, 1, 1", x="B, 1, 32"), ()),
    (fn("mean(x, axis=0)", "1, 3", "F64", x="S, 3"), ()),
    (fn("mean(x, axis=1)", "3, 1", "BF16", x="3, 16"), ()),
    (fn("x - broadcast(max(x, axis=1))", "B, S", x="B, S"), E),
    (fn("sum(x, axis=1)", "2, 1", x="2, T"), E),                          # an empty axis: 0
    (fn("max(x, axis=1)", "2, 1", x="2, T"), E),                          # -inf
    (fn("max(x, axis=1)", "2, 1", "I32", x="2, T"), E),                   # the smallest I32
    (fn("mean(x, axis=1)", "2, 1", x="2, T"), E),                         # 0 / 0: NaN
])
def test_reductions(source, exact):
    run(source, exact=exact, rtol=1e-3 if "F16" in source or "BF16" in source else 1e-5)


def test_reductions_over_an_empty_axis_give_their_identity():
    got = [run(fn(f"{op}(x, axis=1)", "2, 1", x="2, T"), exact=E)[0] for op in ("sum", "max", "mean")]
    assert got[0].tolist() == [[0], [0]] and got[1].tolist() == [[-np.inf]] * 2 and np.isnan(got[2]).all()


# -- matmul with broadcast batch dims (np.matmul's rule) -----------------------------------------

@pytest.mark.parametrize("source,exact", [
    (fn("x @ w", "B, 1, 24", x="B, 1, 16", w="16, 24"), ()),              # a projection: rank-3 @ rank-2
    (fn("x @ w", "B, S, 1, 24", x="B, S, 1, 16", w="16, 24"), ()),
    (fn("q @ k", "B, H, 1, S", q="B, H, 1, 8", k="1, H, 8, S"), ()),      # a stretched batch dim of 1
    (fn("a @ b", "4, 2, 5", a="2, 3", b="4, 3, 5"), ()),                  # the lhs broadcast
    (fn("a @ b", "2, 3, 2, 5", a="2, 1, 2, 4", b="3, 4, 5"), ()),         # both
    (fn("x @ w", "B, 1, 24", "F16", x="B, 1, 16", w="16, 24"), E),        # F16: F32 sums, k ascending: exact
    (fn("x @ w", "B, 1, 24", "BF16", x="B, 1, 16", w="16, 24"), E),
])
def test_broadcast_matmul(source, exact):
    run(source, exact=exact)


def test_broadcast_matmul_is_the_same_at_every_level():
    # matmul-loops reads a broadcast rhs at [k, j] in the plain loops' order: the same bits as -O0.
    source = fn("x @ w", "B, 1, 72", x="B, 1, 40", w="40, 72") + \
        fn("q @ k", "B, H, 1, S", q="B, H, 1, 40", k="1, H, 40, S").replace("let f", "let g")
    args = arrays(source)
    q, k = (np.random.default_rng(1).standard_normal(s).astype(np.float32) for s in [(2, 3, 1, 40), (1, 3, 40, 33)])
    fast, plain = (kina.compile_source(source, "<t>", Options(opt_level=level)) for level in (3, 0))
    assert_same(fast.f(*args)[0], plain.f(*args)[0])
    assert_same(fast.g(q, k)[0], plain.g(q, k)[0])


# -- together: a small pre-norm block, static and symbolic ---------------------------------------

BLOCK = """
let f = fn(x: tensor<F32, [B, 1, 32], @host>, g: tensor<F32, [1, 1, 32], @host>, w: tensor<F32, [32, 32], @host>,
           cos: tensor<F32, [1, 1, 1, 8], @host>, sin: tensor<F32, [1, 1, 1, 8], @host>)
  -> (tensor<F32, [B, 2, 1, 16], @host>, tensor<F32, [B, 1, 32], @host>) {
  let n = x * broadcast(rsqrt(mean(x * x, axis=2) + 1e-6)) * broadcast(g);
  let h = transpose[perm=[0, 2, 1, 3]] reshape[dims=[B, 1, 2, 16]] (n @ w);
  let x1 = slice[axis=3, start=0, size=8] h;
  let x2 = slice[axis=3, start=8, size=8] h;
  let rot = concat[axis=3] (x1 * broadcast(cos) - x2 * broadcast(sin)) (x2 * broadcast(cos) + x1 * broadcast(sin));
  let z = n @ w;
  (rot, x + z * sigmoid(z) / 2)
}
"""


def test_a_block_of_every_kind_static_and_symbolic():
    args = arrays(BLOCK)
    want = check_against_numpy(BLOCK, "f", *args)
    got = check_against_numpy(BLOCK, "f", *args, dims={"B": 2})  # B fixed, in the reshape's dims too
    for a, b in zip(got, want):  # the same program at the same sizes: the same bits
        assert_same(a, b)


def test_views_are_read_in_place():
    # A strided view of the operand (every other row) reshaped, sliced and transposed.
    source = fn("transpose[perm=[1, 0]] reshape[dims=[B, 8]] slice[axis=1, start=1, size=2] x", "8, B", x="B, 3, 4")
    base = np.random.default_rng(2).standard_normal((4, 3, 4)).astype(np.float32)
    (got,) = check_against_numpy(source, "f", base[::2], exact=E)
    assert_same(got, base[::2, 1:3].reshape(2, 8).T)
