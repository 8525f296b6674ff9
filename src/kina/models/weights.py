"""A decoder's weights: checked once, against its family's layout, and held aligned.

In:  a mapping of arrays by the decoder's names (`layers.{i}.wq`, `embed`, ...: a family's
     `Family.layout`), or a `.npz`/`.safetensors` file of them; the build's dtypes.
Out: `check(weights, layout, dtype, weight_dtype)`: the arrays, each exactly as the layout
     says, 64-byte aligned (views of one block of huge pages, kina.runtime.arena), optional
     ones absent given as zeros; `random(layout, seed, ...)`: seeded weights; `read(path)`.

Guarantees: a missing, unexpected or wrong tensor (name, shape, dtype) is a ValueError
(TypeError for a dtype) naming it, and so is one holding NaN or infinity unless
`allow_nonfinite`. Nothing is converted: the caller (a checkpoint reader, or the user)
gives each tensor in its dtype: the vectors (gains, biases) in `dtype`, the matrices
(projections, embedding table, head) in `weight_dtype`.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Mapping

import numpy as np

from .. import files, runtime
from ..runtime import arena
from ..runtime.pool import data_pointer
from ..runtime.quant import QuantizedArray


def dtype_of(tensor, dtype: np.dtype, weight_dtype: np.dtype | None) -> np.dtype:
    """The dtype a weight is held in: a matrix `weight_dtype` (None: `dtype`), a vector (gain, bias) `dtype`."""
    return weight_dtype if tensor.matrix and weight_dtype is not None else dtype


def matrix_dtypes(dtype: np.dtype) -> tuple[np.dtype, ...]:
    """The float dtypes a matrix may have against activations of `dtype` (weight_dtype None):
    `dtype`, or F16 or BF16 against F32 (a mixed matmul widens each weight exactly). BF16 only once
    ml_dtypes is loaded: before, no array is BF16, and loading it takes 0.5-1.3 s."""
    if dtype == np.float32:
        bf16 = (runtime.numpy_dtype("BF16"),) if "ml_dtypes" in sys.modules else ()
        return dtype, np.dtype(np.float16), *bf16
    return (dtype,)


def random(layout, seed: int, dtype, weight_dtype=None) -> dict[str, np.ndarray]:
    """Seeded weights: N(0, 1) embeddings, gains near 1, small biases, N(0, 1/fan_in) matrices;
    the matrices in `weight_dtype` (default `dtype`): another dtype's model of the same seed
    has the same values, rounded once. Optional tensors (absent biases) are left out."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (t, shape) in layout.items():
        if t.optional:
            continue
        if t.name == "embed":
            a = rng.standard_normal(shape)
        elif t.name in ("bq", "bk", "bv", "bo"):
            a = 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / math.sqrt(shape[0])
        out[name] = a.astype(dtype_of(t, dtype, weight_dtype or dtype))
    return out


def read(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a `.npz` or `.safetensors` file, by name (not yet checked); a damaged
    file is a `kina.files.FileError` naming it."""
    path = Path(path)
    if path.suffix not in (".npz", ".safetensors"):
        raise ValueError(f"weights: expected a .npz or .safetensors file, got {str(path)!r}")
    if path.suffix == ".safetensors":
        return files.read_safetensors(path, "weights")
    return files.read_npz(path, "weights")


def check(weights: Mapping[str, np.ndarray], layout, dtype: np.dtype, weight_dtype: np.dtype | None,
          copy: bool = True, allow_nonfinite: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of `layout` (name -> (Tensor, shape)), checked and aligned; see the module doc.
    With `copy=False` (arrays the caller made and gives up) an array that is already
    C-contiguous and aligned is kept as it is. With `weight_dtype` None each matrix may be
    any of `matrix_dtypes(dtype)` or a block-quantized `runtime.QuantizedArray` (of its shape;
    the embedding table's as the head reads it, [d_model, vocab_size]), kept as it is."""
    def expected(name):
        t, shape = layout[name]
        return f"[{', '.join(map(str, shape))}] ([{', '.join(t.dims)}])"

    missing = [name for name, (t, _) in layout.items() if name not in weights and not t.optional]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"weights: tensor {missing[0]!r} is missing{more}; expected shape {expected(missing[0])}")
    extra = [name for name in weights if name not in layout]
    if extra:
        raise ValueError(f"weights: unexpected tensor {extra[0]!r}: not a weight of this model "
                         f"(its family's layout lists them: kina.models.families)")
    present = [name for name in layout if name in weights]
    quantized = {}
    for name in present:
        t, shape = layout[name]
        a = weights[name]
        if isinstance(a, QuantizedArray) and t.matrix and weight_dtype is None:
            want = shape[::-1] if name == "embed" else shape
            if a.shape != want:
                raise ValueError(f"weights: tensor {name!r} is {a.dtype} of shape {list(a.shape)}, expected "
                                 f"{list(want)}")
            if dtype not in matrix_dtypes(np.dtype(np.float32)):
                raise TypeError(f"weights: tensor {name!r} is {a.dtype}: block-quantized weights take activations of "
                                f"dtype float32, float16 or bfloat16, not {dtype}")
            quantized[name] = a
            continue
        if not isinstance(a, np.ndarray):
            raise TypeError(f"weights: tensor {name!r} must be a numpy.ndarray, got {type(a).__name__}")
        want = dtype_of(t, dtype, weight_dtype)
        whose = "weight_dtype" if t.matrix and weight_dtype not in (None, dtype) else "dtype"
        if t.matrix and weight_dtype is None and a.dtype in matrix_dtypes(dtype):
            want = a.dtype
        if a.dtype != want:
            raise TypeError(f"weights: tensor {name!r} has dtype {a.dtype}, expected {want}, the model's {whose} "
                            f"(nothing is converted on load)")
        if a.shape != shape:
            raise ValueError(f"weights: tensor {name!r} has shape {list(a.shape)}, expected {expected(name)}")
        if not allow_nonfinite and not np.isfinite(a).all():
            bad = ~np.isfinite(a)
            raise ValueError(f"weights: tensor {name!r} holds NaN or infinity ({int(bad.sum())} of {a.size} values, "
                             f"the first at index {[int(i) for i in np.argwhere(bad)[0]]}); pass "
                             "allow_nonfinite=True to load it anyway")
    kept = {name: weights[name] for name in present if name in quantized or not copy
            and weights[name].flags.c_contiguous and data_pointer(weights[name]) % runtime.ALIGN == 0}
    made = [n for n in present if n not in kept]
    zeros = [n for n in layout if n not in weights]
    block = arena.arrays({**{n: (weights[n].shape, weights[n].dtype) for n in made},
                          **{n: (layout[n][1], dtype_of(layout[n][0], dtype, weight_dtype)) for n in zeros}})
    for name in made:
        block[name][...] = weights[name]
    for name in zeros:
        block[name][...] = 0
    return {name: kept[name] if name in kept else block[name] for name in layout}


def require_finite(a: np.ndarray, what: str, remedy: str, stored: np.ndarray | None = None) -> None:
    """A ValueError naming `what` if `a` holds NaN or infinity: how many, the first index, and
    whether `stored` (what `a` was converted from) held them or the conversion overflowed."""
    bad = ~np.isfinite(a)
    if not bad.any():
        return
    first = [int(i) for i in np.argwhere(bad)[0]]
    if stored is not None and np.isfinite(stored).all():
        how = f"overflows {a.dtype} (a value past its range)"
    else:
        how = "holds NaN or infinity"
    raise ValueError(f"{what} {how}: {int(bad.sum())} of {a.size} values are not finite, the first at index "
                     f"{first}; {remedy}")
