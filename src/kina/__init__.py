"""Kina: a reference compiler for a small tensor language, through MLIR to a .so.

    import kina
    mod = kina.compile_file("examples/storylm0_kv_step.kina")
    k_next, v_next, context = mod.kv_step(q, k_past, k_new, v_past, v_new, scale)

Importing `kina` is cheap: the front end (lark) and the back end (mlir) load only
when a function that needs them is first called, so `kina.load` of a built .so
needs nothing but NumPy, ml_dtypes and ctypes. Importing it runs no code of the package
but the leaf `kina.version` (even the error types load on first use), so `kinac` can take
over Ctrl-C (`kina.driver.interrupts`) before anything slow is imported.
"""
from .version import __version__

__all__ = ["KinaError", "InternalError", "ToolError", "compile_file", "compile_source", "load",
           "interpret", "__version__"]


def __getattr__(name):  # lazy, so the runtime never drags in lark or mlir
    if name in ("KinaError", "InternalError", "ToolError"):
        from . import errors
        return getattr(errors, name)
    if name in ("compile_file", "compile_source"):
        from .driver import api
        return getattr(api, name)
    if name == "load":
        from .runtime import load
        return load
    if name == "interpret":
        from .interpreter import interpret
        return interpret
    raise AttributeError(f"module 'kina' has no attribute {name!r}")
