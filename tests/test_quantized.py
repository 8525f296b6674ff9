"""Block-quantized tensors in Kina programs: `x @ w` and `convert[dtype=F32] w` with w a block
format, compiled (the reference dequantization at -O0; fuse-dequant-matmul and
quantized-matmul-loops at -O3) and interpreted.

-O0 and -O3 give the same bits for every format, activations in F32, F16 and BF16, one row
(a decode step) and several (a prefill, with a batch dim), a weight in its 16-column tiles and
one in GGUF's rows; a converted weight is `gguf.quants.dequantize`'s values bit for bit, and
so are the interpreter's; block-sums (a model's fast build) stays within 1e-6 of float64.
"""
from __future__ import annotations

import numpy as np
import pytest

import kina
from kina.driver.pipeline import Options
from kina.runtime.quant import QuantizedArray

gguf = pytest.importorskip("gguf")
import gguf_files  # noqa: E402

FORMATS = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"]
NARROW = {"Q4_1": ("F16",), "Q6_K": ("BF16",)}  # narrow activations against two formats
SUMS = ["Q4_1", "Q4_K", "Q6_K"]  # block-sums: a format with an offset, and the two K formats
K, N = 256, 80  # K a multiple of every block, N five tiles of 16


def matmuls(pairs) -> str:
    """One function f_T_FMT per (activation dtype, format), so that a level is one build for all."""
    return "".join(f"""
let f_{T}_{fmt} = fn(x: tensor<{T}, [B, P, K], @host>, w: tensor<{fmt}, [K, N], @host>) -> (tensor<{T}, [B, P, N], @host>) {{
  (x @ w)
}}
""" for T, fmt in pairs)


MATMULS = matmuls((T, fmt) for fmt in FORMATS for T in ("F32", *NARROW.get(fmt, ())))
MATMUL = """
let f = fn[T, U](x: tensor<T, [B, P, K], @host>, w: tensor<U, [K, N], @host>) -> (tensor<T, [B, P, N], @host>) {
  (x @ w)
}
"""
BOTH = """
let f = fn[U](x: tensor<F32, [1, K], @host>, w: tensor<U, [K, N], @host>) -> (tensor<F32, [1, N], @host>, tensor<F32, [K, N], @host>) {
  (x @ w, convert[dtype=F32] w)
}
"""
BOTHS = "".join(BOTH.replace("let f = fn[U]", f"let f_{fmt} = fn").replace("tensor<U,", f"tensor<{fmt},")
                for fmt in FORMATS)


def weight(fmt: str, seed: int = 0) -> QuantizedArray:
    values = np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32)
    return QuantizedArray(fmt, (K, N), np.ascontiguousarray(gguf_files.pack(values, fmt)))


def build(src: str, level: int, pass_options: str = "", **dtypes):
    return kina.compile_source(src, "quantized.kina", Options(opt_level=level, pass_options=pass_options),
                               dtypes=dtypes, dims={"K": K, "N": N})


@pytest.fixture(scope="module")
def levels():
    return build(MATMULS, 0), build(MATMULS, 3)


def k_order(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w summed over k in ascending order, a multiply then an add: the compiled code's order."""
    acc = np.zeros((x.shape[0], w.shape[1]), np.float32)
    for k in range(w.shape[0]):
        acc = acc + x[:, k:k + 1] * w[k:k + 1]
    return acc


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("fmt", FORMATS)
def test_o0_and_o3_give_the_same_bits(fmt, levels):
    """One row and a batch of rows, activations F32 (and F16 for a 32-element format, BF16 for a
    256-element one): the fused tiled loops are the reference's dequantize-then-matmul, bit for bit."""
    w = weight(fmt)
    rng = np.random.default_rng(1)
    o0, o3 = levels
    for T in ("F32", *NARROW.get(fmt, ())):
        dt = kina.runtime.numpy_dtype(T)
        f0, f3 = getattr(o0, f"f_{T}_{fmt}"), getattr(o3, f"f_{T}_{fmt}")
        assert f3.signature.layouts == (("w", "tiled16"),) and f0.signature.layouts == ()
        for shape in ((1, 1, K), (2, 5, K)):
            x = rng.standard_normal(shape).astype(dt)
            assert bits(f0(x, w)[0]) == bits(f3(x, w)[0]), (fmt, T, shape)


@pytest.fixture(scope="module")
def both():
    return build(BOTHS, 3), kina.interpret(BOTHS, dims={"K": K, "N": N})


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_converted_weight_is_ggufs_dequantization_and_the_matmul_reads_the_same_values(fmt, both):
    w = weight(fmt, seed=2)
    want = gguf.quants.dequantize(w.data, getattr(gguf.GGMLQuantizationType, fmt)).T  # [K, N]
    x = np.random.default_rng(3).standard_normal((1, K)).astype(np.float32)
    o3, interpreted = (getattr(m, f"f_{fmt}") for m in both)
    assert o3.signature.layouts == ()  # a convert reads it too: GGUF's rows, the fused matmul through them
    got3 = o3(x, w)
    assert bits(got3[1]) == bits(want.astype(np.float32))
    assert bits(got3[0]) == bits(k_order(x, want.astype(np.float32)))  # the fused loops over GGUF's rows
    ref = interpreted(x, w)
    assert bits(ref[1]) == bits(want.astype(np.float32))
    np.testing.assert_allclose(ref[0], got3[0], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def sums():
    return build(matmuls(("F32", fmt) for fmt in SUMS), 3, "quantized-matmul-loops{block-sums=true}")


@pytest.mark.parametrize("fmt", SUMS)
def test_block_sums_stay_within_1e_6_of_float64(fmt, sums):
    w = weight(fmt, seed=4)
    x = np.random.default_rng(5).standard_normal((2, 5, K)).astype(np.float32)
    got = getattr(sums, f"f_F32_{fmt}")(x, w)[0]
    want = x.astype(np.float64) @ w.dequantize().astype(np.float64)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-6


def test_calls_check_a_quantized_argument():
    f = build(MATMUL, 0, T="F32", U="Q8_0").f
    x = np.zeros((1, 1, K), np.float32)
    with pytest.raises(TypeError, match=r"parameter 'w' is Q8_0 \[256, 80\]: it takes a kina.runtime.QuantizedArray "
                                        r"of that format, got a float32 array"):
        f(x, np.zeros((K, N), np.float32))
    with pytest.raises(TypeError, match="parameter 'w' expects Q8_0 blocks, got Q4_0"):
        f(x, weight("Q4_0"))
    short = QuantizedArray("Q8_0", (K, 64), weight("Q8_0").data[:64])
    with pytest.raises(ValueError, match=r"parameter 'w' expects shape \[256, 80\], got \[256, 64\]"):
        f(x, short)
