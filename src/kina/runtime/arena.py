"""Arrays a model holds for its life (its weights), in one block of huge pages.

In:  the shapes and dtypes of the arrays, all known up front.
Out: C-contiguous NumPy arrays, each starting on a 64-byte boundary, views of one
     allocation whose start lies on a 2 MiB boundary and which is advised to the
     kernel as MADV_HUGEPAGE before anything is written to it.

Why: a decode step reads every weight once, front to back. In 4 KiB pages each page is
a TLB miss and a restart of the hardware prefetchers, which do not cross a page; a
projection's weights (0.4-3.5 MB, each its own allocation) stayed in such pages, since
NumPy asks for huge pages only for arrays of 4 MiB or more. One decode row
`x[1, 576] @ W[576, 1536]` over copies of W, on the Zen 1 VM: 274 -> 227 us on one
thread and 224 -> 194 us on two (docs/performance.md, "Weights in huge pages").

Guarantees: the arrays do not overlap; their contents are unset (np.empty). Where the
system gives no transparent huge pages (THP off, another OS, no memory to spare in
2 MiB pieces) the arrays are the same, in small pages, and nothing fails.
"""
from __future__ import annotations

import ctypes
import math
import mmap

import numpy as np

from .pool import ALIGN, data_pointer

HUGE_PAGE = 2 << 20


def _advise_huge(address: int, nbytes: int) -> bool:
    """madvise(MADV_HUGEPAGE) on [address, address + nbytes), which starts on a page; False where unavailable."""
    flag = getattr(mmap, "MADV_HUGEPAGE", None)
    if flag is None or nbytes <= 0:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return libc.madvise(address, nbytes, flag) == 0
    except (OSError, AttributeError):
        return False


def arrays(specs: dict) -> dict[str, np.ndarray]:
    """`{name: (shape, dtype)}` -> `{name: array}`: the arrays, in that order, views of one
    block advised as huge pages (see the module's docstring)."""
    layout, offset = {}, 0
    for name, (shape, dtype) in specs.items():
        dtype, shape = np.dtype(dtype), tuple(int(d) for d in shape)
        nbytes = dtype.itemsize * math.prod(shape)
        layout[name] = (offset, nbytes, shape, dtype)
        offset += -(-nbytes // ALIGN) * ALIGN
    raw = np.empty(offset + HUGE_PAGE, np.uint8)  # nothing touched yet: the advice comes before the first write
    start = -data_pointer(raw) % HUGE_PAGE
    _advise_huge(data_pointer(raw) + start, offset)
    block = raw[start:start + offset]
    return {name: block[at:at + n].view(dtype).reshape(shape) for name, (at, n, shape, dtype) in layout.items()}
