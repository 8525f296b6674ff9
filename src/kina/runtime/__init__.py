"""The runtime: load a kinac-built .so through its sidecar and call it with arrays.

    module.py    load, Module, LoadError: a .so and its sidecar
    calls.py     Function: a compiled function called with arrays, on one thread or its team
    descriptors.py  what a call hands the C side: memref descriptors, the thread count, the workspace
    binding.py   bind: arguments checked against the signature
    arrays.py    dtypes, arrays from NumPy, DLPack, lists; aligned results
    prepared.py  PreparedCall, patched and called again; CallSequence, runs of them from C
    workers.py   the threads that run a threaded entry: the module's team, or workers
    pool.py      recycled result memory
    cpu.py       the CPU a .so needs and the one it runs on
    arena.py     a model's weights in one block of huge pages
    quant.py     QuantizedArray: block-quantized bytes with their logical shape, and their values
    kina_threads.c, kina_abi.h   the C runtime linked into a threaded .so, and its ABI

Which threads run a call (`threads` > 1; with 1, or for a function without a threaded
entry, the body runs on the calling thread):

    call                                        runs
    fn(...), call_into, call_unchecked          the threaded entry, on the module's team, from
                                                THREADED_MIN_BYTES moved; below, one thread
    PreparedCall                                the threaded entry on the team, at any size
    CallSequence                                each call as its PreparedCall would, all from C
    any of them while another holds the team    the threaded entry on worker threads (workers.py)

Guarantees: nothing in this package imports `mlir` or `lark` (a test blocks both and
imports it): a .so with its sidecar needs only NumPy, ml_dtypes and ctypes.
"""
from .arrays import ALIGN, RESULTS, as_ndarray, as_passable, empty, numpy_dtype, passable, release_memory, \
    set_memory_limit, zeros
from .binding import MEMORY_BYTES, CheckPlan, bind, result_shapes
from .calls import THREADED_MIN_BYTES, Function
from .descriptors import default_threads
from .module import LoadError, Module, load
from .prepared import CallSequence, PreparedCall
from .quant import QuantizedArray

__all__ = ["ALIGN", "MEMORY_BYTES", "RESULTS", "THREADED_MIN_BYTES", "CallSequence", "CheckPlan", "Function", "LoadError",
           "Module", "PreparedCall", "QuantizedArray", "as_ndarray", "as_passable", "bind", "default_threads", "empty", "load",
           "numpy_dtype", "passable", "release_memory", "result_shapes", "set_memory_limit", "zeros"]
