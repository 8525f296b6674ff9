"""The runtime: load a kinac-built .so through its sidecar and call it with arrays.

    module.py    load, Module, LoadError: a .so and its sidecar
    calls.py     Function: a call's descriptors, its threads and workspace
    binding.py   bind: arguments checked against the signature
    arrays.py    dtypes, arrays from NumPy, DLPack, lists; aligned results
    prepared.py  PreparedCall, patched and called again; CallSequence, runs of them from C
    workers.py   the threads of a split call, and the team of a threaded entry
    pool.py      recycled result memory
    cpu.py       the CPU a .so needs and the one it runs on
    arena.py     a model's weights in one block of huge pages
    kina_threads.c, kina_abi.h   the C runtime linked into a threaded .so, and its ABI

Guarantees: nothing in this package imports `mlir` or `lark` (a test blocks both and
imports it): a .so with its sidecar needs only NumPy, ml_dtypes and ctypes.
"""
from .arrays import ALIGN, RESULTS, as_ndarray, as_passable, empty, numpy_dtype, passable, release_memory, \
    set_memory_limit, zeros
from .binding import MEMORY_BYTES, CheckPlan, bind, result_shapes
from .calls import PARALLEL_MIN_BYTES, Function, default_threads
from .module import LoadError, Module, load
from .prepared import CallSequence, PreparedCall, call_concurrently

__all__ = ["ALIGN", "MEMORY_BYTES", "PARALLEL_MIN_BYTES", "RESULTS", "CallSequence", "CheckPlan", "Function", "LoadError", "Module",
           "PreparedCall", "as_ndarray", "as_passable", "bind", "call_concurrently", "default_threads", "empty",
           "load", "numpy_dtype", "passable", "release_memory", "result_shapes", "set_memory_limit", "zeros"]
