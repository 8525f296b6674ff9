"""Block-quantized arrays: a format's bytes with their logical shape, and their values.

In:  bytes in a block format of the dtype table (kina.dtypes: Q8_0, Q4_0, Q4_1, Q5_0, Q4_K,
     Q6_K), laid out as GGUF lays out a Linear's [N, K] weight (each row a run of blocks),
     and the logical shape [..., K, N] they stand for (blocked along K).
Out: `QuantizedArray`: `.dequantize()` (its values as float32 [..., K, N]), `.rows()` (the
     GGUF [..., N, K] values), `.tiled()` (its bytes in the layout the fused matmul loops
     read: `TILE` columns side by side, each block's bytes interleaved byte by byte, made once
     and kept); `quantized(values, dtype)` packs floats (Q8_0, Q4_0, Q4_1, Q5_0, through the
     `gguf` package's reference quantizers) for tests and tools; `dequantize_blocks`.

Guarantees: the values are the format's `element` of kina.dtypes evaluated with NumPy, in
the operations and order it states, so they equal `gguf.quants.dequantize` bit for bit
(tests/test_quant.py checks every format). Nothing here imports `mlir` or `lark`; the bytes
are never copied unless `tiled()` or a conversion asks for it (a memory map stays a map).
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes

TILE = 16  # columns a tiled block holds side by side: one vector of 16 F32 sums


class _NumPyBytes:
    """The byte reader of a format's `element`, over blocks [n, size] at once (dtypes' doc)."""

    def __init__(self, blocks: np.ndarray):
        self.blocks = blocks

    def u8(self, i):
        return self.blocks[:, i].astype(np.int32)

    def i8(self, i):
        return self.blocks[:, i].view(np.int8).astype(np.int32)

    def f16(self, i):
        return self.blocks[:, i:i + 2].copy().view(np.float16).astype(np.float32)

    @staticmethod
    def float(q):
        return np.asarray(q).astype(np.float32)

    @staticmethod
    def where(cond, x, y):
        return np.where(cond, x, y)

    @staticmethod
    def affine(a, q, c=None, minus=False):
        v = a * np.asarray(q).astype(np.float32)
        return v if c is None else v - c if minus else v + c


def dequantize_blocks(blocks: np.ndarray, dtype: str) -> np.ndarray:
    """float32 [n, block]: the values of n blocks of `dtype` (uint8 [n, size])."""
    d = dtypes.by_name(dtype)
    blocks = np.ascontiguousarray(blocks, np.uint8).reshape(-1, d.size)
    out = np.empty((blocks.shape[0], d.block), np.float32)
    j = np.arange(d.block)
    step = max(1, (1 << 22) // (d.block * 4))  # a few MiB of temporaries at a time
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, blocks.shape[0], step):
            out[lo:lo + step] = d.element(_NumPyBytes(blocks[lo:lo + step]), j)
    return out


class QuantizedArray:
    """A block-quantized tensor: `dtype` (a block format's name), `shape` (logical, [..., K, N],
    blocked along K) and `data`, uint8 [..., N, K / block * size] (GGUF's layout of [N, K]).

    It is what a Kina function's `tensor<Q4_1, [K, N], @host>` parameter takes: the runtime
    passes its bytes (or their tiled copy, when the build's matmul loops read that layout)."""

    def __init__(self, dtype: str, shape, data: np.ndarray):
        if dtype not in dtypes.BLOCKED:
            raise ValueError(f"dtype: {dtype!r} is not a block format: expected one of {', '.join(dtypes.BLOCKED)}")
        self.dtype = dtype
        self.format = dtypes.by_name(dtype)
        self.shape = tuple(int(n) for n in shape)
        if len(self.shape) < 2:
            raise ValueError(f"shape: a block-quantized tensor has rank >= 2 ([..., K, N]), got {list(self.shape)}")
        *batch, K, N = self.shape
        if K % self.format.block:
            raise ValueError(f"shape: {dtype} [{', '.join(map(str, self.shape))}] is blocked along dim "
                             f"{len(self.shape) - 2} (K = {K}), which must be a multiple of its "
                             f"{self.format.block}-element block")
        want = (*batch, N, K // self.format.block * self.format.size)
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.shape != want:
            got = f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__
            raise ValueError(f"data: expected uint8 {list(want)} (the {dtype} bytes of [{', '.join(map(str, self.shape))}]"
                             f", each of N = {N} rows {K // self.format.block} blocks), got {got}")
        self._data = data
        self._tiled = None

    @property
    def data(self) -> np.ndarray:
        """The bytes in GGUF's rows, uint8 [..., N, row bytes] (made again from the tiles when
        `settle` kept only those)."""
        if self._data is None:
            *batch, NT, R, T = self._tiled.shape
            rows = np.swapaxes(self._tiled, -1, -2).reshape(*batch, NT * T, R)
            return rows[..., :self.shape[-1], :]
        return self._data

    def row_bytes(self, columns) -> np.ndarray:
        """The bytes of `columns` (rows as GGUF stores them: an embedding table's rows), uint8
        [len(columns), row bytes], from whichever layout is held."""
        columns = np.asarray(columns)
        if self._data is not None:
            return self._data[..., columns, :]
        return self._tiled[..., columns // TILE, :, columns % TILE]

    def settle(self, layout: str | None) -> None:
        """Keep the bytes only in `layout` (None: GGUF's rows; "tiled16"): a model whose builds
        read its weights tiled drops the rows, so that a memory-mapped file's pages are
        released one tensor at a time as they are tiled."""
        if layout is not None:
            storage(self, layout)
            self._data = None

    def __repr__(self) -> str:
        return f"QuantizedArray({self.dtype}, [{', '.join(map(str, self.shape))}])"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self._tiled.nbytes if self._data is None else self._data.nbytes

    def rows(self) -> np.ndarray:
        """float32 [..., N, K]: the values as stored (GGUF's [out, in])."""
        *batch, K, N = self.shape
        return dequantize_blocks(self.data, self.dtype).reshape(*batch, N, K)

    def dequantize(self) -> np.ndarray:
        """float32 [..., K, N]: the tensor's values."""
        return np.swapaxes(self.rows(), -1, -2)

    def tiled(self) -> np.ndarray:
        """The bytes as the fused matmul loops read them, made once: uint8 [..., N / TILE, row
        bytes, TILE]: for each tile of TILE columns, byte i of every column's row side by side,
        so one vector load takes byte i of TILE columns (N is padded with zero columns to a
        multiple of TILE)."""
        if self._tiled is None:
            *batch, N, R = self._data.shape
            padded = -(-N // TILE) * TILE
            src = self._data
            if padded != N:
                src = np.concatenate([src, np.zeros((*batch, padded - N, R), np.uint8)], axis=-2)
            tiles = src.reshape(*batch, padded // TILE, TILE, R)
            self._tiled = np.ascontiguousarray(np.swapaxes(tiles, -1, -2))
        return self._tiled

    def permute_rows(self, order) -> "QuantizedArray":
        """The same tensor with its columns (stored rows) taken in `order`: whole rows of blocks move."""
        return QuantizedArray(self.dtype, self.shape, np.ascontiguousarray(self.data[..., order, :]))


def quantized(values: np.ndarray, dtype: str) -> QuantizedArray:
    """`values` [..., K, N] packed as `dtype` with the `gguf` package's reference quantizer
    (Q8_0, Q4_0, Q4_1, Q5_0; the K formats have none there: build their bytes and read them
    back). Needs the `gguf` package."""
    import gguf
    values = np.asarray(values, np.float32)
    rows = np.ascontiguousarray(np.swapaxes(values, -1, -2))
    data = gguf.quants.quantize(rows, getattr(gguf.GGMLQuantizationType, dtype))
    return QuantizedArray(dtype, values.shape, np.ascontiguousarray(data, np.uint8))


def random_blocks(dtype: str, shape, rng: np.random.Generator) -> QuantizedArray:
    """A QuantizedArray of `dtype` and logical `shape` of seeded random blocks: random bytes,
    each F16 field (scale or min) a finite value of either sign between 2^-9 and 2^-6, so that
    the values are of the order of 1 for every format."""
    fmt = dtypes.by_name(dtype)
    *batch, K, N = (int(n) for n in shape)
    data = rng.integers(0, 256, (*batch, N, K // fmt.block, fmt.size), dtype=np.uint8)
    for offset in fmt.f16_fields:
        scale = rng.uniform(2.0 ** -9, 2.0 ** -6, data.shape[:-1]) * rng.choice([-1.0, 1.0], data.shape[:-1])
        data[..., offset:offset + 2] = scale.astype(np.float16)[..., None].view(np.uint8)
    return QuantizedArray(dtype, shape, data.reshape(*batch, N, K // fmt.block * fmt.size))


def storage(a: QuantizedArray, layout: str | None) -> np.ndarray:
    """`a`'s bytes as a function whose parameter takes `layout` wants them: GGUF's rows (None),
    or "tiled16", [..., N / 16, row bytes * 16] (`tiled`, made once)."""
    if layout is None:
        return a.data
    if layout != f"tiled{TILE}":
        raise ValueError(f"layout: {layout!r} is not one Kina's runtime makes (None or 'tiled{TILE}')")
    t = a.tiled()
    return t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1])


def nbytes(dtype: str, shape) -> int:
    """Bytes of a tensor of `dtype` and logical `shape`."""
    return dtypes.by_name(dtype).nbytes(math.prod(shape))
