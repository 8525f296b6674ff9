"""MLIR's LLVM dialect to LLVM IR text, in process (what `mlir-translate --mlir-to-llvmir` prints).

In:  a module after the `to-llvm` pass: only `builtin.module` and `llvm.*` ops.
Out: the LLVM IR text, byte for byte what the pinned `mlir-translate --mlir-to-llvmir`
     prints for the same module (a test checks that).

The bindings' C API library exports `mlirTranslateModuleToLLVMIRToString`; the
module's operation is handed to it through the bindings' capsule (`_CAPIPtr`), as
MLIR's Python interop documents. Running it here, rather than printing the module
and starting `mlir-translate`, saves that process's start (it loads all of LLVM)
and a print and parse of the module, a large part of a cold build (docs/performance.md,
"Compile time").

Guarantees and limits: that C function cannot report failure: if the translation
fails it crashes the process (it prints a module that does not exist). So every op
is checked first to be an `llvm.*` op; a module with any other op is handed to the
`mlir-translate` binary instead, whose error becomes a `ToolError` naming the file.
A module of `llvm.*` ops that still fails to translate (an attribute the translator
rejects) would crash; only a bug in a lowering pass can make one, never a user's
program, and the golden tests translate every example both ways. To rule it out
while working on the passes, set KINA_TRANSLATE=binary: every module then goes to
the binary.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

import mlir._mlir_libs
from mlir import ir

from .. import knobs
from . import toolchain

_CAPSULE = b"mlir.ir.Operation._CAPIPtr"


@lru_cache(maxsize=1)
def _c_api():
    lib = ctypes.CDLL(str(Path(mlir._mlir_libs.__file__).parent / "libMLIRPythonCAPI.so"))
    to_string = lib.mlirTranslateModuleToLLVMIRToString
    to_string.restype, to_string.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    capsule_pointer.restype, capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return to_string, capsule_pointer, free


def _only_llvm_ops(op) -> bool:
    ok = True

    def visit(o):
        nonlocal ok
        name = o.operation.name
        if not (name == "builtin.module" or name.startswith("llvm.")):
            ok = False
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    op.walk(visit)
    return ok


def to_llvm_ir(module: ir.Module, path: Path) -> bytes:
    """The LLVM IR of `module`; `path` is where the module's text goes if the binary must run."""
    if knobs.get("KINA_TRANSLATE") != "binary" and _only_llvm_ops(module.operation):
        to_string, capsule_pointer, free = _c_api()
        text = to_string(capsule_pointer(module.operation._CAPIPtr, _CAPSULE))
        try:
            return ctypes.string_at(text)
        finally:
            free(text)
    path.write_text(module.operation.get_asm())
    return toolchain.run("mlir-translate", ["--mlir-to-llvmir", str(path)])
