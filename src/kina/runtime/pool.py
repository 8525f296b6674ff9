"""Recycled memory for large results: a steady call loop touches no fresh pages.

In:  a result's shape and dtype.
Out: an ordinary NumPy array, 64-byte aligned, whose memory is a block this pool
     lends; when the array and every view of it are gone, the block comes back.

Why: glibc serves large allocations with fresh `mmap`s, and the first write to
each fresh page faults. For a decode step whose results are tens of MiB that
costs more than the kernel (docs/performance.md, "Recycled results"). Here a
block freed by a dead result is reused by the next call that needs that size
class, so a loop that feeds each step's results back as the next step's inputs
reuses the same few blocks.

Guarantees: blocks below `MIN_BYTES` are not pooled (glibc's heap recycles them
well). Sizes are rounded up to classes 1/16 of a power of two apart (at most 6%
more memory), so a cache growing by one position per step keeps finding its class.
What the pool keeps (free blocks only) never exceeds its limit (`set_limit`,
default `DEFAULT_LIMIT`); a block that would exceed it goes back to the system, and
`release()` returns every kept block. Thread-safe: blocks can come back from any
thread (the garbage collector's). The memory of a lent block is never reused while
any array that sees it is alive: the block returns through a finalizer on the
buffer object that every view of the array keeps alive.
"""
from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

ALIGN = 64
MIN_BYTES = 1 << 20
DEFAULT_LIMIT = 1 << 30


def _data_pointer_reader():
    """The fastest way to read an ndarray's data pointer. NumPy's array struct starts
    with the object header and then `char *data` (PyArrayObject_fields, the same in
    NumPy 1 and 2); reading that field is several times cheaper than `a.ctypes.data`,
    whose cost was most of a small call's overhead (docs/performance.md, "A thin
    call"). Checked here, on a view, against `a.ctypes.data`; if the layout ever
    differs, `a.ctypes.data` is used."""
    read = ctypes.c_void_p.from_address
    offset = object.__basicsize__  # the object header: refcount and type
    probe = np.empty((3, 5), np.float32)[1:, 2:]
    if read(id(probe) + offset).value == probe.ctypes.data:
        return lambda a: read(id(a) + offset).value, True
    return lambda a: a.ctypes.data, False


data_pointer, FAST_DATA_POINTER = _data_pointer_reader()


def size_class(nbytes: int) -> int:
    """`nbytes` rounded up to the next multiple of 1/16 of its power of two."""
    step = max(1 << max(nbytes.bit_length() - 5, 0), ALIGN)
    return -(-nbytes // step) * step


class Pool:
    def __init__(self, limit: int = DEFAULT_LIMIT):
        self._free: dict[int, list[np.ndarray]] = {}
        self._kept = 0
        self._limit = limit
        self._lock = threading.Lock()
        self.reused = self.allocated = 0  # counts, for tests and benchmarks

    @property
    def kept_bytes(self) -> int:
        """Bytes of free blocks kept for reuse."""
        return self._kept

    def set_limit(self, nbytes: int) -> None:
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"limit: expected a non-negative number of bytes, got {nbytes!r}")
        with self._lock:
            self._limit = nbytes
            self._trim()

    def release(self) -> int:
        """Return every kept block to the system; returns how many bytes that was."""
        with self._lock:
            freed, self._free, self._kept = self._kept, {}, 0
        return freed

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised, ALIGN-aligned array of `shape` and `dtype`."""
        dtype = np.dtype(dtype)
        count = 1
        for d in shape:
            count *= d
        nbytes = count * dtype.itemsize
        cls = size_class(nbytes + ALIGN)
        if nbytes < MIN_BYTES:
            raw = np.empty(nbytes + ALIGN, np.uint8)
        else:
            with self._lock:
                blocks = self._free.get(cls)
                raw = blocks.pop() if blocks else None
                if raw is not None:
                    self._kept -= cls
                    self.reused += 1
                else:
                    self.allocated += 1
            if raw is None:
                raw = np.empty(cls, np.uint8)
        start = -data_pointer(raw) % ALIGN
        flat = np.frombuffer(memoryview(raw), dtype, count, start)
        if nbytes >= MIN_BYTES:
            # `flat.base` is the buffer object every view of the result keeps alive
            weakref.finalize(flat.base, self._give, cls, raw)
        return flat.reshape(shape)

    def _give(self, cls: int, raw: np.ndarray) -> None:
        with self._lock:
            self._free.setdefault(cls, []).append(raw)
            self._kept += cls
            self._trim()

    def _trim(self) -> None:
        """Drop kept blocks, largest first, until the kept bytes fit the limit (lock held)."""
        for cls in sorted(self._free, reverse=True):
            blocks = self._free[cls]
            while blocks and self._kept > self._limit:
                blocks.pop()
                self._kept -= cls
            if not blocks:
                del self._free[cls]
