"""Kina's types: dtypes, symbolic dims and tensor types.

In:  dtype and placement names, dims written as integers, names or sums of them.
Out: frozen, hashable values: `Dim` (an affine form `c + a*X + b*Y ...`) and
     `TensorType(dtype, dims, placement)`.

Guarantees: a leaf module but for the dtype table (kina.dtypes, a leaf itself; no `lark` or
`mlir` imports), so the runtime can evaluate the symbolic result shapes recorded in a sidecar. Dims are kept in
a normal form, so two dims are equal exactly when `==` says so, and `str(dim)`
round-trips through `Dim.parse`.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .. import dtypes as _table

# Read from the dtype table (kina.dtypes), which says everything else of each dtype.
# dtype name -> (MLIR element type, NumPy dtype name, is floating); a block format's are its storage's
DTYPES: dict[str, tuple[str, str, bool]] = {d.name: (d.mlir, d.numpy, d.floating) for d in _table.DTYPES.values()}
PLACEMENTS = ("host", "device")
DTYPE_BYTES = {d.name: d.size for d in _table.DTYPES.values()}  # a block format's: per block
BLOCKS = {d.name: (d.block, d.size) for d in _table.DTYPES.values() if d.blocked}  # elements and bytes a block
# floating dtype -> (significand bits, exponent of its smallest subnormal, largest finite value)
FLOAT_FORMATS = {d.name: d.float_format for d in _table.DTYPES.values() if d.float_format}


def nearest(dtype: str, value: int | float) -> int | float:
    """`value` as an element of `dtype`: for a floating dtype, the nearest value (ties to
    even, rounded once, as a Python float that holds it exactly); for an integer dtype,
    `value` itself as an int. A number the dtype cannot hold (too large, not finite, or
    not an integer for I32/I64) is a ValueError saying why."""
    if not DTYPES[dtype][2]:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value} is not an integer")
        bits = DTYPE_BYTES[dtype] * 8
        if not -(1 << (bits - 1)) <= int(value) < 1 << (bits - 1):
            raise ValueError(f"{value} is out of the range of {dtype} ({-(1 << (bits - 1))} to {(1 << (bits - 1)) - 1})")
        return int(value)
    digits, tiny, largest = FLOAT_FORMATS[dtype]
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v) or abs(v) > 2 * largest:
        raise ValueError(f"{value} is too large for {dtype} (its largest finite value is {largest:g})")
    if v == 0 or dtype == "F64":
        return v
    quantum = max(math.frexp(v)[1] - digits, tiny)  # the exponent of v's last significant bit
    rounded = math.copysign(math.ldexp(round(math.ldexp(v, -quantum)), quantum), v)  # round(): ties to even
    if abs(rounded) > largest:
        raise ValueError(f"{value} is too large for {dtype} (its largest finite value is {largest:g})")
    return rounded


@dataclass(frozen=True)
class Dim:
    """An affine dim: `const + sum(coeff * name)`, terms sorted by name, no zero coeffs."""

    const: int = 0
    terms: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def of(value: "int | str | Dim") -> "Dim":
        if isinstance(value, Dim):
            return value
        if isinstance(value, int):
            return Dim(value)
        return Dim(0, ((value, 1),))

    @property
    def is_static(self) -> bool:
        return not self.terms

    @property
    def symbol(self) -> str | None:
        """The name, when this dim is exactly one name (so it can bind that name)."""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0]
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.terms)

    def __add__(self, other: "Dim | int") -> "Dim":
        other = Dim.of(other)
        coeffs = dict(self.terms)
        for name, c in other.terms:
            coeffs[name] = coeffs.get(name, 0) + c
        return Dim(self.const + other.const, tuple(sorted((n, c) for n, c in coeffs.items() if c)))

    def evaluate(self, env: dict[str, int]) -> int:
        return self.const + sum(c * env[n] for n, c in self.terms)

    def substitute(self, values: Mapping[str, int | Dim]) -> "Dim":
        """This dim with each name in `values` replaced by its value, an int or itself a dim,
        all at once: S+1 with S=128 is 129, and with S=T+1 (a caller's dim) it is T+2."""
        out = Dim(self.const)
        for name, c in self.terms:
            value = Dim.of(values[name]) if name in values else Dim(0, ((name, 1),))
            out = out + Dim(value.const * c, tuple((n, k * c) for n, k in value.terms))
        return out

    def __str__(self) -> str:
        # a coefficient is written as repeated names (S+S), the only form the grammar has
        parts = [name for name, c in self.terms for _ in range(c)] if all(c > 0 for _, c in self.terms) \
            else [name if c == 1 else f"{c}*{name}" for name, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return "+".join(parts)

    @staticmethod
    def parse(text: str) -> "Dim":
        """Inverse of `str`: '4', 'S', 'S+1', '2*S+N+3'."""
        dim = Dim()
        for term in text.replace(" ", "").split("+"):
            m = re.fullmatch(r"(?:(\d+)\*)?([A-Za-z_]\w*)|(\d+)", term)
            if not m:
                raise ValueError(f"not a dim: {text!r}")
            dim = dim + (int(m.group(3)) if m.group(3) else Dim(0, ((m.group(2), int(m.group(1) or 1)),)))
        return dim


@dataclass(frozen=True)
class TensorType:
    dtype: str
    dims: tuple[Dim, ...]
    placement: str = "host"

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def is_float(self) -> bool:
        return DTYPES[self.dtype][2]

    @property
    def is_blocked(self) -> bool:
        """A block-quantized format (Q4_1, ...): blocked along dim -2, stored as GGUF's [..., N, K] rows."""
        return self.dtype in BLOCKS

    @property
    def is_static(self) -> bool:
        return all(d.is_static for d in self.dims)

    def shape_str(self) -> str:
        return "[" + ", ".join(str(d) for d in self.dims) + "]"

    def __str__(self) -> str:
        return f"tensor<{self.dtype}, {self.shape_str()}, @{self.placement}>"

    def nbytes(self, env: dict[str, int] | None = None) -> int:
        """Bytes of a tensor of this type, with the dim names' values from `env` (a block
        format's: its whole blocks)."""
        n = 1
        for d in self.dims:
            n *= d.evaluate(env or {})
        block, size = BLOCKS.get(self.dtype, (1, DTYPE_BYTES[self.dtype]))
        return n // block * size

    def storage_dims(self, layout: str | None = None) -> tuple["Dim", ...]:
        """The dims of what holds it: its own, or a block format's bytes [..., N, K / block * size]
        (GGUF's rows: each of the N columns a run of the K / block blocks along dim -2); in the
        layout "tiled16" (fuse-dequant-matmul's), [..., N / 16, K / block * size * 16]."""
        if not self.is_blocked:
            return self.dims
        block, size = BLOCKS[self.dtype]
        *batch, K, N = self.dims
        row = K.const // block * size
        if layout is None:
            return (*batch, N, Dim(row))
        tile = int(layout.removeprefix("tiled"))
        return (*batch, Dim(N.const // tile), Dim(row * tile))

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "dims": [str(d) for d in self.dims], "placement": self.placement}

    @staticmethod
    def from_json(obj: dict) -> "TensorType":
        return TensorType(obj["dtype"], tuple(Dim.parse(d) for d in obj["dims"]), obj["placement"])


@dataclass(frozen=True)
class Signature:
    """A compiled function's interface: what the runtime checks every call against.

    `temporaries` are the types of every intermediate the function computes, so the
    runtime can refuse a call whose sizes could not be allocated (the compiled code
    cannot report a failed allocation)."""

    name: str
    params: tuple[tuple[str, TensorType], ...]
    results: tuple[TensorType, ...]
    temporaries: tuple[TensorType, ...] = ()
    layouts: tuple[tuple[str, str], ...] = ()  # a block-quantized parameter's bytes' layout, if not GGUF's rows

    def layout(self, param: str) -> str | None:
        return dict(self.layouts).get(param)

    def storage_types(self) -> tuple[TensorType, ...]:
        """Each parameter's type as the compiled code takes it: a block format's, its bytes'
        dims in its layout (`TensorType.storage_dims`), the dtype kept (its NumPy one is uint8)."""
        return tuple(TensorType(t.dtype, t.storage_dims(self.layout(n)), t.placement) if t.is_blocked else t
                     for n, t in self.params)

    def to_json(self) -> dict:
        out = {"name": self.name,
               "params": [{"name": n, **t.to_json()} for n, t in self.params],
               "results": [t.to_json() for t in self.results],
               "temporaries": [t.to_json() for t in self.temporaries]}
        if self.layouts:
            out["layouts"] = dict(self.layouts)
        return out

    @staticmethod
    def from_json(obj: dict) -> "Signature":
        return Signature(obj["name"], tuple((p["name"], TensorType.from_json(p)) for p in obj["params"]),
                         tuple(TensorType.from_json(r) for r in obj["results"]),
                         tuple(TensorType.from_json(t) for t in obj.get("temporaries", ())),
                         tuple(sorted(obj.get("layouts", {}).items())))

