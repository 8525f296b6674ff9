"""The dtype table is whole, as the op table is: every dtype of `kina.dtypes.DTYPES` goes through
every stage. One program with a function per dtype, `convert[dtype=F32]` of a parameter of that
dtype, is checked (the front end parses and types the name), lowered (its MLIR type), compiled at
-O0 and -O3 (the passes, LLVM), called (the runtime binds a NumPy array of the dtype, or for a
block format a `QuantizedArray`) and interpreted; each gives the dtype's values as F32 (NumPy's
conversion, or `gguf.quants.dequantize` for a block format). A dtype added to the table and missed
by a stage fails here by name.
"""
from __future__ import annotations

import numpy as np
import pytest

import kina
from kina import dtypes
from kina.driver.options import Options
from kina.runtime.quant import random_blocks

gguf = pytest.importorskip("gguf")

K, N = 256, 32  # K a multiple of every block
NAMES = list(dtypes.DTYPES)
SOURCE = "".join(f"""
let f_{name} = fn(x: tensor<{name}, [K, N], @host>) -> (tensor<F32, [K, N], @host>) {{
  (convert[dtype=F32] x)
}}
""" for name in NAMES)


@pytest.fixture(scope="module")
def programs():
    dims = {"K": K, "N": N}
    return {"-O0": kina.compile_source(SOURCE, "dtypes.kina", Options(opt_level=0), dims=dims),
            "-O3": kina.compile_source(SOURCE, "dtypes.kina", Options(opt_level=3), dims=dims),
            "interpreter": kina.interpret(SOURCE, dims=dims)}


def value_of(name: str, rng):
    """(an argument of dtype `name` [K, N], its values in F32 as NumPy or gguf reads them)."""
    d = dtypes.by_name(name)
    if d.blocked:
        q = random_blocks(name, (K, N), rng)
        return q, gguf.quants.dequantize(q.data, getattr(gguf.GGMLQuantizationType, name)).T.astype(np.float32)
    nd = kina.runtime.numpy_dtype(name)
    x = (rng.integers(-1000, 1000, (K, N)) if np.issubdtype(nd, np.integer) else
         rng.standard_normal((K, N)) * 100).astype(nd)
    return x, x.astype(np.float32)


@pytest.mark.parametrize("name", NAMES)
def test_every_dtype_goes_through_every_stage(name, programs):
    x, want = value_of(name, np.random.default_rng(NAMES.index(name)))
    for stage, program in programs.items():
        (got,) = getattr(program, f"f_{name}")(x)
        assert got.dtype == np.float32 and got.tobytes() == want.tobytes(), (name, stage)


def test_the_table_is_the_languages_list_of_dtypes():
    """The front end's dtype names are the table's (no stage keeps a list of its own)."""
    from kina.frontend import types
    assert list(types.DTYPES) == NAMES
