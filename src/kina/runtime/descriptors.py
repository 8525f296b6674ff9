"""What a call hands the compiled code besides its arrays' data: descriptors, threads, workspace.

In:  arrays (passable: unit innermost stride), a thread count as a caller gave it.
Out: `descriptor_words(arrays)`: their memref descriptors back to back as int64 words;
     `default_threads()`, `check_threads(name, threads)`: how many threads a call runs on;
     `Workspace`: the memory the threads of one threaded call share.

Guarantees: a descriptor's strides are in elements and its innermost stride is 1 (every Kina
memref type's); a workspace's task counters are zero before each call that asks for them.
Shared by `kina.runtime.calls` (Function) and `kina.runtime.prepared` (PreparedCall).
"""
from __future__ import annotations

import array
import ctypes
import os

import numpy as np

from .. import knobs
from . import workers
from .arrays import zeros
from .pool import data_pointer


def descriptor_words(arrays) -> array.array:
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


def default_threads() -> int:
    """KINA_NUM_THREADS if set, else the cores this process may run on."""
    threads = knobs.get("KINA_NUM_THREADS")
    if threads is not None:
        return threads
    cpus = workers.cpus()
    return len(cpus) if cpus else os.cpu_count() or 1


def check_threads(name: str, threads) -> int:
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{name}(): threads must be a positive integer, got {threads!r}")
    return threads


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
