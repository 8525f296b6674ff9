"""Arguments checked against a function's signature, before every call.

In:  a `Signature` (from the sidecar) and a call's arguments.
Out: `bind`: the arguments as passable NumPy arrays (`kina.runtime.arrays`) and the value
     of every dim name; `result_shapes` at those values. `CheckPlan` is what `bind` checks
     for one signature, worked out once.

Guarantees: every argument is checked for count, type, dtype, rank and shape, and every
symbolic dim binds to one value (compound dims like S+1 included); a mismatch is a
TypeError or ValueError naming the parameter, never a crash. A block-quantized parameter
takes a `QuantizedArray` of its format, checked against its logical shape, and is passed
as its bytes in the layout the build chose (`Signature.layouts`: `quant.storage`). Sizes whose intermediates
could not fit in this machine's memory (`MEMORY_BYTES`) are refused, since the compiled
code cannot report a failed allocation.
"""
from __future__ import annotations

import os

import numpy as np

from ..frontend.types import Signature
from .arrays import as_ndarray, as_passable, numpy_dtype
from .quant import QuantizedArray, storage


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


MEMORY_BYTES = _memory_bytes()


class CheckPlan:
    """What `bind` checks for one signature, worked out once: per parameter its
    dtype, static dims, dim names and compound dims (like S+1); and, memoised per
    binding of the dim names, the bytes its intermediates need."""

    def __init__(self, sig: Signature):
        self.params = []
        for pname, t in sig.params:
            static = tuple((a, d.const) for a, d in enumerate(t.dims) if d.is_static)
            symbols = tuple((a, d.symbol) for a, d in enumerate(t.dims) if d.symbol)
            compound = tuple((a, d) for a, d in enumerate(t.dims) if not d.is_static and not d.symbol)
            self.params.append((pname, t, numpy_dtype(t.dtype), static, symbols, compound))
        self._sig, self._temporaries = sig, sig.temporaries
        self._memo: dict[tuple, tuple] = {}

    def need(self, env: dict[str, int]) -> int:
        """Bytes of all intermediates at `env` (whose keys come in the same order every call)."""
        return self._at(env)[0]

    def result_shapes(self, env: dict[str, int]) -> list[tuple[int, ...]]:
        """The result shapes at `env`."""
        return self._at(env)[1]

    def _at(self, env: dict[str, int]) -> tuple[int, list[tuple[int, ...]]]:
        key = tuple(env.values())
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= 1024:
                self._memo.clear()
            found = self._memo[key] = (sum(t.nbytes(env) for t in self._temporaries),
                                       result_shapes(self._sig, env))
        return found


def bind(sig: Signature, args: tuple, plan: CheckPlan | None = None) -> tuple[list[np.ndarray], dict[str, int]]:
    """Check `args` against `sig`; return them as passable NumPy arrays (see `as_ndarray` and
    `passable`; a QuantizedArray as its bytes, `quant.storage`), with the value of every dim name."""
    plan = plan or CheckPlan(sig)
    name, params = sig.name, plan.params
    if len(args) != len(params):
        names = ", ".join(n for n, _ in sig.params)
        raise TypeError(f"{name}() takes {len(params)} arguments ({names}), got {len(args)}")
    checked, env, where = [], {}, {}
    for (pname, t, want, static, symbols, _), a in zip(params, args):
        if t.is_blocked:
            a = _quantized(name, pname, t, a)
        else:
            if not isinstance(a, np.ndarray):
                a = as_ndarray(a, t, f"{name}(): parameter '{pname}'")
            if a.dtype != want:
                raise TypeError(f"{name}(): parameter '{pname}' expects dtype {want} ({t.dtype}), got {a.dtype}")
        shape = a.shape
        if len(shape) != t.rank:
            raise ValueError(f"{name}(): parameter '{pname}' expects rank {t.rank} {t.shape_str()}, "
                             f"got rank {len(shape)} with shape {list(shape)}")
        for axis, value in static:
            if shape[axis] != value:
                raise ValueError(f"{name}(): parameter '{pname}' expects shape {t.shape_str()}, "
                                 f"got {list(shape)} (dim {axis} is {shape[axis]}, expected {value})")
        for axis, sym in symbols:
            n = shape[axis]
            if sym in env and env[sym] != n:
                raise ValueError(f"{name}(): dim {sym} is {env[sym]} from {where[sym]} but {n} from {pname} (dim {axis})")
            env[sym], where[sym] = n, pname
        checked.append(a)
    for (pname, *_, compound), a in zip(params, checked):  # compound dims like S+1 in a parameter
        for axis, d in compound:
            if d.evaluate(env) != a.shape[axis]:
                raise ValueError(f"{name}(): parameter '{pname}' dim {axis} must be {d} = {d.evaluate(env)}, "
                                 f"got {a.shape[axis]}")
    # The compiled code cannot report a failed allocation, so refuse sizes whose
    # intermediates could not all fit in this machine's memory.
    need = plan.need(env)
    if need > MEMORY_BYTES:
        sizes = ", ".join(f"{k}={v}" for k, v in env.items()) or "these static sizes"
        raise ValueError(f"{name}(): at {sizes} its intermediate tensors need {need} bytes, "
                         f"more than this machine's {MEMORY_BYTES} bytes of memory")
    arrays = [storage(a, sig.layout(pname)) if isinstance(a, QuantizedArray) else as_passable(a)
              for (pname, *_), a in zip(params, checked)]
    return arrays, env


def _quantized(fname: str, pname: str, t, a) -> QuantizedArray:
    """A block-quantized parameter's argument: a QuantizedArray of its format."""
    if not isinstance(a, QuantizedArray):
        got = f"a {a.dtype} array" if isinstance(a, np.ndarray) else type(a).__name__
        raise TypeError(f"{fname}(): parameter '{pname}' is {t.dtype} {t.shape_str()}: it takes a "
                        f"kina.runtime.QuantizedArray of that format, got {got}")
    if a.dtype != t.dtype:
        raise TypeError(f"{fname}(): parameter '{pname}' expects {t.dtype} blocks, got {a.dtype}")
    return a


def result_shapes(sig: Signature, env: dict[str, int]) -> list[tuple[int, ...]]:
    return [tuple(d.evaluate(env) for d in t.dims) for t in sig.results]
