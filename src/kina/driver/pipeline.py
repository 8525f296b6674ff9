"""The compiler driver: an ordered table of stages from source text to a .so.

    ast -> typed -> mlir -> (every pass of kina.ir.passes.PASSES, in its order) -> llvm -> obj -> so

(`STAGE_NAMES` is the whole list; `kinac --list-passes` prints the passes.) Each
stage is a small function from one representation to the next: the front
end (`ast`, `typed`), the reference IR (`mlir`), then one stage per pass of
`kina.ir.passes.PASSES` (those `passes.selected` leaves out, at -O0 the
optimisations, are skipped), then LLVM IR, the object file and the .so. `--emit X`
stops after stage X (any pass included); `--dump-dir` writes every stage's output, numbered. A build that goes
past the MLIR stages starts `opt` and `llc` once the program has type-checked,
reading stdin, so that their start (loading LLVM) overlaps the lowering and the
passes; each gets its input when its stage comes, and is killed if the build ends
before. A large module (a model's kernel) is cut into a few modules by function
(`llvm_parts`) whose `opt` and `llc` run at once, up to one per core (KINA_BUILD_JOBS),
each part's `llc` as soon as its `opt` is done; the objects are linked into one (`cc -r`).
Parts are compiled at cheaper LLVM levels (`PARTS_OPT_LEVEL`, `PARTS_LLC_LEVEL`): -O3
cost a model's kernel seconds and bought it nothing measured.

In:  Kina source text and `Options`.
Out: the output of the requested stage; for `so`, a built .so with its sidecar
     (`<name>.json`) beside it.

Guarantees: user errors are `KinaError`; invalid reference IR, a pass that fails
or a pass that leaves invalid IR is an `InternalError` naming the pass, with a
reproducer file (the pass's input and the command that reruns it); a failing external tool is a
`ToolError` with its stderr and the command to rerun. No work folder outlives a call,
on success or on error, but for a ToolError's (just the files its repro command names).
Builds go through the compile cache in `kina.driver.cache`; `kina.compile_file` and
`kina.compile_source` are `kina.driver.api`'s.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from .. import abi, knobs
from ..version import __version__
from ..frontend import ast, check as _check, syntax
from ..frontend.axes import independent_axes
from ..errors import InternalError, ToolError
from ..runtime import cpu
from ..ir.passes import PASSES, Pass, PassError, selected, source_loc, uses_type
from . import interrupts, llvm_parts, toolchain, translate
from .interrupts import remove_temporary
from .options import Options, target_cores  # (Options lives in its own light module: a cache hit needs no MLIR)


@dataclass
class Build:
    """What flows through the stages: each stage fills in its own field."""

    source: str
    filename: str
    options: Options
    workdir: Path
    program: ast.Program | None = None
    module: Any = None  # mlir.ir.Module
    llvm_ir: bytes = b""
    obj: bytes = b""
    so_path: Path | None = None
    until: str = "so"
    # the types of the passes' `only_for` that the reference IR mentions (no pass brings in another)
    mentions: frozenset = frozenset()
    # tool name -> toolchain.Started, waiting for its input; "parts" -> the toolchain.Chains of a split module
    started: dict = field(default_factory=dict)

    @cached_property
    def passes(self) -> list[Pass]:
        """The passes this build runs, in order: `passes.selected`, the one place that
        says which (at -O0 none of the optimisations), with the options of the target CPU."""
        return selected(self.options.opt_level, self.options.pass_options, cpu.target_flags(self.options.cpu),
                        target_cores(self.options.cpu))

    @property
    def target_cpu(self) -> str:
        """The CPU's LLVM name: this machine's for "native"."""
        return toolchain.host()[1] if self.options.cpu == "native" else self.options.cpu

    @property
    def target_args(self) -> list[str]:
        """`opt`/`llc` target flags. For "native" LLVM's own `-mcpu=native`, which also
        turns off the features this CPU's name implies but the machine does not have
        (a znver4 under a hypervisor that hides AVX-512 must not get AVX-512 code)."""
        return [f"-mcpu={self.options.cpu}"]


def _stage_ast(b: Build) -> None:
    b.program = syntax.parse(b.source, b.filename)


class SpecializationError(ValueError):
    """A bad `dtypes`/`dims` argument (an unknown name, a value of the wrong kind)."""


def _stage_typed(b: Build) -> None:
    try:
        dtypes, dims = dict(b.options.dtypes), dict(b.options.dims)
        b.program = _check.check(b.program, dtypes=dtypes, dims=dims)
    except (TypeError, ValueError) as e:
        raise SpecializationError(str(e)) from None


def _stage_mlir(b: Build) -> None:
    from mlir import ir
    from ..ir import lower
    b.module = lower.lower(b.program)
    try:
        b.module.operation.verify()
    except ir.MLIRError as e:
        raise InternalError(f"the reference IR does not verify:\n{e}",
                            _reproducer(b.filename, b.module.operation.get_asm(enable_debug_info=True,
                                                                               assume_verified=True))) from None
    # asked here, of the small reference IR, not of the loops' module when the pass comes (0.7 s for a model)
    b.mentions = frozenset(t for t in {getattr(p, "only_for", "") for p in PASSES} if t and uses_type(b.module, t))


def apply_pass(module, p: Pass, print_ir: bool = False, what: str = "the generated MLIR",
               replay: Callable[[], Any] | None = None, users_ir: bool = False) -> None:
    """Run pass `p` on `module`; a failure (or invalid IR after it) is an
    InternalError naming the pass, with a reproducer: its input, and the command
    that reruns it alone. `replay()` rebuilds that input (a module, as it was before
    `p`) when it is needed, so that a build that succeeds never prints its IR.

    With `users_ir` (kinac opt: the IR is the user's, not kinac's) a pass that
    refuses its input raises `PassError`, the user's to fix, and so does an
    upstream pipeline that fails on it; a Kina pass that raises or leaves invalid
    IR is still an internal error."""
    from mlir import ir
    try:
        p.apply(module, print_ir)
    except PassError as e:
        if users_ir:
            raise
        why = f"cannot take {what}: {e}"
    except ir.MLIRError as e:
        if users_ir and p.kind == "upstream":  # mlir-opt's own diagnostic, at its op
            first = e.error_diagnostics[0] if e.error_diagnostics else None
            raise PassError(p.name, first and source_loc(first.location),
                            f"{p.name}: {first.message if first else e}") from None
        why = f"failed on {what}:\n{e}"
    except Exception as e:  # a Kina pass that raises is a bug in that pass
        why = f"raised {type(e).__name__}: {e}"
    else:
        return
    before = replay().operation.get_asm(enable_debug_info=True, use_name_loc_as_prefix=True) if replay else \
        "// (the pass's input could not be rebuilt)\n"
    raise InternalError(f"pass '{p.name}' {why}", _reproducer(what, before, p)) from None


def replay_passes(start: Callable[[], Any], passes: list[Pass]) -> Callable[[], Any]:
    """A `replay` for `apply_pass`: the module `start()` makes, after `passes`."""
    def rebuild():
        module = start()
        for q in passes:
            q.apply(module)
        return module
    return rebuild


def _pass_stage(p: Pass) -> Callable[[Build], None]:
    def stage(b: Build) -> None:
        names = [q.name for q in b.passes]
        if getattr(p, "only_for", "") and p.only_for not in b.mentions:
            return  # a pass for a type the program does not use
        if p.name in names:  # else skipped at this level; run with the build's options for it
            from ..ir import lower
            at = names.index(p.name)
            apply_pass(b.module, b.passes[at], b.options.print_ir_after_all, b.filename,
                       replay_passes(lambda: lower.lower(b.program), b.passes[:at]))
    stage.__doc__ = p.summary
    return stage


# The LLVM levels of a module in parts (a model's kernel): opt at most -O2, llc at most -O1.
# On SmolLM2-135M Q4_1 they took 7.6 s less CPU than -O3 twice (of 15.2), for the same bits
# and the same decode and prefill speed (docs/log/2026-12-05-cold-build.md).
PARTS_OPT_LEVEL, PARTS_LLC_LEVEL = 2, 1


def _opt_args(b: Build, cap: int = 3) -> list[str]:
    return [f"-O{min(b.options.opt_level, cap)}", f"-mtriple={toolchain.host()[0]}", *b.target_args, "-S"]


def _llc_args(b: Build, cap: int = 3) -> list[str]:
    return [f"-O{min(b.options.opt_level, cap)}", f"-mtriple={toolchain.host()[0]}", *b.target_args,
            "-relocation-model=pic", "-filetype=obj"]


def _start_tools(b: Build, until: str) -> None:
    """Start `opt` (and `llc`) now, reading stdin, if the build goes that far."""
    if STAGE_NAMES.index(until) >= STAGE_NAMES.index("llvm"):
        b.started["opt"] = toolchain.Started("opt", [*_opt_args(b), "-", "-o", "-"])
    if STAGE_NAMES.index(until) >= STAGE_NAMES.index("obj"):
        b.started["llc"] = toolchain.Started("llc", [*_llc_args(b), "-", "-o", str(b.workdir / "out.o")])


def _tool(b: Build, tool: str, data: bytes, args: list[str], path: Path, out: list[str]) -> bytes:
    """Run `tool args path out` on `data` (written to `path`, which the repro command
    names), through the process started for it if there is one."""
    path.write_bytes(data)
    started = b.started.pop(tool, None)
    if started is None:
        return toolchain.run(tool, [*args, str(path), *out])
    return started.finish(data, [*args, str(path), *out])


def _stage_llvm(b: Build) -> None:
    raw = translate.to_llvm_ir(b.module, b.workdir / "lowered.mlir")
    parts = llvm_parts.split(raw) if STAGE_NAMES.index(b.until) > STAGE_NAMES.index("llvm") else None
    if parts is None:
        b.llvm_ir = _tool(b, "opt", raw, _opt_args(b), b.workdir / "raw.ll", ["-o", "-"])
        return
    for tool in ("opt", "llc"):  # started for one module: the parts run processes of their own
        if tool in b.started:
            b.started.pop(tool).cancel()
    chains, errs = [], []
    for i, part in enumerate(parts):
        raw_i, opt_i, obj_i = (b.workdir / f"{name}.part{i}.{ext}" for name, ext in
                               (("raw", "ll"), ("opt", "ll"), ("out", "o")))
        raw_i.write_bytes(part)
        chain = [("opt", [*_opt_args(b, PARTS_OPT_LEVEL), str(raw_i), "-o", str(opt_i)])]
        if STAGE_NAMES.index(b.until) >= STAGE_NAMES.index("obj"):
            chain.append(("llc", [*_llc_args(b, PARTS_LLC_LEVEL), str(opt_i), "-o", str(obj_i)]))
        chains.append(chain)
        errs.append(b.workdir / f"err.part{i}.txt")
    jobs = knobs.get("KINA_BUILD_JOBS") or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                            else os.cpu_count() or 1)
    b.started["parts"] = run = toolchain.Chains(chains, errs, jobs)
    run.wait(0)
    b.llvm_ir = b"".join(f"; part {i + 1} of {len(parts)}\n".encode() + (b.workdir / f"opt.part{i}.ll").read_bytes()
                         for i in range(len(parts)))


def _stage_obj(b: Build) -> None:
    obj = b.workdir / "out.o"
    run = b.started.get("parts")
    if run is None:
        _tool(b, "llc", b.llvm_ir, _llc_args(b), b.workdir / "opt.ll", ["-o", str(obj)])
    else:
        run.wait(1)
        del b.started["parts"]
        objs = [str(b.workdir / f"out.part{i}.o") for i in range(len(run.chains))]
        toolchain.run("cc", ["-r", "-nostdlib", "-o", str(obj), *objs])  # one relocatable object
    b.obj = obj.read_bytes()


def _stage_so(b: Build) -> None:
    obj = b.workdir / "out.o"
    if not obj.exists():
        obj.write_bytes(b.obj)
    so = b.workdir / f"{Path(b.filename).stem or 'module'}.so"
    symbols = _symbols(b.module)
    # a threaded entry calls kina_claim, kina_done and kina_wait, from the small C runtime (kina/runtime/)
    runtime = [str(abi.C_SOURCE), "-fPIC", "-O2"] if abi.CLAIM in symbols else []
    toolchain.run("cc", ["-shared", "-o", str(so), str(obj), *runtime, "-lm"])
    sidecar = {
        "format": abi.SIDECAR_FORMAT,
        "kina_version": __version__,
        "llvm_version": toolchain.llvm_version(),
        "source": b.filename,
        "cpu": b.target_cpu,
        "cpu_flags": cpu.target_flags(b.options.cpu),
        "so_size": so.stat().st_size,
        "so_sha256": hashlib.sha256(so.read_bytes()).hexdigest(),
        "functions": [{**_with_layouts(fn.sig, b.module).to_json(), "independent_axes": independent_axes(fn),
                       "threaded": abi.c_interface(fn.name, abi.THREADED) in symbols}
                      for fn in b.program.functions],
    }
    so.with_suffix(".json").write_text(json.dumps(sidecar, indent=1) + "\n")
    b.so_path = so


def _with_layouts(sig, module):
    """`sig` with the layouts its block-quantized parameters took in the build (the module
    attribute kina.layouts that fuse-dequant-matmul sets), for the runtime to pass them so."""
    from mlir import ir
    attrs = module.operation.attributes
    if "kina.layouts" not in attrs:
        return sig
    per_fn = ir.DictAttr(attrs["kina.layouts"])
    if sig.name not in per_fn:
        return sig
    found = ir.DictAttr(per_fn[sig.name])
    layouts = tuple(sorted((n, ir.StringAttr(found[n]).value) for n, _ in sig.params if n in found))
    return dataclasses.replace(sig, layouts=layouts)


def _symbols(module) -> set[str]:
    """The names of the symbols at the top of `module` (functions, in any dialect)."""
    from mlir import ir
    if module is None:
        return set()
    return {ir.StringAttr(op.attributes["sym_name"]).value for op in module.body.operations
            if "sym_name" in op.attributes}


def _render(b: Build, stage: str) -> str | bytes:
    """A stage's output as it is printed by --emit and written by --dump-dir."""
    if stage in ("ast", "typed"):
        return ast.dump(b.program)
    if stage in PASS_NAMES or stage == "mlir":
        from ..ir.irbuild import print_ir
        return print_ir(b.module, b.options.locations)
    if stage == "llvm":
        return b.llvm_ir.decode()
    if stage == "obj":
        return b.obj
    return str(b.so_path) + "\n"


PASS_NAMES = [p.name for p in PASSES]
STAGES: list[tuple[str, Callable[[Build], None]]] = [
    ("ast", _stage_ast), ("typed", _stage_typed), ("mlir", _stage_mlir),
    *[(p.name, _pass_stage(p)) for p in PASSES],
    ("llvm", _stage_llvm), ("obj", _stage_obj), ("so", _stage_so),
]
STAGE_NAMES = [name for name, _ in STAGES]
DUMP_EXT = {"ast": "txt", "typed": "txt", "mlir": "mlir", **{n: "mlir" for n in PASS_NAMES},
            "llvm": "ll", "obj": "o", "so": "txt"}


def run_stages(source: str | bytes, filename: str, until: str = "so", options: Options | None = None,
               workdir: Path | None = None, dump_dir: Path | None = None) -> Build:
    """Run the stage table up to and including `until`.

    Files go to `workdir` (a new temporary folder if None). A folder made here is
    removed when a stage fails or is interrupted, or when nothing was written to it;
    otherwise the caller owns it. After a ToolError it keeps just the files that the
    error's repro command names (none: no folder)."""
    options = options or Options()  # made per call, so KINA_OPT_LEVEL set at any time counts
    if until not in STAGE_NAMES:
        raise ValueError(f"until: expected one of {STAGE_NAMES}, got {until!r}")
    if options.cpu != "native" and options.cpu not in cpu.CPU_LEVELS:
        raise ValueError(f"cpu: expected 'native' or one of {', '.join(cpu.CPU_LEVELS)}, got {options.cpu!r}")
    made = workdir is None
    if made:
        with interrupts.deferred():  # made and tracked, or neither, whenever kinac is interrupted
            workdir = Path(tempfile.mkdtemp(prefix="kina-"))
            interrupts.track(workdir)
    b = Build(source, filename, options, Path(workdir), until=until)
    try:
        _run(b, source, until, dump_dir)
    except ToolError as e:
        if made:
            _keep_named(b.workdir, e.command)
            interrupts.untrack(b.workdir)
        raise
    except BaseException:
        if made:
            remove_temporary(b.workdir)
        raise
    finally:
        for started in b.started.values():  # a stage that failed, or --emit before it
            started.cancel()
    if made and STAGE_NAMES.index(until) < STAGE_NAMES.index("llvm"):
        remove_temporary(b.workdir)  # nothing was written there
    return b


def _keep_named(folder: Path, command: str) -> None:
    """Remove the files in `folder` that `command` does not name, then `folder` if it is empty."""
    named = set(shlex.split(command))
    for path in folder.iterdir():
        if str(path) in named:
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()


def _run(b: Build, source, until: str, dump_dir: Path | None) -> None:
    skipped = {p.name for p in PASSES} - {p.name for p in b.passes}
    for i, (name, stage) in enumerate(STAGES):
        stage(b)
        if name == "ast" and isinstance(source, bytes):
            b.source = b.program.source
        if name == "typed":  # the program is valid: start the LLVM tools the build will need
            _start_tools(b, until)
        if dump_dir is not None and name not in skipped:
            Path(dump_dir).mkdir(parents=True, exist_ok=True)
            out = _render(b, name)
            path = Path(dump_dir) / f"{i:02d}-{name}.{DUMP_EXT[name]}"
            tmp = path.with_name(f".{path.name}.tmp")  # whole files only, even if interrupted
            interrupts.track(tmp)
            tmp.write_bytes(out if isinstance(out, bytes) else out.encode())
            tmp.replace(path)
            interrupts.untrack(tmp)
        if name == until:
            break


def _reproducer(what: str, mlir_text: str, p: Pass | None = None) -> str:
    fd, path = tempfile.mkstemp(prefix="kina-repro-", suffix=".mlir")
    with os.fdopen(fd, "w") as f:
        f.write(f"// Reproducer for an internal kinac error on {what}.\n")
        if p is None:
            f.write(f"// Run: mlir-opt {path} --verify-diagnostics\n")
        else:
            spec = f"'{p.spec}'" if "{" in p.spec else p.spec
            f.write(f"// The input of pass '{p.name}'. Run: kinac opt {path} --passes {spec}\n")
            if p.kind == "upstream":
                f.write(f"// or: mlir-opt {path} --pass-pipeline='builtin.module({p.pipeline})'\n")
        f.write(mlir_text)
    return path
