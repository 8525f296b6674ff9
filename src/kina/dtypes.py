"""The dtype table: every element type Kina knows, defined once.

In:  nothing (a leaf: it imports nothing from kina, nor NumPy or MLIR: types are named as text).
Out: `DTYPES`, one `DType` per name, in the order the language lists them; `by_name`,
     `by_numpy`, `by_safetensors`, `by_gguf`, `by_hf` lookups; `BLOCKED`, the block formats.

A dtype's record says what every stage needs of it:

    name         the language's spelling (tensor<Q4_1, ...>)
    mlir         the MLIR element type (f16, bf16, f32, ...); a block format's storage, i8
    numpy        the NumPy dtype's name (bfloat16: ml_dtypes'); a block format's storage, uint8
    size         bytes per element, or per block for a block format
    block        elements per block (1: not blocked)
    floating     a float (or a block format, whose values are floats)
    wide         the dtype its arithmetic runs in where an op is `wide` (F16, BF16 and blocks: F32)
    float_format (significand bits, exponent of the smallest subnormal, largest finite) of a float
    safetensors, gguf, hf   its spellings in safetensors headers, GGUF files (the ggml type) and
                 Hugging Face configs (`torch_dtype`), where it has one
    element      a block format's value: `element(b, j)` is element j (0 <= j < block) of one
                 block whose bytes `b` reads (below); the only definition of the format

A block format's `element` is written against a byte reader `b` with `b.u8(i)`, `b.i8(i)`,
`b.f16(i)` (two bytes, little-endian, widened to F32), integer operators (& | >> << - %
//), `b.float(q)` (an integer as F32) and `b.where(cond, x, y)`, and F32 `*`, `+`, `-`; it
returns `b.affine(a, q, c)`, a * float(q) + c (c optional; `minus=True`: - c), with a and c
the same for every element of a `group`. The same function runs on NumPy arrays (the runtime's dequantization and the interpreter), on
MLIR scalars (the reference lowering) and on MLIR vectors of 16 columns (the fused matmul
loops), so the three cannot disagree; tests check it against the `gguf` package's
`gguf.quants.dequantize`, bit for bit, for every format. Every format's value is an exact
product of its scale and its quant plus at most one rounded add, as llama.cpp's reference
dequantization computes it in F32.

A block-quantized tensor `tensor<Q, [..., K, N]>` is blocked along K, its second-to-last
dim (the contraction dim of a matmul's rhs): it is stored as GGUF stores a Linear's
[N, K] weight, each of its N columns a run of K / block blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class DType:
    name: str
    mlir: str
    numpy: str
    size: int
    floating: bool
    wide: str | None = None
    block: int = 1
    float_format: tuple[int, int, float] | None = None
    safetensors: str | None = None
    gguf: str | None = None
    hf: str | None = None
    element: Callable | None = None
    group: int = 0  # a block format's elements that share one scale and offset (`affine`'s a and c)

    @property
    def blocked(self) -> bool:
        return self.block > 1

    def nbytes(self, elements: int) -> int:
        """Bytes of `elements` values (a whole number of blocks for a block format)."""
        return elements // self.block * self.size

    @property
    def offset(self) -> bool:
        """Does a block format's element add an offset to its scaled quant (`affine`'s c: Q4_1's
        min, Q4_K's), rather than scale it alone? Read off `element`."""
        trace = _Trace(set())
        for j in range(self.block):
            self.element(trace, j)
        return trace.offset

    def bytes_read(self, j: int) -> tuple[int, ...]:
        """The byte offsets element `j` of a block reads besides the F16 fields (its quants and
        packed scales), from its `element`, in ascending order."""
        read: set[int] = set()
        self.element(_Trace(set(), read), j)
        return tuple(sorted(read))

    @property
    def f16_fields(self) -> tuple[int, ...]:
        """The byte offsets of a block format's F16 fields (its scales and mins), read off its
        `element` (every element traced once); () for other dtypes."""
        if not self.blocked:
            return ()
        seen: set[int] = set()
        for j in range(self.block):
            self.element(_Trace(seen), j)
        return tuple(sorted(seen))


class _Trace:
    """A byte reader that records which offsets `f16` reads (DType.f16_fields) and which `u8` and
    `i8` read (DType.bytes_read): every byte 0."""

    def __init__(self, seen: set, read: set | None = None):
        self.seen, self.read = seen, set() if read is None else read

    def f16(self, i):
        self.seen.add(i)
        return 0.0

    def u8(self, i):
        self.read.add(i)
        return 0

    i8 = u8
    float = staticmethod(float)
    where = staticmethod(lambda cond, x, y: x if cond else y)
    def affine(self, a, q, c=None, minus=False):
        self.offset = self.offset or c is not None
        return 0.0

    offset = False


# -- the block formats' values (GGUF's layouts: ggml-common.h, ggml-quants.c) ----------------

def q4_0(b, j):
    """d: f16 at 0; 16 bytes of nibbles at 2, element j in byte j % 16 (low nibble for j < 16); d * (q - 8)."""
    q = (b.u8(2 + j % 16) >> (4 * (j // 16))) & 15
    return b.affine(b.f16(0), q - 8)


def q4_1(b, j):
    """d, m: f16 at 0 and 2; nibbles at 4 as Q4_0's; d * q + m."""
    q = (b.u8(4 + j % 16) >> (4 * (j // 16))) & 15
    return b.affine(b.f16(0), q, b.f16(2))


def q5_0(b, j):
    """d: f16 at 0; the 32 fifth bits at 2 (bit j of a little-endian u32); low nibbles at 6; d * (q - 16)."""
    low = (b.u8(6 + j % 16) >> (4 * (j // 16))) & 15
    high = (b.u8(2 + j // 8) >> (j % 8)) & 1
    return b.affine(b.f16(0), (low | (high << 4)) - 16)


def q8_0(b, j):
    """d: f16 at 0; 32 signed bytes at 2; d * q."""
    return b.affine(b.f16(0), b.i8(2 + j))


def q4_k(b, j):
    """A super-block of 256: d, dmin f16 at 0 and 2; 8 sub-blocks of 32, each with a 6-bit scale
    and min packed in the 12 bytes at 4; nibbles at 16, each 64 elements' 32 bytes holding two
    sub-blocks (the low nibbles, then the high). d * sc * q - dmin * m."""
    s = j // 32
    q = (b.u8(16 + 32 * (j // 64) + j % 32) >> (4 * (s % 2))) & 15
    low = s < 4
    sc = b.where(low, b.u8(4 + s % 4) & 63, (b.u8(12 + s % 4) & 15) | ((b.u8(4 + s % 4) >> 6) << 4))
    m = b.where(low, b.u8(8 + s % 4) & 63, (b.u8(12 + s % 4) >> 4) | ((b.u8(8 + s % 4) >> 6) << 4))
    return b.affine(b.f16(0) * b.float(sc), q, b.f16(2) * b.float(m), minus=True)


def q6_k(b, j):
    """A super-block of 256: low nibbles (128 bytes) at 0, high 2 bits (64 bytes) at 128, 16
    signed 8-bit scales at 192, d: f16 at 208. Each half of 128 elements has 64 bytes of
    nibbles and 32 of high bits; within it, quarter r of 32 reads nibble byte l + 32 (r % 2)
    (shifted by 4 (r // 2)) and high bits byte l (shifted by 2 r). d * sc * (q - 32)."""
    h, r, l = j // 128, (j % 128) // 32, j % 32
    low = (b.u8(64 * h + 32 * (r % 2) + l) >> (4 * (r // 2))) & 15
    high = (b.u8(128 + 32 * h + l) >> (2 * r)) & 3
    return b.affine(b.f16(208) * b.float(b.i8(192 + 8 * h + (j % 128) // 16)), (low | (high << 4)) - 32)


# -- the table ------------------------------------------------------------------------------

_FLOATS = [
    DType("F16", "f16", "float16", 2, True, "F32", float_format=(11, -24, 65504.0), safetensors="F16", gguf="F16",
          hf="float16"),
    DType("BF16", "bf16", "bfloat16", 2, True, "F32", float_format=(8, -133, 3.3895313892515355e38),
          safetensors="BF16", gguf="BF16", hf="bfloat16"),
    DType("F32", "f32", "float32", 4, True, float_format=(24, -149, 3.4028234663852886e38), safetensors="F32",
          gguf="F32", hf="float32"),
    DType("F64", "f64", "float64", 8, True, float_format=(53, -1074, 1.7976931348623157e308), safetensors="F64",
          gguf="F64", hf="float64"),
    DType("I32", "i32", "int32", 4, False, safetensors="I32", gguf="I32", hf="int32"),
    DType("I64", "i64", "int64", 8, False, safetensors="I64", gguf="I64", hf="int64"),
]
_BLOCKS = [
    DType("Q8_0", "i8", "uint8", 34, True, "F32", block=32, gguf="Q8_0", element=q8_0, group=32),
    DType("Q4_0", "i8", "uint8", 18, True, "F32", block=32, gguf="Q4_0", element=q4_0, group=32),
    DType("Q4_1", "i8", "uint8", 20, True, "F32", block=32, gguf="Q4_1", element=q4_1, group=32),
    DType("Q5_0", "i8", "uint8", 22, True, "F32", block=32, gguf="Q5_0", element=q5_0, group=32),
    DType("Q4_K", "i8", "uint8", 144, True, "F32", block=256, gguf="Q4_K", element=q4_k, group=32),
    DType("Q6_K", "i8", "uint8", 210, True, "F32", block=256, gguf="Q6_K", element=q6_k, group=16),
]
DTYPES: dict[str, DType] = {d.name: d for d in _FLOATS + _BLOCKS}
BLOCKED = tuple(d.name for d in _BLOCKS)


def by_name(name: str) -> DType:
    return DTYPES[name]


def by_numpy(name: str) -> DType | None:
    """The unblocked dtype whose NumPy dtype is called `name` ("float32", "bfloat16")."""
    return next((d for d in _FLOATS if d.numpy == name), None)


def by_safetensors(code: str) -> DType | None:
    return next((d for d in DTYPES.values() if d.safetensors == code), None)


def by_gguf(name: str) -> DType | None:
    return next((d for d in DTYPES.values() if d.gguf == name), None)


def by_hf(name: str) -> DType | None:
    return next((d for d in DTYPES.values() if d.hf == name), None)
