"""Block formats (kina.dtypes, kina.runtime.quant): every format's values equal the `gguf`
package's dequantization bit for bit, and a QuantizedArray says what it holds."""
from __future__ import annotations

import numpy as np
import pytest

from kina import dtypes
from kina.runtime.quant import TILE, QuantizedArray, dequantize_blocks, quantized

gguf = pytest.importorskip("gguf")

FORMATS = list(dtypes.BLOCKED)
SCALES = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def random_blocks(name: str, n: int, seed: int = 0, finite: bool = True) -> np.ndarray:
    """n blocks of random bytes; with `finite`, every F16 field a finite value of either sign."""
    d = dtypes.by_name(name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, d.size), dtype=np.uint8)
    if finite:
        for off in SCALES[name]:
            raw[:, off:off + 2] = rng.uniform(-2, 2, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(np.asarray(a, np.float32).view(np.uint32),
                                                 np.asarray(b, np.float32).view(np.uint32))


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_is_gguf_s_dequantization_bit_for_bit(name):
    """Random bytes, scales finite and not: the same values, the same NaN and infinity positions."""
    d = dtypes.by_name(name)
    for finite in (True, False):
        raw = random_blocks(name, 3000, seed=len(name) + finite, finite=finite)
        with np.errstate(all="ignore"):
            want = gguf.quants.dequantize(raw.reshape(-1), getattr(gguf.GGMLQuantizationType, name))
        got = dequantize_blocks(raw, name)
        assert got.shape == (3000, d.block)
        assert same_bits(got.reshape(-1), want.reshape(-1)), name


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0"])
def test_packed_floats_read_back_as_gguf_reads_them(name):
    values = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32)  # [K, N]
    q = quantized(values, name)
    assert q.shape == (64, 96) and q.data.shape == (96, 64 // 32 * dtypes.by_name(name).size)
    want = gguf.quants.dequantize(q.data, getattr(gguf.GGMLQuantizationType, name))  # [N, K], as stored
    assert same_bits(q.rows(), want) and same_bits(q.dequantize(), want.T)
    assert np.abs(q.dequantize() - values).max() < 0.5  # it is the values, quantized


def test_the_tiled_layout_puts_byte_i_of_16_columns_side_by_side():
    raw = random_blocks("Q4_1", 40 * 3).reshape(40, 3 * 20)  # N = 40 columns (padded to 48), K = 96
    q = QuantizedArray("Q4_1", (96, 40), raw)
    tiled = q.tiled()
    assert tiled.shape == (3, 60, TILE) and q.tiled() is tiled  # made once
    for n in (0, 15, 16, 39):
        np.testing.assert_array_equal(tiled[n // TILE, :, n % TILE], raw[n])
    assert not tiled[2, :, 8:].any()  # the padding columns are zeros


def test_permuted_rows_move_whole_blocks():
    raw = random_blocks("Q8_0", 8 * 2).reshape(8, 68)
    q = QuantizedArray("Q8_0", (64, 8), raw)
    order = [7, 0, 3, 1, 2, 6, 5, 4]
    assert same_bits(q.permute_rows(order).rows(), q.rows()[order])


@pytest.mark.parametrize("args, words", [
    (("F32", (32, 4), np.zeros((4, 34), np.uint8)), "is not a block format"),
    (("Q8_0", (32,), np.zeros((1, 34), np.uint8)), "rank >= 2"),
    (("Q8_0", (48, 4), np.zeros((4, 51), np.uint8)), "blocked along dim 0 (K = 48), which must be a multiple"),
    (("Q4_K", (32, 4), np.zeros((4, 18), np.uint8)), "of its 256-element block"),
    (("Q8_0", (64, 4), np.zeros((4, 34), np.uint8)), "expected uint8 [4, 68]"),
    (("Q8_0", (64, 4), np.zeros((4, 68), np.int8)), "got int8"),
])
def test_bad_quantized_arrays_say_what_was_expected(args, words):
    with pytest.raises(ValueError) as e:
        QuantizedArray(*args)
    assert words in str(e.value)


def test_the_dtype_table_knows_every_spelling():
    """Each float dtype has its MLIR, NumPy, safetensors, GGUF and config spellings; each block
    format its GGUF type, block and size as ggml has them (gguf.GGML_QUANT_SIZES)."""
    for d in dtypes.DTYPES.values():
        assert dtypes.by_name(d.name) is d
        if d.gguf:
            assert dtypes.by_gguf(d.gguf) is d
        if d.blocked:
            assert gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, d.name)] == (d.block, d.size)
            assert d.mlir == "i8" and d.numpy == "uint8" and d.wide == "F32" and d.element is not None
            assert d.f16_fields == SCALES[d.name]  # read off the formula, as ggml-common.h lays them out
            assert d.offset == (d.name in ("Q4_1", "Q4_K"))  # a min added to the scaled quant
        else:
            assert dtypes.by_safetensors(d.safetensors) is d and dtypes.by_hf(d.hf) is d
            assert dtypes.by_numpy(d.numpy) is d
