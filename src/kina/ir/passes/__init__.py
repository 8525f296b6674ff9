"""The pass table: every step from the reference IR to the LLVM dialect, in order.

In:  the reference IR from `kina.ir.lower` (upstream dialects on tensors).
Out: the LLVM dialect, ready for `mlir-translate`.

Kina's own passes are one module each in this package, each declaring itself as
a `KinaPass` (`_pass.py`): its command-line name, a summary, its options (typed
dataclass fields with defaults and doc), whether it is an optimisation, and a
docstring that shows a small IR before and after; most are built from the
bindings' rewrite patterns (`mlir.rewrite`). The upstream steps are `mlir-opt`
pipelines (`UpstreamPass`). Both run through MLIR's PassManager. `kinac
--list-passes` prints this table with each pass's options (and the values a build for
`--cpu` runs with, where `for_target` changes them); `kinac FILE --emit=NAME`
stops after any pass, `--dump-dir` writes the IR after each, `--print-ir-after-all`
prints it, and `kinac opt FILE.mlir --passes 'NAME{opt=value},...'` runs any of them
on MLIR text.

Guarantees: the IR is verified after every pass (a pass that breaks it is an
internal error naming the pass); a pass that cannot take its input says so with a
diagnostic at the op it cannot handle (`PassError`), never an exception of its
own; `selected(opt_level)` is the one place that says which passes a build runs
(at -O0 none of the optimisations, and the others alone still build a correct .so),
and with which options (`Options.pass_options`, `kinac --pass-options`).
"""
from __future__ import annotations

import dataclasses

from ._pass import (KinaPass, PassError, PipelineError, Unsupported, UpstreamPass, show_value, parse_pipeline, source_loc,
                    uses_type)
from .abi import Abi
from .broadcast_loops import BroadcastLoops
from .copies_to_linalg import CopiesToLinalg
from .exp_to_arith import ExpToArith
from .fence_nontemporal import FenceNontemporal
from .fuse_concat_matmul import FuseConcatMatmul
from .fuse_dequant_matmul import FuseDequantMatmul
from .in_place_copies import InPlaceCopies
from .matmul_loops import MatmulLoops
from .quantized_matmul_loops import QuantizedMatmulLoops
from .reuse_dying_operands import ReuseDyingOperands
from .split_k import SplitK
from .sum_loops import SumLoops
from .team_entries import TeamEntries
from .threads import Threads
from .transposed_views import TransposedViews

Pass = KinaPass | UpstreamPass

PASSES: tuple[Pass, ...] = (
    FuseConcatMatmul(),
    FuseDequantMatmul(),
    ReuseDyingOperands(),
    Abi(),
    UpstreamPass("bufferize", "one-shot bufferization: tensors to memrefs, in place where it can",
                 "eliminate-empty-tensors,one-shot-bufferize"),
    CopiesToLinalg(),
    TransposedViews(),
    SplitK(),
    Threads(),
    InPlaceCopies(),
    QuantizedMatmulLoops(),
    MatmulLoops(),
    SumLoops(),
    BroadcastLoops(),
    ExpToArith(),
    UpstreamPass("deallocate", "free every temporary", ",".join([
        "cse",  # merges equal subviews, so a slot copied onto itself folds away in canonicalize
        "canonicalize", "buffer-deallocation-pipeline", "convert-bufferization-to-memref"])),
    FenceNontemporal(),
    UpstreamPass("emulate-bf16", "bf16 arithmetic as f32 and its conversions as integer ops, so the .so needs "
                 "no __truncsfbf2 from a recent libgcc; only for modules that use bf16",
                 "arith-emulate-unsupported-floats{source-types=bf16 target-type=f32},arith-expand{include-bf16=true}",
                 only_for="bf16"),
    UpstreamPass("to-llvm", "loops, vectors, math, arith, memrefs and funcs to the LLVM dialect", ",".join([
        "convert-linalg-to-loops", "expand-strided-metadata", "lower-affine", "convert-scf-to-cf",
        "convert-vector-to-llvm", "convert-math-to-llvm", "convert-arith-to-llvm", "convert-index-to-llvm",
        "finalize-memref-to-llvm", "convert-func-to-llvm", "convert-cf-to-llvm", "reconcile-unrealized-casts"])),
    TeamEntries(),
)
BY_NAME = {p.name: p for p in PASSES}


def for_target(flags, cores: int | None = None) -> dict[str, Pass]:
    """The pass table by name, with the options a target with these ISA extensions
    (`kina.runtime.cpu.target_flags`) and, for a build for this machine, `cores` threads
    changes from the defaults:
    - without AVX-512 (16 vector registers of 32 bytes, not 32 of 64), matmul-loops' register
      tiles keep 64 bytes of sums per row, not 384 (4 rows x 384 bytes are 24 of AVX-512's
      registers and would spill; on an AVX2 Zen 1, 64 ran P = 32 prefill matmuls 1.35-1.6x
      faster: docs/performance.md);
    - threads cuts an op of static size into one part per core (at least 2), not 4: wider
      parts run faster (on 2 cores a SmolLM prefill of 32 took 7% less, an F16 decode 4%:
      docs/performance.md, "One part per core").
    The options change the loops only, never the bits."""
    table = dict(BY_NAME)
    if "avx512f" not in flags:
        table["matmul-loops"] = dataclasses.replace(BY_NAME["matmul-loops"], tile_row_bytes=64)
    if cores is not None:
        table["threads"] = dataclasses.replace(BY_NAME["threads"], parts=max(2, cores))
    return table


def selected(opt_level: int, with_options: str = "", flags=("avx512f",), cores: int | None = None) -> list[Pass]:
    """The passes a build at `opt_level` runs, in order: all of them, or at 0 none of the
    optimisations, with the options of a target with the ISA extensions `flags` and
    `cores` threads (`for_target`; the default, AVX-512 and no cores, is the table's own
    defaults); `with_options` (`--passes` text, `matmul-loops{fma=true}`) sets some of them
    on top, a pass named twice taking the options of both (the later wins where both give
    one). Raises `PipelineError` for a pass it names that does not run."""
    table = for_target(flags, cores)
    chosen = [table[p.name] for p in PASSES if opt_level > 0 or not p.optimisation]
    if with_options:
        given = {p.name: p for p in parse_pipeline(with_options, table, fold=True)}  # the last has them all
        for name in given.keys() - {p.name for p in chosen}:
            raise PipelineError(f"pass '{name}' does not run at -O{opt_level}: nothing to give options to")
        chosen = [given.get(p.name, p) for p in chosen]
    return chosen


def parse(text: str) -> list[Pass]:
    """`--passes` text, `name{opt=value ...},name`, as passes of this table with those options."""
    return parse_pipeline(text, BY_NAME)


def table(flags=("avx512f",), cores: int | None = None) -> str:
    """The pass table as `kinac --list-passes` prints it: one row per pass, then its options
    with their defaults; an option that a build for a target with the ISA extensions `flags`
    and `cores` threads runs with another value (`for_target`) says so, as `[this target: 64]`."""
    target = for_target(flags, cores)
    width = max(len(p.name) for p in PASSES)
    lines = [f"{'pass':<{width}}  {'kind':<8}  {'-O0':<4}  what it does"]
    for p in PASSES:
        lines.append(f"{p.name:<{width}}  {p.kind:<8}  {'off' if p.optimisation else 'on':<4}  {p.summary}")
        indent = " " * (width + 18)
        if p.kind == "upstream":
            lines.append(f"{indent}mlir-opt: {p.pipeline}")
        for o in p.options():
            used = getattr(target[p.name], o.field)
            note = f" [this target: {show_value(used)}]" if used != o.default else ""
            lines.append(f"{indent}{o.shown}: {o.doc} ({o.expected}){note}")
    lines.append("")
    lines.append("Options go in braces, as in mlir-opt: kinac opt FILE.mlir --passes 'matmul-loops{unroll=4},sum-loops'")
    return "\n".join(lines) + "\n"


def markdown() -> str:
    """The pass table as docs/compiler.md shows it, between its markers: one row per pass
    (name, kind, whether it runs at -O0, summary, options with their defaults), then each
    pass's options with their doc and valid values. Built from the declarations alone, so
    `python -m kina.ir.passes` prints it and a test keeps the doc the same; an option that
    a build for a CPU without AVX-512 runs with another value (`for_target`) says so."""
    esc = lambda text: text.replace("|", "\\|").replace("<", "&lt;")  # a table cell, not HTML
    no_avx512 = for_target(())
    rows = ["| pass | kind | at `-O0` | what it does | options (defaults) |", "| --- | --- | --- | --- | --- |"]
    details = []
    for p in PASSES:
        what = esc(p.summary) + (f" (mlir-opt: `{p.pipeline}`)" if p.kind == "upstream" else "")
        options = ", ".join(f"`{o.shown}`" for o in p.options())
        rows.append(f"| `{p.name}` | {'Kina' if p.kind == 'kina' else p.kind} | "
                    f"{'off' if p.optimisation else 'on'} | {what} | {options} |")
        if p.options():
            details += ["", f"`{p.name}`:"]
            for o in p.options():
                other = getattr(no_avx512[p.name], o.field)
                note = f"; without AVX-512, `{o.name}={show_value(other)}`" if other != o.default else ""
                details.append(f"- `{o.shown}`: {esc(o.doc)} ({esc(o.expected)}{note})")
    return "\n".join(rows + details) + "\n"
