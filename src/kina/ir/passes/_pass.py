"""What a pass is: a name, a summary, typed options, and `run` on the MLIR bindings.

In:  nothing from the other pass modules; `mlir` is imported only when a pass runs.
Out: `KinaPass`, the base of Kina's own passes (like xDSL's `ModulePass`: the
     pass's command-line `name` and its options as dataclass fields, each declared
     with `option(default, doc)`); `UpstreamPass`, a named `mlir-opt` pipeline;
     `parse_pipeline`, which reads mlir-opt's `name{opt=value ...},name` syntax;
     `Unsupported`, which a pass raises on IR it cannot take. (`PipelineError` and
     `PassError`, below, are the compiler's error types, from `kina.errors`.)

Guarantees: an option value is checked when the pass is made (`MatmulLoops(unroll=0)`
raises `PipelineError`, as does `parse_pipeline("matmul-loops{unroll=0}")`), so a
pass that runs has valid options. A pass that raises `Unsupported` reports it as an
MLIR diagnostic at the op's location and fails; `apply` then raises `PassError`,
whose one line reads `FILE:LINE:COL: error: PASS: message`, as mlir-opt prints it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from ...errors import Loc, PassError, PipelineError


class Unsupported(Exception):
    """Raised by a pass's `run` on IR it cannot take: `op` (an `ir.Operation` or an
    OpView) is the op it points at, `message` says what was expected and what was found."""

    def __init__(self, op, message: str):
        super().__init__(message)
        self.op, self.message = op, message


def option(default, doc: str, *, check: Callable[[Any], bool] | None = None, expected: str = ""):
    """A pass option: a dataclass field with a default, a line of doc, and what a valid
    value is (`check`, described by `expected`, e.g. "an integer >= 1")."""
    return field(default=default, metadata={"doc": doc, "check": check, "expected": expected})


@dataclass(frozen=True)
class Option:
    """One option as --list-passes and the pipeline parser see it."""
    name: str  # on the command line: the field's name with '-' for '_'
    field: str
    type: type
    default: Any
    doc: str
    expected: str

    @property
    def shown(self) -> str:
        """`name=default` as --list-passes prints it and --passes takes it."""
        return f"{self.name}={show_value(self.default)}"


def _expected(o: dataclasses.Field, kind: type) -> str:
    if o.metadata.get("expected"):
        return o.metadata["expected"]
    return {bool: "true or false", int: "an integer", str: "a string"}.get(kind, kind.__name__)


def _parse_value(text: str, kind: type):
    """`text` as a value of `kind`, or raise ValueError."""
    if kind is bool:
        if text in ("true", "1"):
            return True
        if text in ("false", "0"):
            return False
        raise ValueError(text)
    return kind(text)


@dataclass(frozen=True)
class KinaPass:
    """A Kina pass: subclasses set `name`, `summary` and `optimisation` and declare
    their options as fields; `run(module_op)` rewrites a `builtin.module` in place."""

    name: ClassVar[str]
    summary: ClassVar[str]
    optimisation: ClassVar[bool] = False  # skipped at -O0
    only_for: ClassVar[str] = ""  # an element type: the pass runs only on modules that use it
    kind: ClassVar[str] = "kina"

    def __post_init__(self):
        for o in self.options():
            value = getattr(self, o.field)
            f = next(f for f in dataclasses.fields(self) if f.name == o.field)
            check = f.metadata.get("check")
            if type(value) is not o.type or (check is not None and not check(value)):
                raise PipelineError(f"{self.name}: option '{o.name}': expected {o.expected}, got {value!r}")

    @classmethod
    def options(cls) -> list[Option]:
        out = []
        for f in dataclasses.fields(cls):
            kind = type(f.default)
            out.append(Option(f.name.replace("_", "-"), f.name, kind, f.default, f.metadata.get("doc", ""),
                              _expected(f, kind)))
        return out

    @property
    def spec(self) -> str:
        """This pass as `--passes` takes it: its name, and the options that differ from the defaults."""
        changed = [f"{o.name}={show_value(getattr(self, o.field))}" for o in self.options()
                   if getattr(self, o.field) != o.default]
        return self.name + ("{" + " ".join(changed) + "}" if changed else "")

    def run(self, module_op) -> None:
        raise NotImplementedError(f"{type(self).__name__}.run")

    def apply(self, module, print_ir: bool = False) -> None:
        """Run this pass on `module` (an `mlir.ir.Module`) in a PassManager, which
        verifies the IR afterwards; `print_ir` prints it to stderr, as mlir-opt's
        --mlir-print-ir-after-all does. Raises `PassError` when the pass refuses
        its input and `mlir.ir.MLIRError` when it leaves invalid IR."""
        from mlir import ir
        from mlir.passmanager import PassManager
        refused = []

        def callback(op, pass_):
            try:
                self.run(op)
            except Unsupported as e:
                where = getattr(e.op, "operation", e.op)
                refused.append(PassError(self.name, source_loc(where.location), f"{self.name}: {e.message}"))
                where.location.emit_error(f"{self.name}: {e.message}")
                pass_.signal_pass_failure()

        with module.context:
            if self.only_for and not uses_type(module, self.only_for):
                return
            pm = PassManager("builtin.module")
            pm.add(callback, name=self.name, argument=self.name)
            if print_ir:
                pm.enable_ir_printing()
            try:
                pm.run(module.operation)
            except ir.MLIRError:
                if refused:
                    raise refused[0] from None
                raise


@dataclass(frozen=True)
class UpstreamPass:
    """A step that is an upstream `mlir-opt` pipeline on builtin.module; it has no options."""

    name: str
    summary: str
    pipeline: str
    only_for: str = ""
    optimisation: ClassVar[bool] = False
    kind: ClassVar[str] = "upstream"

    @staticmethod
    def options() -> list[Option]:
        return []

    @property
    def spec(self) -> str:
        return self.name

    def apply(self, module, print_ir: bool = False) -> None:
        from mlir.passmanager import PassManager
        with module.context:
            if self.only_for and not uses_type(module, self.only_for):
                return
            pm = PassManager.parse(f"builtin.module({self.pipeline})")
            if print_ir:
                pm.enable_ir_printing()
            pm.run(module.operation)


def show_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def source_loc(location) -> Loc | None:
    """The file position of an MLIR location: a name location's child, a fused
    location's first file position, a call site's callee; None for an unknown one."""
    if location.is_a_file():
        return Loc(location.filename, location.start_line, location.start_col)
    if location.is_a_name():
        return source_loc(location.child_loc)
    if location.is_a_callsite():
        return source_loc(location.callee)
    if location.is_a_fused():
        for inner in location.locations:
            found = source_loc(inner)
            if found:
                return found
    return None


def uses_type(module, name: str) -> bool:
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


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at each `sep` outside braces."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c == "{"
        depth -= c == "}"
        if c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def parse_pipeline(text: str, by_name: dict, fold: bool = False) -> list:
    """mlir-opt's pass list syntax, `name{opt=value opt=value},name`, as passes from
    `by_name` made with those options; with `fold`, a pass named again starts from the
    options given it before (`a{x=1},a{y=2}` is a{x=1 y=2}), as options for passes that run
    once. Raises `PipelineError` (one line) on an unknown pass or option, a bad value, or a
    malformed list."""
    out, by_name = [], dict(by_name)
    for item in _split_top(text, ","):
        item = item.strip()
        if not item:
            continue
        name, brace, rest = item.partition("{")
        name = name.strip()
        if name not in by_name:
            raise PipelineError(f"unknown pass '{name}': expected one of {', '.join(by_name)}")
        p = by_name[name]
        if not brace:
            out.append(p)
            continue
        if not rest.endswith("}") or "{" in rest[:-1] or "}" in rest[:-1]:
            raise PipelineError(f"{name}: expected options as {name}{{opt=value ...}}, got '{item}'")
        options = {o.name: o for o in p.options()}
        given = {}
        for pair in rest[:-1].split():
            key, eq, value = pair.partition("=")
            if key not in options:
                known = ", ".join(options) if options else "none"
                raise PipelineError(f"{name}: unknown option '{key}': expected one of: {known}")
            o = options[key]
            try:
                given[o.field] = _parse_value(value if eq else "true" if o.type is bool else "", o.type)
            except ValueError:
                raise PipelineError(f"{name}: option '{key}': expected {o.expected}, got '{value}'") from None
        out.append(dataclasses.replace(p, **given))
        if fold:
            by_name[name] = out[-1]
    if not out:
        raise PipelineError(f"no pass given: expected names from {', '.join(by_name)}")
    return out
