"""Calling a compiled function: `Function`, its descriptors, its threads and its workspace.

In:  a loaded .so's C interface for one Kina function (and its threaded entry, if the
     threads pass gave it one), and arrays.
Out: `Function`: called with arrays it returns a tuple of new NumPy arrays (`call_into`
     writes given ones; `call_unchecked` skips the checks; `prepare` makes a
     `kina.runtime.prepared.PreparedCall`). Its descriptors, thread count and workspace are
     `kina.runtime.descriptors`'.

Calling convention (what `kinac` emits, `kina.abi`): `_mlir_ciface_kina_<fn>(in_0*, ...,
out_0*, ...)` where each pointer is a memref descriptor {allocated, aligned, offset,
sizes[r], strides[r]} (all int64; one call's descriptors are packed back to back in one
buffer, `descriptor_words`). Results are out-params: allocated here, on a 64-byte
boundary, and filled by the callee.

Guarantees: before every call the arguments are checked (`kina.runtime.binding`). A call
of a function with a threaded entry (the threads pass) that moves at least
`THREADED_MIN_BYTES` runs on `threads` threads (KINA_NUM_THREADS, default the machine's
cores), bit-identical to one: the module's team enters the threaded entry once each and
shares its parts (`kina.runtime.workers`); the calling thread is bound off the team's
cores for the call, then given its own binding back. A smaller call, or one of a function
without a threaded entry, runs on the calling thread.
"""
from __future__ import annotations

import array
import ctypes
import itertools
import threading

import numpy as np

from ..frontend.types import Signature
from . import workers
from .arrays import RESULTS, numpy_dtype, passable
from .binding import CheckPlan, bind
from .descriptors import Workspace, check_threads, descriptor_words
from .prepared import PreparedCall
from .quant import QuantizedArray, storage


class Function:
    """One compiled Kina function; call it with arrays (see `bind`), get NumPy arrays back.

    Calls of at least THREADED_MIN_BYTES run on several threads when the function has a
    threaded entry, with bit-identical results for any thread count. `independent_axes`
    is the sidecar's count of its leading axes that are independent (`kina.frontend.axes`:
    batch and heads, for attention)."""

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
        self.storage_types = sig.storage_types()  # the parameters' types as the compiled code takes them

    def storage_of(self, param: int, a):
        """Argument `param` as the compiled code takes it: a QuantizedArray as its bytes in the
        layout the build chose for that parameter (`quant.storage`); anything else as it is.
        For `call_unchecked` and `prepare`, which take arrays as the code takes them."""
        if isinstance(a, QuantizedArray):
            return storage(a, self.signature.layout(self.signature.params[param][0]))
        return a

    def __repr__(self) -> str:
        params = ", ".join(f"{n}: {t}" for n, t in self.signature.params)
        return f"<kina function {self.__name__}({params}) -> ({', '.join(map(str, self.signature.results))})>"

    def __call__(self, *args, threads: int | None = None) -> tuple[np.ndarray, ...]:
        """Check the arguments, allocate the results, run; returns the results.

        Results are NumPy arrays; large ones reuse the memory of dead results
        (`kina.runtime.pool`), so a steady loop touches no fresh pages. `threads` (default
        `default_threads()`) bounds the threads a large call may use."""
        threads = check_threads(self.__name__, threads)
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
        self.call_unchecked(arrays, list(outs), check_threads(name, threads))

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

        With `threads` > 1 a call of THREADED_MIN_BYTES or more runs the threaded entry on
        that many threads (ctypes releases the GIL); the results are the same bits."""
        if self._module.closed:
            raise ValueError(f"{self.__name__}(): the module {self._module.path.name} is closed")
        words = descriptor_words((*arrays, *outs))
        if threads > 1 and self.threaded and sum(a.nbytes for a in (*arrays, *outs)) >= THREADED_MIN_BYTES:
            workspace = getattr(self._workspaces, "one", None)
            if workspace is None:
                workspace = self._workspaces.one = Workspace()
            return self._run_threaded(self._pointers(words), threads, workspace)
        self._cfunc(*self._pointers(words))

    def prepare(self, arrays: list[np.ndarray], outs: list[np.ndarray], dims=(), threads: int = 1) -> PreparedCall:
        """A call on fixed buffers whose descriptors are built once, whose `dims` (names
        of the signature's dims) `set_dims` may change (see PreparedCall). Unlike
        `call_unchecked`, the buffers are checked, once, here, and bound every patch.
        With `threads` > 1 and a threaded entry, every call runs on that many threads
        (whatever its size)."""
        return PreparedCall(self, arrays, outs, dims, check_threads(self.__name__, threads))

    def _run_threaded(self, pointers: list[int], threads: int, workspace: "Workspace", args=None,
                      need: int | None = None) -> None:
        """The threaded entry on `threads` threads (this one and workers), each with its id,
        sharing `workspace`, grown first to `need` bytes (default: what this call's sizes
        need, asked of the entry); `args`, if given, is `pointers` as the ctypes array the
        team entry takes (a prepared call's). When the team is busy with another call (or
        the .so has no team entry), worker threads run the entry instead."""
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



# A call of a threaded function moving less than this runs on one thread (the hand-over
# to the workers costs more than the split saves); a prepared call with `threads` > 1
# always runs on them. With the team's workers spinning between calls, two threads were
# level with one at 217-257 KiB and 1.1-1.35x faster from 327 KiB up (one-row matmuls and
# adds over copies beyond the cache, on the 2-core Intel VM; docs/performance.md, "Calls of
# a third of a MiB on every core"). It was 1 MiB when a hand-over woke the workers. (The
# runtime's own split of a call along independent leading axes, from 16 MiB, was retired:
# the threaded entry ran those calls as fast, and smaller ones 1.2-5x faster;
# scripts/ab_host_split.py at commit 4a41a8b.)
THREADED_MIN_BYTES = 384 << 10
