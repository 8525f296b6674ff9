"""The runtime: load a kinac-built .so through its sidecar and call it with arrays.

    loader.py   load, Module, Function, argument binding and checks, split calls, prepared calls
                and runs of them in one entry from the host (CallSequence)
    pool.py     recycled result memory              workers.py  the threads of a split call
    cpu.py      the CPU a .so needs and the one it runs on
    arena.py    a model's weights in one block of huge pages

Guarantees: nothing in this package imports `mlir` or `lark` (a test blocks both and
imports it): a .so with its sidecar needs only NumPy, ml_dtypes and ctypes.
"""
from .loader import (ALIGN, MEMORY_BYTES, PARALLEL_MIN_BYTES, RESULTS, CallSequence, CheckPlan, Function, LoadError, Module,
                     PreparedCall, as_ndarray, as_passable, bind, call_concurrently, default_threads, empty, load,
                     numpy_dtype, passable, release_memory, result_shapes, set_memory_limit, zeros)

__all__ = ["ALIGN", "MEMORY_BYTES", "PARALLEL_MIN_BYTES", "RESULTS", "CallSequence", "CheckPlan", "Function", "LoadError", "Module",
           "PreparedCall", "as_ndarray", "as_passable", "bind", "call_concurrently", "default_threads", "empty",
           "load", "numpy_dtype", "passable", "release_memory", "result_shapes", "set_memory_limit", "zeros"]
