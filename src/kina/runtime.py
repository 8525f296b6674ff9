"""Load a kinac-built .so through its sidecar and call it with NumPy arrays.

In:  a .so built by kinac and its sidecar `<name>.json` (function signatures).
Out: a `Module` whose attributes are callable `Function`s: arrays in, a tuple of
     new arrays out.

Guarantees: before every call the arguments are checked against the signature
(count, type, dtype, rank, shape, and that every symbolic dim binds to one
value); a mismatch is a TypeError or ValueError naming the parameter, never a
crash. Inputs are never modified. Views are passed as they are (the compiled
code takes any outer strides); only an array whose innermost stride is not one
element, or that is misaligned, is copied first. Results, whatever their size,
are allocated here with NumPy, starting on a 64-byte boundary (`empty`), and
filled by the callee (out-params), so NumPy owns and frees them.
This module imports neither `mlir` nor `lark`.

Calling convention (what `kinac` emits): `_mlir_ciface_kina_<fn>(in_0*, ..., out_0*, ...)`
where each pointer is a memref descriptor {allocated, aligned, offset, sizes[r], strides[r]}
(all int64; one call's descriptors are packed back to back in one buffer).
"""
from __future__ import annotations

import array
import ctypes
import hashlib
import itertools
import json
import os
from pathlib import Path

import numpy as np

from .toolchain import cpu_flags
from .types import DTYPES, Dim, Signature, TensorType


class LoadError(ValueError):
    """A .so that cannot be used: missing or mismatched sidecar, wrong CPU, missing symbol."""


def passable(a: np.ndarray) -> bool:
    """Can `a` be passed as it is? The compiled code takes any outer strides (in whole
    elements) but assumes the innermost one is 1, so that its inner loops vectorise."""
    if a.size == 0:  # nothing is read or written; NumPy gives empty arrays stride 0
        return True
    strides, it = a.strides, a.itemsize
    if not a.flags.aligned:
        return False
    for s in strides:
        if s % it:
            return False
    return not strides or strides[-1] == it or a.shape[-1] <= 1


def as_passable(a: np.ndarray) -> np.ndarray:
    """`a` itself if `passable`, else a new C-ordered, aligned copy (of the same rank, 0 included)."""
    return a if passable(a) else np.array(a, order="C")


ALIGN = 64  # bytes: a cache line, and what the compiled code's non-temporal vector stores need


def _aligned(allocate, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    raw = allocate(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def empty(shape, dtype=np.float32) -> np.ndarray:
    """Like `np.empty`, but the data starts on an `ALIGN`-byte boundary (NumPy's own
    large arrays start 16 bytes past a page). Results are allocated this way: rows
    that start on a cache line are read with whole-line loads and written with
    non-temporal stores, which is what the compiled kernels' fast paths need."""
    return _aligned(np.empty, shape, dtype)


def zeros(shape, dtype=np.float32) -> np.ndarray:
    """`empty`, zero-filled lazily, as `np.zeros` is: untouched pages cost no memory."""
    return _aligned(np.zeros, shape, dtype)


def _descriptor_words(arrays) -> array.array:
    """The memref descriptors of `arrays`, back to back as int64 words: per array
    {allocated, aligned, offset, sizes[r], strides[r]}, strides in elements."""
    words = []
    for a in arrays:
        p, it = a.ctypes.data, a.itemsize
        words += (p, p, 0, *a.shape, *[s // it for s in a.strides[:-1]])
        if a.ndim:
            words.append(1)
    return array.array("q", words)


def numpy_dtype(dtype: str) -> np.dtype | None:
    name = DTYPES[dtype][1]
    return np.dtype(name) if name else None


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
        self._temporaries = sig.temporaries
        self._need: dict[tuple, int] = {}

    def need(self, env: dict[str, int]) -> int:
        """Bytes of all intermediates at `env` (whose keys come in the same order every call)."""
        key = tuple(env.values())
        n = self._need.get(key)
        if n is None:
            if len(self._need) >= 1024:
                self._need.clear()
            n = self._need[key] = sum(t.nbytes(env) for t in self._temporaries)
        return n


def check_plan(sig: Signature) -> CheckPlan:
    return CheckPlan(sig)


def bind(sig: Signature, args: tuple, plan: CheckPlan | None = None) -> tuple[list[np.ndarray], dict[str, int]]:
    """Check `args` against `sig`; return them passable (see `passable`), with the value of every dim name."""
    plan = plan or CheckPlan(sig)
    name, params = sig.name, plan.params
    if len(args) != len(params):
        names = ", ".join(n for n, _ in sig.params)
        raise TypeError(f"{name}() takes {len(params)} arguments ({names}), got {len(args)}")
    arrays, env, where = [], {}, {}
    for (pname, t, want, static, symbols, _), a in zip(params, args):
        if want is None:
            raise TypeError(f"{name}(): parameter '{pname}' is {t.dtype}, which NumPy cannot represent")
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name}(): parameter '{pname}' expects a numpy.ndarray of {want} with shape "
                            f"{t.shape_str()}, got {type(a).__name__}")
        if a.dtype != want:
            raise TypeError(f"{name}(): parameter '{pname}' expects dtype {want} ({t.dtype}), got {a.dtype}")
        shape = a.shape
        if len(shape) != t.rank:
            raise ValueError(f"{name}(): parameter '{pname}' expects rank {t.rank} {t.shape_str()}, "
                             f"got rank {a.ndim} with shape {list(shape)}")
        for axis, value in static:
            if shape[axis] != value:
                raise ValueError(f"{name}(): parameter '{pname}' expects shape {t.shape_str()}, "
                                 f"got {list(shape)} (dim {axis} is {shape[axis]}, expected {value})")
        for axis, sym in symbols:
            n = shape[axis]
            if sym in env and env[sym] != n:
                raise ValueError(f"{name}(): dim {sym} is {env[sym]} from {where[sym]} but {n} from {pname} (dim {axis})")
            env[sym], where[sym] = n, pname
        arrays.append(as_passable(a))
    for (pname, *_, compound), a in zip(params, arrays):  # compound dims like S+1 in a parameter
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
    return arrays, env


def result_shapes(sig: Signature, env: dict[str, int]) -> list[tuple[int, ...]]:
    return [tuple(d.evaluate(env) for d in t.dims) for t in sig.results]


class Function:
    """One compiled Kina function; call it with NumPy arrays."""

    def __init__(self, module: "Module", sig: Signature, cfunc):
        self._module, self.signature, self._cfunc = module, sig, cfunc
        self.__name__ = sig.name
        self._plan = CheckPlan(sig)
        # every argument is a pointer to its memref descriptor, at a fixed offset in one buffer
        ranks = [t.rank for _, t in sig.params] + [t.rank for t in sig.results]
        self._offsets = list(itertools.accumulate((8 * (3 + 2 * r) for r in ranks), initial=0))[:len(ranks)]
        cfunc.restype, cfunc.argtypes = None, [ctypes.c_void_p] * len(ranks)
        self._result_dtypes = [numpy_dtype(t.dtype) for t in sig.results]

    def __repr__(self) -> str:
        params = ", ".join(f"{n}: {t}" for n, t in self.signature.params)
        return f"<kina function {self.__name__}({params}) -> ({', '.join(map(str, self.signature.results))})>"

    def __call__(self, *args) -> tuple[np.ndarray, ...]:
        """Check the arguments, allocate the results, run; returns the results."""
        arrays, env = self._bind(args)
        outs = [empty(shape, dtype) for shape, dtype in zip(result_shapes(self.signature, env), self._result_dtypes)]
        self._call(arrays, outs)
        return tuple(outs)

    def call_into(self, args, outs) -> None:
        """Like calling, but the results are written into `outs` (arrays of the result
        shapes and dtypes, writable, unit innermost stride; views are fine). Every
        argument and out is checked; an out may not overlap an input or another out."""
        arrays, env = self._bind(args)
        name, shapes = self.__name__, result_shapes(self.signature, env)
        if not isinstance(outs, (list, tuple)) or len(outs) != len(shapes):
            raise TypeError(f"{name}(): outs must be a list of {len(shapes)} arrays, got {outs!r:.60}")
        for i, (o, shape, dtype) in enumerate(zip(outs, shapes, self._result_dtypes)):
            if not isinstance(o, np.ndarray) or o.dtype != dtype or o.shape != shape:
                got = f"{o.dtype} {list(o.shape)}" if isinstance(o, np.ndarray) else type(o).__name__
                raise ValueError(f"{name}(): out {i} must be a {dtype} array of shape {list(shape)}, got {got}")
            if not (o.flags.writeable and passable(o)):
                raise ValueError(f"{name}(): out {i} must be writable, with unit innermost stride")
            for other in [*args, *outs[:i]]:
                if isinstance(other, np.ndarray) and np.shares_memory(o, other):
                    raise ValueError(f"{name}(): out {i} overlaps another argument or out")
        self._call(arrays, list(outs))

    def _bind(self, args):
        if self._module.closed:
            raise ValueError(f"{self.__name__}(): the module {self._module.path.name} is closed")
        return bind(self.signature, args, self._plan)

    def _call(self, arrays: list[np.ndarray], outs: list[np.ndarray]) -> None:
        """The raw call, unchecked: `arrays` from `bind`, `outs` exactly as `call_into` requires.
        Benchmarks use it to time the kernel alone, and KVCache, which checks its own
        arguments; anything else should call or `call_into`."""
        if self._module.closed:
            raise ValueError(f"{self.__name__}(): the module {self._module.path.name} is closed")
        words = _descriptor_words((*arrays, *outs))
        base = words.buffer_info()[0]
        self._cfunc(*[base + offset for offset in self._offsets])


class Module:
    """A loaded .so: one attribute per Kina function. Use `close()` or `with`."""

    def __init__(self, path: Path, sidecar: dict):
        self.path, self.sidecar, self.closed = path, sidecar, False
        try:
            self._lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise LoadError(f"{path}: cannot be loaded: {e}") from None
        self.functions: dict[str, Function] = {}
        for obj in sidecar["functions"]:
            sig = Signature.from_json(obj)
            try:
                cfunc = getattr(self._lib, f"_mlir_ciface_kina_{sig.name}")
            except AttributeError:
                raise LoadError(f"{path}: sidecar lists function '{sig.name}' but the .so has no "
                                f"_mlir_ciface_kina_{sig.name}") from None
            self.functions[sig.name] = Function(self, sig, cfunc)

    def __repr__(self) -> str:
        state = "closed" if self.closed else ", ".join(self.functions)
        return f"<kina module {self.path.name}: {state}>"

    def __getattr__(self, name: str) -> Function:
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"module {self.__dict__.get('path')} has no function {name!r} "
                             f"(it has: {', '.join(functions) or 'none'})")

    def __dir__(self):
        return [*super().__dir__(), *self.functions]

    def close(self) -> None:
        """Unload the .so; any later call raises ValueError instead of crashing."""
        if not self.closed:
            self.closed = True
            handle, self._lib = self._lib._handle, None
            import _ctypes
            _ctypes.dlclose(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load(path: str | Path) -> Module:
    """Load a kinac output (.so) through the sidecar beside it."""
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"{path}: no such shared object")
    sidecar_path = path.with_suffix(".json")
    if not sidecar_path.is_file():
        raise LoadError(f"{path}: its sidecar {sidecar_path.name} is missing; rebuild with kinac")
    try:
        sidecar = json.loads(sidecar_path.read_text())
        if sidecar.get("format") != "kina-sidecar-1":
            raise ValueError(f"unknown format {sidecar.get('format')!r}")
        for obj in sidecar["functions"]:
            Signature.from_json(obj)
    except (ValueError, KeyError, TypeError) as e:
        raise LoadError(f"{sidecar_path}: not a valid kina sidecar ({e})") from None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if sidecar.get("so_sha256") != digest:
        raise LoadError(f"{sidecar_path.name} does not match {path.name}: it describes another build; rebuild with kinac")
    missing = sorted(set(sidecar.get("cpu_flags", [])) - set(cpu_flags()))
    if missing:
        raise LoadError(f"{path.name} was built for CPU {sidecar.get('cpu')} and uses {', '.join(missing)}, "
                        f"which this CPU lacks; rebuild here, or with --cpu x86-64 for a portable .so")
    return Module(path, sidecar)


__all__ = ["Module", "Function", "LoadError", "load", "Dim", "TensorType"]
