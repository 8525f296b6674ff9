"""Arrays as the compiled code takes them: dtypes, conversion, alignment, result memory.

In:  an argument of any kind a call accepts, and the Kina type of its parameter; or a
     shape and dtype to allocate.
Out: a NumPy array: a view of the caller's memory where there is one (`as_ndarray`),
     one the compiled code can take as it is (`passable`, `as_passable`), or new memory
     starting on an `ALIGN`-byte boundary (`empty`, `zeros`, and `RESULTS`, the pool that
     results are allocated from).

Guarantees: an argument may be a NumPy array, anything that speaks DLPack (`__dlpack__`:
CPU torch tensors, JAX arrays) or the array interface (`__array__`,
`__array_interface__`), or a nested list (see `as_ndarray`). Arrays are never converted
to another dtype, and are read in place: DLPack and array-interface objects become NumPy
views of the caller's memory. Only an array whose innermost stride is not one element,
or that is misaligned, is copied (`as_passable`). Large results reuse the memory of dead
ones (`kina.runtime.pool`: bounded, `release_memory()` returns it). `zeros` costs only the
pages written, in small pages (a KV cache's sparse first writes). BF16 is
`ml_dtypes.bfloat16`, imported the first time it is asked for.
"""
from __future__ import annotations

import math
import mmap

import numpy as np

from ..dtypes import by_numpy
from ..frontend.types import DTYPES, TensorType
from .pool import Pool, data_pointer


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
    """`empty`, zero-filled lazily: untouched pages cost no memory. One of `MAPPED_MIN` bytes or
    more is a memory map of its own (page-aligned) advised against huge pages: NumPy advises huge
    pages for its arrays of 4 MB and more, and a write then makes a whole 2 MB page resident, so
    a KV cache's Kᵀ (a position is one value in each of its rows: 32 KB apart at 8192 positions)
    would be all resident after the first token (SmolLM2: 250 MB of 377)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    nbytes = dtype.itemsize * math.prod(shape)
    if nbytes < MAPPED_MIN:
        return _aligned(np.zeros, shape, dtype)
    buf = mmap.mmap(-1, nbytes)  # anonymous: zero pages until written, unmapped with the last view
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is not None:
        try:
            buf.madvise(advice)
        except OSError:
            pass  # a kernel without transparent huge pages
    return np.frombuffer(buf, np.uint8).view(dtype).reshape(shape)


MAPPED_MIN = 1 << 20


# Kina dtype -> NumPy dtype; BF16's comes from ml_dtypes, imported the first time it is
# asked for (importing it costs about half a second, which every kinac start would pay)
_NUMPY_DTYPES = {name: np.dtype(np_name) for name, (_, np_name, _) in DTYPES.items() if np_name != "bfloat16"}


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of a Kina dtype name (BF16 is `ml_dtypes.bfloat16`)."""
    if dtype not in _NUMPY_DTYPES and dtype in DTYPES:
        import ml_dtypes  # what makes NumPy know bfloat16
        _NUMPY_DTYPES[dtype] = np.dtype(ml_dtypes.bfloat16)
    return _NUMPY_DTYPES[dtype]


def kina_name(dt) -> str | None:
    """The name of the unblocked Kina dtype ("F32", "BF16", ...) that NumPy dtype `dt` is, or None.
    Imports nothing: a bfloat16 dtype exists only once ml_dtypes is loaded (NumPy has none)."""
    d = by_numpy(dt.name) if isinstance(dt, np.dtype) else None
    return d.name if d is not None and dt == numpy_dtype(d.name) else None


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
