"""Load a kinac-built .so through its sidecar and call it with arrays.

In:  a .so built by kinac and its sidecar `<name>.json` (function signatures).
Out: a `Module` whose attributes are callable `Function`s: arrays in, a tuple of
     new NumPy arrays out.

Guarantees: before every call the arguments are checked against the signature
(count, type, dtype, rank, shape, and that every symbolic dim binds to one
value); a mismatch is a TypeError or ValueError naming the parameter, never a
crash. An argument may be a NumPy array, anything that speaks DLPack
(`__dlpack__`: CPU torch tensors, JAX arrays) or the array interface
(`__array__`, `__array_interface__`), or a nested list (see `as_ndarray`).
Arrays are never converted to another dtype, and are read in place: DLPack and
array-interface objects become NumPy views of the caller's memory. Inputs are
never modified. Views are passed as they are (the compiled code takes any outer
strides); only an array whose innermost stride is not one element, or that is
misaligned, is copied first. Results, whatever their size, are allocated here
as NumPy arrays starting on a 64-byte boundary and filled by the callee
(out-params); large ones reuse the memory of dead results (`kina.runtime.pool`:
bounded, `release_memory()` returns it). A large call of a function with
independent leading axes runs on `threads` threads (KINA_NUM_THREADS, default
the machine's cores), bit-identical to one; for such a call the calling thread is
bound off the worker threads' cores and then given its own binding back
(`kina.runtime.workers`). BF16 is `ml_dtypes.bfloat16`.
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
import math
import numbers
import os
import threading
from pathlib import Path

import numpy as np

from .. import abi, knobs
from ..frontend.types import DTYPES, Dim, Signature, TensorType
from . import workers
from .cpu import cpu_flags
from .pool import Pool, data_pointer


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
RESULTS = Pool()  # where calls allocate their results (see kina.runtime.pool)


def release_memory() -> int:
    """Return the memory kept for reusing results to the system; returns how many bytes."""
    return RESULTS.release()


def set_memory_limit(nbytes: int) -> None:
    """Keep at most `nbytes` of freed results for reuse (default kina.runtime.pool.DEFAULT_LIMIT)."""
    RESULTS.set_limit(nbytes)


def _aligned(allocate, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    nbytes = dtype.itemsize * math.prod(shape)
    raw = allocate(nbytes + ALIGN, np.uint8)
    start = -data_pointer(raw) % ALIGN
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
    """The memref descriptors of `arrays` (passable: unit innermost stride), back to back
    as int64 words: per array {allocated, aligned, offset, sizes[r], strides[r]}, strides
    in elements."""
    words = []
    add = words.extend
    for a in arrays:
        p, it = data_pointer(a), a.itemsize
        add((p, p, 0, *a.shape))
        if a.ndim:  # the innermost stride is 1 in every Kina memref type (passable: 1, or a length <= 1)
            add([s // it for s in a.strides[:-1]])
            words.append(1)
    return array.array("q", words)


# Kina dtype -> NumPy dtype; BF16's comes from ml_dtypes, imported the first time it is
# asked for (importing it costs about half a second, which every kinac start would pay)
_NUMPY_DTYPES = {name: np.dtype(np_name) for name, (_, np_name, _) in DTYPES.items() if np_name != "bfloat16"}


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of a Kina dtype name (BF16 is `ml_dtypes.bfloat16`)."""
    if dtype not in _NUMPY_DTYPES and dtype in DTYPES:
        import ml_dtypes  # what makes NumPy know bfloat16
        _NUMPY_DTYPES[dtype] = np.dtype(ml_dtypes.bfloat16)
    return _NUMPY_DTYPES[dtype]


# DLPack device types (dlpack.h) whose memory the host reads directly, as NumPy's from_dlpack does
_HOST_DEVICES = {1, 3, 11, 13}  # kDLCPU, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged
_DEVICE_NAMES = {2: "cuda", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi", 10: "rocm", 12: "ext_dev",
                 14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia"}


def as_ndarray(a, t: TensorType, where: str) -> np.ndarray:
    """`a`, which is not an ndarray, as one for a parameter of type `t`; errors start with `where`.

    - DLPack (`__dlpack__`) and array-interface (`__array__`, `__array_interface__`,
      `__array_struct__`) objects become NumPy views of their own memory, with their
      own dtype: nothing is copied or converted here (the caller checks the dtype).
      A DLPack object on a device the host cannot read, or a tensor that requires
      grad, is a ValueError. A torch bfloat16 tensor, which NumPy's DLPack import
      does not know, is viewed as `ml_dtypes.bfloat16`, still without a copy.
    - Nested lists (and tuples, and bare Python numbers), which have no dtype of
      their own, are read by NumPy and converted to `t`'s dtype: to a floating dtype
      each number rounds to the nearest value, as `np.asarray(x, dtype)`,
      `torch.tensor` and `jnp.array` do, but a finite number too large for it is a
      ValueError; to an integer dtype only exact values pass (2.0 does, 2.5 or an
      out-of-range int is a ValueError). A ragged list is a ValueError.
    - Anything else is a TypeError.
    """
    if hasattr(a, "__dlpack__"):
        return _from_dlpack(a, t, where)
    if any(hasattr(a, p) for p in ("__array_interface__", "__array_struct__", "__array__")):
        try:
            return np.asarray(a)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{where} got a {type(a).__name__} that NumPy cannot read as an array ({e})") from None
    if isinstance(a, (list, tuple, int, float)):
        return _from_numbers(a, t, where)
    raise TypeError(f"{where} expects an array of {numpy_dtype(t.dtype)} with shape {t.shape_str()} (NumPy, DLPack, "
                    f"the array interface or a nested list), got {type(a).__name__}")


def _from_dlpack(a, t: TensorType, where: str) -> np.ndarray:
    if hasattr(a, "__dlpack_device__"):
        try:
            kind, index = a.__dlpack_device__()
            kind = int(kind)
            device = None if kind in _HOST_DEVICES else f"device {_DEVICE_NAMES.get(kind, kind)}:{index}"
        except (TypeError, ValueError, RuntimeError) as e:  # torch's meta device, for one
            device = f"a device that DLPack cannot describe ({e})"
        if device is not None:
            raise ValueError(f"{where} is on {device}, but Kina runs on the host: "
                             f"copy it to the CPU first (for a torch tensor, .cpu())")
    if getattr(a, "requires_grad", False) is True:
        raise ValueError(f"{where} is a tensor that requires grad; Kina does not track gradients: "
                         f"pass .detach() (a view of the same memory)")
    if str(getattr(a, "dtype", "")) == "torch.bfloat16":  # the same bits as int16, viewed as bfloat16
        import torch
        return np.from_dlpack(a.view(torch.int16)).view(numpy_dtype("BF16"))
    try:
        return np.from_dlpack(a)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        if hasattr(a, "__array__"):  # e.g. a JAX bfloat16 array: NumPy reads it as ml_dtypes.bfloat16
            try:
                return np.asarray(a)
            except (TypeError, ValueError, RuntimeError):
                pass
        raise TypeError(f"{where} expects dtype {numpy_dtype(t.dtype)} ({t.dtype}), got a {type(a).__name__} "
                        f"of dtype {getattr(a, 'dtype', '?')}, which NumPy cannot import ({e})") from None


def _from_numbers(a, t: TensorType, where: str) -> np.ndarray:
    want, what = numpy_dtype(t.dtype), type(a).__name__
    try:
        values = np.asarray(a)
    except ValueError as e:  # ragged nesting
        raise ValueError(f"{where} got a {what} that is not a regular nest of numbers ({e})") from None
    if values.dtype.kind not in "biuf":
        raise TypeError(f"{where} expects numbers for {want} ({t.dtype}), got a {what} that NumPy reads as "
                        f"{values.dtype}")
    with np.errstate(all="ignore"):
        out = values.astype(want)
        if t.is_float:  # (bfloat16's NumPy kind is "V", not "f")
            lost = np.isinf(out) & np.isfinite(values)  # rounding is expected; overflow is not
        else:
            lost = out.astype(values.dtype) != values  # truncated, wrapped or NaN
    if lost.any():
        bad = values[lost].flat[0].item()
        raise ValueError(f"{where} expects {want} ({t.dtype}), got a {what} holding {bad!r}, "
                         f"which {want} cannot represent" + ("" if t.is_float else " exactly"))
    return out


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
    `passable`), with the value of every dim name."""
    plan = plan or CheckPlan(sig)
    name, params = sig.name, plan.params
    if len(args) != len(params):
        names = ", ".join(n for n, _ in sig.params)
        raise TypeError(f"{name}() takes {len(params)} arguments ({names}), got {len(args)}")
    arrays, env, where = [], {}, {}
    for (pname, t, want, static, symbols, _), a in zip(params, args):
        if not isinstance(a, np.ndarray):
            a = as_ndarray(a, t, f"{name}(): parameter '{pname}'")
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


def default_threads() -> int:
    """KINA_NUM_THREADS if set, else the cores this process may run on."""
    threads = knobs.get("KINA_NUM_THREADS")
    if threads is not None:
        return threads
    cpus = workers.cpus()
    return len(cpus) if cpus else os.cpu_count() or 1


# A call moving less than this runs on one thread: a split pays a fixed hand-over
# (mostly waking the other core), which a call moving fewer bytes does not earn back.
# The measurements behind the value: docs/performance.md, "Splitting a call across
# threads". How the parts run: kina.runtime.workers.
PARALLEL_MIN_BYTES = 16 << 20


def _check_threads(name: str, threads) -> int:
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{name}(): threads must be a positive integer, got {threads!r}")
    return threads


class Function:
    """One compiled Kina function; call it with arrays (see `bind`), get NumPy arrays back.

    Large calls run on several threads when the function has independent leading
    axes (`kina.frontend.axes`: batch and heads, for attention): the kernel is called on
    parts along one of them, with bit-identical results for any thread count."""

    def __init__(self, module: "Module", sig: Signature, cfunc, independent_axes: int = 0, threaded=None,
                 packed=None):
        self._module, self.signature, self._cfunc = module, sig, cfunc
        # kina_<f>_packed(args) (team-entries), the body taking its descriptor pointers as one array, or None
        self._packed = ctypes.cast(packed, ctypes.c_void_p).value if packed is not None else None
        self.independent_axes = independent_axes
        # (entry, workspace sizing, counters' size or None, team entry or None) of the threaded entry
        # (kina.ir.passes.threads; the team entry from team-entries), or None
        self.threaded = threaded is not None
        self._threaded, self._workspace_bytes, counters, team_entry = threaded or (None, None, None, None)
        self._team_entry = ctypes.cast(team_entry, ctypes.c_void_p) if team_entry is not None else None
        self._workspaces = threading.local()  # one workspace per calling thread
        self.__name__ = sig.name
        self._plan = CheckPlan(sig)
        # every argument is a pointer to its memref descriptor, at a fixed offset in one buffer
        ranks = [t.rank for _, t in sig.params] + [t.rank for t in sig.results]
        self._offsets = list(itertools.accumulate((8 * (3 + 2 * r) for r in ranks), initial=0))[:len(ranks)]
        cfunc.restype, cfunc.argtypes = None, [ctypes.c_void_p] * len(ranks)
        if threaded:
            self._threaded.restype = None
            self._threaded.argtypes = [ctypes.c_void_p] * len(ranks) + [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
            self._workspace_bytes.restype, self._workspace_bytes.argtypes = ctypes.c_int64, [ctypes.c_void_p] * len(ranks)
        self._counter_bytes = None  # the workspace's bytes to zero before a call (None: all of them)
        if counters is not None:
            counters.restype, counters.argtypes = ctypes.c_int64, []
            self._counter_bytes = counters()
        self._result_dtypes = [numpy_dtype(t.dtype) for t in sig.results]

    def __repr__(self) -> str:
        params = ", ".join(f"{n}: {t}" for n, t in self.signature.params)
        return f"<kina function {self.__name__}({params}) -> ({', '.join(map(str, self.signature.results))})>"

    def __call__(self, *args, threads: int | None = None) -> tuple[np.ndarray, ...]:
        """Check the arguments, allocate the results, run; returns the results.

        Results are NumPy arrays; large ones reuse the memory of dead results
        (`kina.runtime.pool`), so a steady loop touches no fresh pages. `threads` (default
        `default_threads()`) bounds the threads a large call may use."""
        threads = _check_threads(self.__name__, threads)
        arrays, env = self._bind(args)
        outs = [RESULTS.empty(shape, dtype) for shape, dtype in zip(self._plan.result_shapes(env),
                                                                    self._result_dtypes)]
        self.call_unchecked(arrays, outs, threads)
        return tuple(outs)

    def call_into(self, args, outs, threads: int | None = None) -> None:
        """Like calling, but the results are written into `outs` (arrays of the result
        shapes and dtypes, writable, unit innermost stride; views are fine). Every
        argument and out is checked; an out may not overlap an input or another out."""
        arrays, env = self._bind(args)
        name, shapes = self.__name__, self._plan.result_shapes(env)
        if not isinstance(outs, (list, tuple)) or len(outs) != len(shapes):
            raise TypeError(f"{name}(): outs must be a list of {len(shapes)} arrays, got {outs!r:.60}")
        for i, (o, shape, dtype) in enumerate(zip(outs, shapes, self._result_dtypes)):
            if not isinstance(o, np.ndarray) or o.dtype != dtype or o.shape != shape:
                got = f"{o.dtype} {list(o.shape)}" if isinstance(o, np.ndarray) else type(o).__name__
                raise ValueError(f"{name}(): out {i} must be a {dtype} array of shape {list(shape)}, got {got}")
            if not (o.flags.writeable and passable(o)):
                raise ValueError(f"{name}(): out {i} must be writable, with unit innermost stride")
            # the caller's own arrays (not the copies bind may have made), or bind's views of
            # their memory for DLPack and array-interface arguments
            for other in [*(a if isinstance(a, np.ndarray) else b for a, b in zip(args, arrays)), *outs[:i]]:
                if np.shares_memory(o, other):
                    raise ValueError(f"{name}(): out {i} overlaps another argument or out")
        self.call_unchecked(arrays, list(outs), _check_threads(name, threads))

    def _bind(self, args):
        if self._module.closed:
            raise ValueError(f"{self.__name__}(): the module {self._module.path.name} is closed")
        return bind(self.signature, args, self._plan)

    def call_unchecked(self, arrays: list[np.ndarray], outs: list[np.ndarray], threads: int = 1) -> None:
        """Run the kernel on `arrays` (NumPy arrays as `bind` returns them), writing `outs`
        (NumPy arrays as `call_into` requires them); nothing is returned.

        It checks only that the module is open. It does NOT check the argument count,
        types, dtypes, ranks, shapes or symbolic dims, that intermediates fit in memory,
        that each array is passable (aligned, unit innermost stride: see `passable`),
        nor that the outs are writable, of the result shapes and free of overlap. A wrong
        argument is undefined behaviour: wrong numbers, or a crash. It exists for callers
        that have checked everything themselves and call often: `kina.models.KVCache`
        (which builds its own arguments), and benchmarks that `bind` once and then time
        the kernel alone. Everyone else calls the function or uses `call_into`.

        With `threads` > 1 a call large enough (PARALLEL_MIN_BYTES) is split along an
        independent leading axis into up to `threads` parts, run concurrently (ctypes
        releases the GIL); the results are the same bits."""
        if self._module.closed:
            raise ValueError(f"{self.__name__}(): the module {self._module.path.name} is closed")
        parts = self._parts(arrays, outs, threads) if threads > 1 and self.independent_axes else None
        if parts is None:
            if threads > 1 and self.threaded and \
                    sum(a.nbytes for a in (*arrays, *outs)) >= THREADED_MIN_BYTES:
                words = _descriptor_words((*arrays, *outs))
                workspace = getattr(self._workspaces, "one", None)
                if workspace is None:
                    workspace = self._workspaces.one = Workspace()
                return self._run_threaded(self._pointers(words), threads, workspace)
            return self._run(arrays, outs)
        # every part's descriptors are built here, so the workers run the kernel and nothing else
        words = [_descriptor_words((*a, *o)) for a, o, _ in parts]
        workers.run_concurrently(self._cfunc, [self._pointers(w) for w in words])

    def prepare(self, arrays: list[np.ndarray], outs: list[np.ndarray], dims=(), threads: int = 1) -> "PreparedCall":
        """A call on fixed buffers whose descriptors are built once, whose `dims` (names
        of the signature's dims) `set_dims` may change (see PreparedCall). Unlike
        `call_unchecked`, the buffers are checked, once, here, and bound every patch.
        With `threads` > 1 and a threaded entry, every call runs on that many threads
        (whatever its size)."""
        return PreparedCall(self, arrays, outs, dims, _check_threads(self.__name__, threads))

    def _run_threaded(self, pointers: list[int], threads: int, workspace: "Workspace", args=None,
                      need: int | None = None) -> None:
        """The threaded entry on `threads` threads (this one and workers), each with its id,
        sharing `workspace`, grown first to `need` bytes (default: what this call's sizes
        need, asked of the entry); `args`, if given, is `pointers` as the ctypes array the
        team entry takes (a prepared call's)."""
        if need is None:
            need = self._workspace_bytes(*pointers)
        descriptor = workspace.fit(need, self._counter_bytes)
        if self._team_entry is not None:
            if args is None:
                args = (ctypes.c_void_p * len(pointers))(*pointers)
            if self._module.team(threads - 1).run(self._team_entry, args, threads, descriptor):
                return
        workers.run_concurrently(self._threaded, [[*pointers, t, threads, descriptor] for t in range(threads)])

    def _pointers(self, words: array.array) -> list[int]:
        """The call's arguments: a pointer to each descriptor in `words`."""
        base = words.buffer_info()[0]
        return [base + offset for offset in self._offsets]

    def _run(self, arrays, outs) -> None:
        words = _descriptor_words((*arrays, *outs))
        self._cfunc(*self._pointers(words))

    def _parts(self, arrays, outs, threads: int):
        """`split`, or None when the call moves less than PARALLEL_MIN_BYTES."""
        if sum(a.nbytes for a in (*arrays, *outs)) < PARALLEL_MIN_BYTES:
            return None
        return self.split(arrays, outs, threads)

    def split(self, arrays, outs, threads: int):
        """(arrays, outs, where) per part along the first independent axis of length 2 or
        more, in up to `threads` parts: views, and the part's index into an array of the
        call's full rank; None if there is no such axis."""
        every = [*arrays, *outs]
        rank = max(a.ndim for a in every)
        for axis in range(self.independent_axes):
            n = max(a.shape[axis - (rank - a.ndim)] if axis - (rank - a.ndim) >= 0 else 1 for a in every)
            if n < 2:
                continue
            bounds = [n * i // min(threads, n) for i in range(min(threads, n) + 1)]

            def part(a, lo, hi):
                ax = axis - (rank - a.ndim)
                if ax < 0 or a.shape[ax] != n:
                    return a  # shared along this axis (size 1, or absent)
                return a[(slice(None),) * ax + (slice(lo, hi),)]
            return [([part(a, lo, hi) for a in arrays], [part(o, lo, hi) for o in outs],
                     (slice(None),) * axis + (slice(lo, hi),)) for lo, hi in zip(bounds, bounds[1:])]
        return None


# A call of a threaded function moving less than this runs on one thread (the hand-over
# to the workers costs more than the split saves); a prepared call with `threads` > 1
# always runs on them. With the team's workers spinning between calls, two threads were
# level with one at 217-257 KiB and 1.1-1.35x faster from 327 KiB up (one-row matmuls and
# adds over copies beyond the cache, on the 2-core Intel VM; docs/performance.md, "Calls of
# a third of a MiB on every core"). It was 1 MiB when a hand-over woke the workers.
THREADED_MIN_BYTES = 384 << 10


class Workspace:
    """The memory the threads of one threaded call share: the counters of its tasks, then
    its temporaries; the counters are zeroed before each call (they must start at 0). It grows,
    never shrinks; calls that may run at once need workspaces of their own."""

    def __init__(self):
        self._buffer, self._words, self.capacity = None, array.array("q", [0] * 5), 0

    @property
    def descriptor(self) -> int:
        """A pointer to its memref<?xi8> descriptor (the same one for its life: growing rewrites it)."""
        return self._words.buffer_info()[0]

    def reserve(self, nbytes: int) -> bool:
        """At least `nbytes` bytes, zeroed if new; True if it grew."""
        if nbytes <= self.capacity:
            return False
        self.capacity = max(int(nbytes), 2 * self.capacity)
        self._buffer = zeros(self.capacity, np.uint8)
        p = data_pointer(self._buffer)
        self._words[:] = array.array("q", [p, p, 0, self.capacity, 1])
        return True

    def fit(self, nbytes: int, zeroed: int | None = None) -> int:
        """A pointer to the memref<?xi8> descriptor of at least `nbytes` bytes, whose first
        `zeroed` (the task counters; None: all `nbytes`) are zero."""
        if not self.reserve(nbytes):
            ctypes.memset(self._words[1], 0, nbytes if zeroed is None else min(zeroed, nbytes))
        return self.descriptor


def call_concurrently(calls: list["PreparedCall"]) -> None:
    """Run prepared calls of one function at once (each on its own thread, the first on
    this one), as a split call does; each call is checked as calling it alone checks it."""
    fn = calls[0]._fn
    if any(c._fn is not fn for c in calls):
        raise ValueError("call_concurrently(): every call must be of the same function")
    if fn._module.closed:
        raise ValueError(f"{fn.__name__}(): the module {fn._module.path.name} is closed")
    for c in calls:
        if c._stale:
            c._check()
    workers.run_concurrently(fn._cfunc, [c._pointers for c in calls])


def _check_dim_value(where: str, dim: str, n, largest: int, bound: str) -> None:
    """A value set_dim takes: an integer from 0 to `largest` (`bound` says what sets it)."""
    if not isinstance(n, numbers.Integral) or isinstance(n, bool):
        raise TypeError(f"{where}: {dim} must be an integer, got {type(n).__name__}")
    if not 0 <= n <= largest:
        raise ValueError(f"{where}: {dim} = {n} is outside 0 .. {largest}, what {bound}")


class PreparedCall:
    """One call's memref descriptors, built once, for a caller that calls the same
    kernel on the same buffers again and again (kina.models.KVCache's in-place step,
    StoryLM's decode step): it patches what changes (a size, a data pointer) and
    calls, one ctypes call and no allocation.

    Arguments are named as the function's signature names them (the results are
    `out0`, `out1`, ...), sizes by the signature's dim names:

        call = fn.prepare([q, k, v, s], [out], dims=("N",))
        call.set_dim("N", n)        # every axis whose size is N (or N+1, ...) in any descriptor
        call.set_size("k", "N", n)  # just k's axis of size N
        call.set_data("out0", a)

    The arrays given are the buffers, and they bound every descriptor: no patch can
    make the kernel read or write outside them (the call keeps them alive).
      - Each buffer must be a NumPy array of its parameter's dtype and rank, passable
        (aligned, unit innermost stride: it is used in place, never copied), the outs
        writable; a dim named in `dims` may take any value from 0 to the largest at
        which every axis that carries it (S, S+1, ...) fits in its buffer (`dim_range`),
        and the descriptors start at that largest value; every other size must be what
        the signature says, as for a call's arguments (`bind`). So even a call never
        patched is one the signature allows.
      - `set_dim` refuses a value outside `dim_range`; `set_size` one past that axis of
        its buffer, and since it patches one axis alone (the others may follow) the
        descriptors are checked against the signature at the next call; `set_data` an
        array not of the buffer's dtype, shape and strides (writable, for an out).
    A mistake is a TypeError or ValueError naming the argument, never a stray write.

    The names are checked here, once: `dims` must be dim names of the signature, and
    a name or (argument, dim) pair that the signature lacks is a ValueError naming it.
    Where each one lives in the descriptors is worked out here too, so that a patch
    costs a table look-up, a comparison and a store."""

    def __init__(self, fn: Function, arrays: list[np.ndarray], outs: list[np.ndarray], dims=(), threads: int = 1):
        self._fn = fn
        self.threads = threads  # > 1: the threaded entry on that many threads, if the function has one
        self._workspace = Workspace()
        sig, starts = fn.signature, [offset // 8 for offset in fn._offsets]
        types = [*(t for _, t in sig.params), *sig.results]
        names = [*(n for n, _ in sig.params), *(f"out{i}" for i in range(len(sig.results)))]
        arrays, outs = list(arrays), list(outs)
        if len(arrays) != len(sig.params) or len(outs) != len(sig.results):
            raise TypeError(f"{sig.name}(): prepare takes {len(sig.params)} arrays and {len(sig.results)} outs "
                            f"({', '.join(names)}), got {len(arrays)} and {len(outs)}")
        for i, (name, t, a) in enumerate(zip(names, types, (*arrays, *outs))):
            where = f"{sig.name}(): prepare: {name}"
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{where} must be a numpy.ndarray, got {type(a).__name__}")
            if a.dtype != numpy_dtype(t.dtype):
                raise TypeError(f"{where} must have dtype {numpy_dtype(t.dtype)} ({t.dtype}), got {a.dtype}")
            if a.ndim != t.rank:
                raise ValueError(f"{where} must have rank {t.rank} {t.shape_str()}, got shape {list(a.shape)}")
            if not passable(a):
                raise ValueError(f"{where} must be aligned with unit innermost stride (a prepared call uses "
                                 f"its buffers in place)")
            if i >= len(arrays) and not a.flags.writeable:
                raise ValueError(f"{where} must be writable")
        self._buffers = [*arrays, *outs]  # kept alive: the descriptors point into them
        self._names, self._types, self._starts = names, types, starts
        self._index = {name: i for i, name in enumerate(names)}
        # what set_data takes for each: an array of the buffer's dtype, shape and strides
        self._layout = [(a.dtype, a.shape, a.strides, a.dtype.alignment, i >= len(arrays))
                        for i, a in enumerate(self._buffers)]
        self._start = dict(zip(names, starts))  # name -> its descriptor's first word
        # (name, dim) -> the size word of the axis that is exactly that dim, and the buffer's length there
        self._size_word = {(name, d.symbol): start + 3 + axis for name, t, start in zip(names, types, starts)
                           for axis, d in enumerate(t.dims) if d.symbol}
        self._size_cap = {(name, d.symbol): a.shape[axis] for name, t, a in zip(names, types, self._buffers)
                          for axis, d in enumerate(t.dims) if d.symbol}
        # every dim that may be patched -> (largest value, ((word, const, coeff), ...) of each axis
        # whose size is const + coeff * dim)
        known = {n for t in types for d in t.dims for n in d.names}
        self._dim_words: dict[str, tuple[int, tuple[tuple[int, int, int], ...]]] = {}
        for dim in dims:
            if dim not in known:
                raise ValueError(f"{sig.name}(): prepare: no parameter or result has a dim named {dim!r} "
                                 f"(its dims: {', '.join(sorted(known)) or 'none'})")
            found, largest, tightest = [], None, None
            for name, t, start, a in zip(names, types, starts, self._buffers):
                for axis, d in enumerate(t.dims):
                    if dim in d.names:
                        if len(d.terms) != 1:
                            raise ValueError(f"{sig.name}(): prepare: dim {d} mixes {dim} with other dims; "
                                             f"patch it with set_size")
                        const, coeff = d.const, d.terms[0][1]
                        found.append((start + 3 + axis, const, coeff))
                        fits = (a.shape[axis] - const) // coeff  # the largest value whose axis fits here
                        if largest is None or fits < largest:
                            largest, tightest = fits, (name, axis, d, a.shape[axis])
            if largest < 0:
                name, axis, d, length = tightest
                raise ValueError(f"{sig.name}(): prepare: {name} dim {axis} is {d}, at least {d.const}, but its "
                                 f"buffer holds {length}")
            self._dim_words[dim] = (largest, tuple(found))
        self._raw = _descriptor_words(self._buffers)
        for largest, words in self._dim_words.values():
            for word, const, coeff in words:
                self._raw[word] = const + coeff * largest
        self.words = np.frombuffer(self._raw, np.int64)  # a read-only view: patches go through the setters
        self.words.flags.writeable = False
        self._pointers = fn._pointers(self._raw)
        self._args = (ctypes.c_void_p * len(self._pointers))(*self._pointers)  # as the team entry takes them
        self._check()
        # the workspace bytes of its threaded entry at the largest sizes it may take: the
        # descriptors start at them (every axis its buffer's length, or what the largest
        # value of its dim makes it), no patch can pass them, and a workspace's need only
        # grows with the sizes (temporaries' sizes are products and sums of them); 0 if none
        self._most_workspace = fn._workspace_bytes(*self._pointers) if fn._workspace_bytes else 0

    def _where(self, name: str) -> int:
        start = self._start.get(name)
        if start is None:
            raise ValueError(f"{self._fn.__name__}(): no parameter or result named {name!r} "
                             f"(it has: {', '.join(self._start)})")
        return start

    def _check(self) -> None:
        """The descriptors' sizes against the signature and the buffers, as `bind` checks a
        call's arguments: each size within its buffer, static dims as declared, every dim
        name one value, compound dims (S+1) and the results' sizes what that value makes
        them, and the intermediates within this machine's memory."""
        self._stale = True
        raw, fname, sig = self._raw, self._fn.__name__, self._fn.signature
        sizes = [raw[start + 3:start + 3 + t.rank] for t, start in zip(self._types, self._starts)]
        for name, size, a in zip(self._names, sizes, self._buffers):
            for axis, (n, length) in enumerate(zip(size, a.shape)):
                if not 0 <= n <= length:
                    raise ValueError(f"{fname}(): prepared call: {name} dim {axis} is {n}, but its buffer "
                                     f"holds {length}")
        env, where = {}, {}
        for name, t, size in zip(self._names[:len(sig.params)], self._types, sizes):
            for axis, (d, n) in enumerate(zip(t.dims, size)):
                if d.symbol:
                    if d.symbol in env and env[d.symbol] != n:
                        raise ValueError(f"{fname}(): prepared call: dim {d.symbol} is {env[d.symbol]} in "
                                         f"{where[d.symbol]} but {n} in {name} (dim {axis})")
                    env[d.symbol], where[d.symbol] = n, name
        for name, t, size in zip(self._names, self._types, sizes):
            for axis, (d, n) in enumerate(zip(t.dims, size)):
                want = d.evaluate(env)
                if n != want:
                    raise ValueError(f"{fname}(): prepared call: {name} dim {axis} must be {d} = {want}, got {n}")
        need = sum(t.nbytes(env) for t in sig.temporaries)
        if need > MEMORY_BYTES:
            raise ValueError(f"{fname}(): prepared call: at {', '.join(f'{k}={v}' for k, v in env.items())} its "
                             f"intermediate tensors need {need} bytes, more than this machine's {MEMORY_BYTES}")
        self._stale = False

    def dim_range(self, dim: str) -> range:
        """The values `set_dim(dim, n)` takes: 0 up to the largest that fits every buffer."""
        found = self._dim_words.get(dim)
        if found is None:
            raise ValueError(f"{self._fn.__name__}(): dim_range: dim {dim!r} was not named to prepare(dims=...)")
        return range(found[0] + 1)

    def set_dim(self, dim: str, n: int) -> None:
        """The dim `dim` is now `n` long, in every descriptor that carries it (as a whole
        axis or inside one like S+1); only dims named to `prepare` may be set, and only
        to a value in `dim_range(dim)`. (Per decode step and layer: about as cheap as
        four bare stores by position.)"""
        raw = self._raw
        try:
            largest, words = self._dim_words[dim]
        except KeyError:
            raise ValueError(f"{self._fn.__name__}(): set_dim: dim {dim!r} was not named to prepare(dims=...)") from None
        _check_dim_value(f"{self._fn.__name__}(): set_dim", dim, n, largest, "the buffers given to prepare hold")
        for word, const, coeff in words:
            raw[word] = const + coeff * n

    def set_dims(self, **sizes: int) -> None:
        """`set_dim` for each dim given."""
        for dim, n in sizes.items():
            self.set_dim(dim, n)

    def set_size(self, name: str, dim: str, n: int) -> None:
        """Argument `name`'s axis whose size is the dim `dim` is now `n` long (at most its
        buffer's length there); the descriptors are checked at the next call, when
        the other axes of that dim must agree."""
        word = self._size_word.get((name, dim))
        if word is None:
            self._where(name)
            raise ValueError(f"{self._fn.__name__}(): {name} has no axis of size {dim!r}")
        length = self._size_cap[name, dim]
        if not 0 <= n <= length:
            raise ValueError(f"{self._fn.__name__}(): set_size: {name}'s {dim} = {n} is outside 0 .. {length}, "
                             f"what its buffer holds")
        self._raw[word] = n
        self._stale = True

    def set_data(self, name: str, a: np.ndarray) -> None:
        """Argument `name` now points at `a`'s data: `a` must be of the buffer's dtype,
        shape and strides, aligned (writable, for an out); the call keeps it alive."""
        i = self._index.get(name)
        if i is None:
            self._where(name)
        dtype, shape, strides, alignment, is_out = self._layout[i]
        p = data_pointer(a) if isinstance(a, np.ndarray) else None
        if not (p is not None and a.dtype == dtype and a.shape == shape and a.strides == strides
                and p % alignment == 0 and (not is_out or a.flags.writeable)):
            got = f"{a.dtype} {list(a.shape)} strides {a.strides}" if isinstance(a, np.ndarray) else type(a).__name__
            if p is not None and a.shape == shape and a.dtype == dtype and a.strides == strides:
                got += ", read-only" if p % alignment == 0 else ", misaligned"
            raise ValueError(f"{self._fn.__name__}(): set_data: {name} must be a{' writable' if is_out else 'n'} "
                             f"aligned {dtype} array of shape {list(shape)} and strides {strides}, as prepared; "
                             f"got {got}")
        self._buffers[i] = a
        start = self._starts[i]
        self._raw[start] = self._raw[start + 1] = p

    def __call__(self) -> None:
        if self._fn._module.closed:
            raise ValueError(f"{self._fn.__name__}(): the module {self._fn._module.path.name} is closed")
        if self._stale:
            self._check()
        self._run(self.threads)

    def _run(self, threads: int) -> None:
        if threads > 1 and self._fn.threaded:
            self._fn._run_threaded(self._pointers, threads, self._workspace, self._args, self._most_workspace)
        else:
            self._fn._cfunc(*self._pointers)


class CallSequence:
    """Prepared calls of one module run in order, in one entry from the host:

        steps = CallSequence([layer_0, layer_1, ..., head])   # PreparedCalls
        steps.threads = 2
        steps()                                                # as each call in turn

    Each call runs as calling it alone runs it (its descriptors checked if patched),
    with the same bits; but the calls themselves are made from C (kina_threads.c's
    kina_run_sequence), one after the other, so the host's interpreter does not run
    between them. That matters when the calls stream more than the caches hold: a
    SmolLM-shape decode layer reads 14 MB of weights, after which each line of Python
    between two layers missed the caches, and the host's part of a 2-thread layer call
    was about 80 us (of 1 ms) on the Zen 1 VM. The threaded calls share one workspace,
    as large as the largest needs at the largest sizes its patches allow (known when it
    was prepared: no work per run; call i's threads have all finished before call i + 1
    zeroes its task counters), so each layer's temporaries lie where
    the layer before left its own, in the cache, not in one of 30 blocks a token
    touches once each: a SmolLM-shape F16 decode step on two threads, 11.33 -> 11.07 ms
    (docs/performance.md, "One workspace for a token's calls"). `threads` applies to
    every call (each on that many threads if it has a threaded entry, as
    PreparedCall.threads; default 1). Where the module cannot (built without kinac's
    passes, or a function without kina_<f>_packed), or the team is busy with another
    call, the calls are made one by one from here instead, each in its own workspace.
    The calls keep their own state: patch them (set_dim, ...) between runs, or give a dim
    to all of them at once with the sequence's own `set_dim`."""

    def __init__(self, calls, threads: int = 1):
        calls = list(calls)
        if not calls:
            raise ValueError("CallSequence: calls must hold at least one PreparedCall, got none")
        for i, c in enumerate(calls):
            if not isinstance(c, PreparedCall):
                raise TypeError(f"CallSequence: calls[{i}] must be a PreparedCall (Function.prepare), "
                                f"got {type(c).__name__}")
        module = calls[0]._fn._module
        for i, c in enumerate(calls):
            if c._fn._module is not module:
                raise ValueError(f"CallSequence: calls[{i}] is of {c._fn._module.path.name}, calls[0] of "
                                 f"{module.path.name}: every call must be of one module")
        self.calls, self._module, self.threads = calls, module, _check_threads("CallSequence", threads)
        self._dims: dict = {}  # dim -> (the largest value every call takes, each call's size words): set_dim
        n = len(calls)
        self._native = (all(c._fn._packed is not None for c in calls)
                        and module._run_sequence is not None)
        if self._native:  # the arrays kina_run_sequence reads, fixed for the calls' life
            team = [c._fn._team_entry.value if c._fn._team_entry is not None and c._fn._counter_bytes is not None
                    else None for c in calls]
            self._packed = (ctypes.c_void_p * n)(*[c._fn._packed for c in calls])
            self._team = (ctypes.c_void_p * n)(*team)
            self._args = (ctypes.c_void_p * n)(*[ctypes.addressof(c._args) for c in calls])
            self._workspace = Workspace()  # shared: the calls run one at a time
            self._most = max(c._most_workspace for c in calls)  # what the largest sizes need, known at prepare
            self._ws = (ctypes.c_void_p * n)(*[self._workspace.descriptor] * n)
            self._zero = (ctypes.c_int64 * n)(*[c._fn._counter_bytes or 0 for c in calls])

    def set_dim(self, dim: str, n: int) -> None:
        """`set_dim(dim, n)` on every call prepared with `dim` (`prepare(dims=...)`), in one
        pass over their size words (a decode step's 30 layers: 120 stores, not 30 method
        calls); `n` must be in every such call's `dim_range`."""
        found = self._dims.get(dim)
        if found is None:
            calls = [c for c in self.calls if dim in c._dim_words]
            if not calls:
                raise ValueError(f"CallSequence: set_dim: no call was prepared with dims=({dim!r},)")
            found = self._dims[dim] = (min(c._dim_words[dim][0] for c in calls),
                                       tuple((c._raw, word, const, coeff) for c in calls
                                             for word, const, coeff in c._dim_words[dim][1]))
        largest, words = found
        _check_dim_value("CallSequence: set_dim", dim, n, largest, "the buffers of every call prepared with it hold")
        for raw, word, const, coeff in words:
            raw[word] = const + coeff * n

    def __call__(self) -> None:
        module, threads = self._module, _check_threads("CallSequence", self.threads)
        if module.closed:
            raise ValueError(f"CallSequence: the module {module.path.name} is closed")
        for c in self.calls:
            if c._stale:
                c._check()
        if self._native:
            if threads == 1:
                module._run_sequence(None, len(self.calls), self._packed, self._team, self._args, self._ws,
                                     self._zero, 1)
                return
            self._workspace.reserve(self._most)  # a no-op after the first run
            if module.team(threads - 1).run_sequence(len(self.calls), self._packed, self._team, self._args,
                                                     self._ws, self._zero, threads):
                return
        for c in self.calls:
            c._run(threads)


class Module:
    """A loaded .so: one attribute per Kina function. Use `close()` or `with`."""

    def __init__(self, path: Path, sidecar: dict):
        self.path, self.sidecar, self.closed = path, sidecar, False
        self._teams: dict[int, workers.Team] = {}
        self._teams_lock = threading.Lock()
        try:
            self._lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise LoadError(f"{path}: cannot be loaded: {e}") from None
        self._run_sequence = workers.host_call(self._lib, abi.RUN_SEQUENCE)  # (CallSequence) or None
        self.functions: dict[str, Function] = {}
        for obj in sidecar["functions"]:
            sig = Signature.from_json(obj)
            try:
                cfunc = getattr(self._lib, abi.c_interface(sig.name))
            except AttributeError:
                raise LoadError(f"{path}: sidecar lists function '{sig.name}' but the .so has no "
                                f"{abi.c_interface(sig.name)}") from None
            threaded = None
            if obj.get("threaded"):
                try:
                    threaded = (getattr(self._lib, abi.c_interface(sig.name, abi.THREADED)),
                                getattr(self._lib, abi.c_interface(sig.name, abi.WORKSPACE)),
                                # an older .so has no counters function: all its workspace is zeroed
                                getattr(self._lib, abi.c_interface(sig.name, abi.COUNTERS), None),
                                # without a team entry (an older .so), each call starts its threads
                                getattr(self._lib, abi.exported(sig.name, abi.TEAM), None))
                except AttributeError:
                    raise LoadError(f"{path}: sidecar says function '{sig.name}' is threaded but the .so has no "
                                    f"threaded entry for it") from None
            self.functions[sig.name] = Function(self, sig, cfunc, obj.get("independent_axes", 0), threaded,
                                                # an older .so, or one built without team-entries, has none
                                                getattr(self._lib, abi.exported(sig.name, abi.PACKED), None))

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

    def team(self, n: int) -> "workers.Team":
        """The `n` worker threads that run threaded calls of this .so (made on first use)."""
        with self._teams_lock:
            team = self._teams.get(n)
            if team is None or not team._threads:
                team = self._teams[n] = workers.Team(self._lib, n)
            return team

    def close(self) -> None:
        """Unload the .so; any later call raises ValueError instead of crashing."""
        if not self.closed:
            with self._teams_lock:
                for team in self._teams.values():  # their threads are in the .so's code
                    team.close()
                self._teams.clear()
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
        if sidecar.get("format") != abi.SIDECAR_FORMAT:
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


__all__ = ["Module", "Function", "CallSequence", "LoadError", "load", "Dim", "TensorType"]
