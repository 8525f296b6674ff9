"""The pass table: every step from the reference IR to the LLVM dialect, in order.

In:  the reference IR from `kina.ir.lower` (upstream dialects on tensors).
Out: the LLVM dialect, ready for `mlir-translate`.

Each step is a named `Pass`. Kina's own are one module each in this package, a
function `run(module)` on the MLIR Python bindings whose docstring shows a small
IR before and after; upstream ones are `mlir-opt` pipelines run through the
PassManager. `kinac --list-passes` prints this table; `kinac FILE --emit=NAME` stops
after any pass, `--dump-dir` writes the IR after each, `--print-ir-after-all` prints
it, and `kinac opt FILE.mlir --passes NAME,...` runs any of them on MLIR text.

Guarantees: the IR is verified after every pass (a pass that breaks it is an
internal error naming the pass); passes marked `optimisation` are skipped at -O0,
and the others alone still build a correct .so. This module imports no `mlir`: a
pass's module is imported when the pass first runs.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Pass:
    name: str
    summary: str
    module: str = ""  # Kina's own: `kina.ir.passes.<module>.run`
    pipeline: str = ""  # upstream: a textual pass pipeline on builtin.module
    optimisation: bool = False  # skipped at -O0
    only_for: str = ""  # an element type (e.g. "bf16"): the pass runs only on modules that use it

    @property
    def kind(self) -> str:
        return "kina" if self.module else "upstream"

    def apply(self, module, print_ir: bool = False) -> None:
        """Run this pass on `module` (an `mlir.ir.Module`) in a PassManager, which
        verifies the IR afterwards; `print_ir` prints it to stderr, as mlir-opt's
        --mlir-print-ir-after-all does. Raises `mlir.ir.MLIRError` when a pass fails
        or leaves invalid IR."""
        from mlir.passmanager import PassManager
        with module.context:
            if self.only_for and not _uses_type(module, self.only_for):
                return
            if self.pipeline:
                pm = PassManager.parse(f"builtin.module({self.pipeline})")
            else:
                run = importlib.import_module(f"{__name__}.{self.module}").run
                pm = PassManager("builtin.module")
                pm.add(lambda op, _: run(op), name=self.name, argument=self.name)
            if print_ir:
                pm.enable_ir_printing()
            pm.run(module.operation)


def _uses_type(module, name: str) -> bool:
    """Does any op of `module` take or make a value whose type mentions `name`?"""
    from mlir import ir
    found = []

    def visit(op):
        if any(name in str(v.type) for v in [*op.operands, *op.results]):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    module.operation.walk(visit)
    return bool(found)


PASSES: tuple[Pass, ...] = (
    Pass("fuse-concat-matmul", "a one-row matmul that reads a concat along its column or contraction axis "
         "also writes the concat: one pass over each operand", module="fuse_concat_matmul", optimisation=True),
    Pass("reuse-dying-operands", "an elementwise op writes over an operand that dies there, so bufferization "
         "updates that buffer in place", module="reuse_dying_operands", optimisation=True),
    Pass("abi", "the C boundary: memref parameters (any outer strides, unit innermost stride), one out-buffer "
         "per result that the result is computed in, the kina_ prefix, llvm.emit_c_interface", module="abi"),
    Pass("bufferize", "one-shot bufferization: tensors to memrefs, in place where it can (upstream)",
         pipeline="eliminate-empty-tensors,one-shot-bufferize"),
    Pass("copies-to-linalg", "memref.copy to linalg.copy (loops, not calls to the memrefCopy runtime); "
         "self-copies erased", module="copies_to_linalg"),
    Pass("matmul-loops", "matmul generics to unroll-and-jammed vector loops, short rows in registers, "
         "fused copies with non-temporal stores; same summation order", module="matmul_loops", optimisation=True),
    Pass("sum-loops", "innermost-dim sums to vector partial sums added in a fixed order",
         module="sum_loops", optimisation=True),
    Pass("exp-to-arith", "f32 math.exp to arith ops (<= 1 ulp), the same bits vectorised or not",
         module="exp_to_arith", optimisation=True),
    Pass("deallocate", "free every temporary (upstream)", pipeline=",".join([
        "cse",  # merges equal subviews, so a slot copied onto itself folds away in canonicalize
        "canonicalize", "buffer-deallocation-pipeline", "convert-bufferization-to-memref"])),
    Pass("fence-nontemporal", "a fence before each return of a function that makes non-temporal stores",
         module="fence_nontemporal"),
    Pass("emulate-bf16", "bf16 arithmetic as f32 and its conversions as integer ops, so the .so needs no "
         "__truncsfbf2 from a recent libgcc; only for modules that use bf16 (upstream)", only_for="bf16",
         pipeline="arith-emulate-unsupported-floats{source-types=bf16 target-type=f32},arith-expand{include-bf16=true}"),
    Pass("to-llvm", "loops, vectors, math, arith, memrefs and funcs to the LLVM dialect (upstream)",
         pipeline=",".join([
             "convert-linalg-to-loops", "expand-strided-metadata", "lower-affine", "convert-scf-to-cf",
             "convert-vector-to-llvm", "convert-math-to-llvm", "convert-arith-to-llvm", "convert-index-to-llvm",
             "finalize-memref-to-llvm", "convert-func-to-llvm", "convert-cf-to-llvm", "reconcile-unrealized-casts"])),
)
BY_NAME = {p.name: p for p in PASSES}


def selected(opt_level: int) -> list[Pass]:
    """The passes a build at `opt_level` runs: all of them, or at 0 none of the optimisations."""
    return [p for p in PASSES if opt_level > 0 or not p.optimisation]


def table() -> str:
    """The pass table as `kinac --list-passes` prints it."""
    width = max(len(p.name) for p in PASSES)
    lines = [f"{'pass':<{width}}  {'kind':<8}  {'-O0':<4}  what it does"]
    for p in PASSES:
        lines.append(f"{p.name:<{width}}  {p.kind:<8}  {'off' if p.optimisation else 'on':<4}  {p.summary}")
    return "\n".join(lines) + "\n"
