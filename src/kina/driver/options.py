"""A build's options, light enough for a cache hit: nothing here imports `mlir` or `lark`.

In:  the options of one build (`Options`): the optimisation level, the target CPU, what is
     printed, the type parameters and dims fixed at compile time, and options for some passes.
Out: `Options`, checked when made; `target_cores`, the cores a build cuts its ops for.

Guarantees: `pass_options` is checked against the pass table (`kina.ir.passes.selected`, which
imports MLIR) when it is made, a bad one a ValueError naming `pass_options`. A text the table
took is remembered in the compile cache (`facts.remembered`, keyed by the compiler's code), so
that a process whose builds are all cache hits (a model loading its compiled layers) imports
neither MLIR nor the front end: its options are checked by what an earlier process found.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from .. import knobs


@dataclass(frozen=True)
class Options:
    # 0: none of the optimisation passes, and LLVM at -O0; the default is KINA_OPT_LEVEL's, else 3
    opt_level: int = field(default_factory=lambda: knobs.get("KINA_OPT_LEVEL"))
    cpu: str = "native"  # "native" (this machine's CPU) or an x86-64 level: "x86-64", "x86-64-v2", -v3, -v4
    print_ir_after_all: bool = False
    locations: bool = False  # print loc(...) in emitted MLIR
    dtypes: tuple[tuple[str, str], ...] = ()  # type parameters fixed at compile time: (("T", "F16"),)
    dims: tuple[tuple[str, int], ...] = ()  # symbolic dims fixed at compile time: (("S", 128),)
    # options for some of the passes, as `kinac opt --passes` takes them: "matmul-loops{fma=true}"
    pass_options: str = ""

    def __post_init__(self):
        if not isinstance(self.pass_options, str):
            raise TypeError(f"pass_options: expected a string such as 'matmul-loops{{fma=true}}', "
                            f"got {type(self.pass_options).__name__}")
        if self.pass_options:
            check_pass_options(self.opt_level, self.pass_options)

    def cache_key(self) -> dict:
        d = asdict(self)
        d.pop("print_ir_after_all")
        d.pop("locations")
        return d


def check_pass_options(opt_level: int, text: str) -> None:
    """Raise ValueError("pass_options: ...") unless the passes that run at `opt_level` take
    `text` as options; a text found good is remembered (once per process, and in the cache)."""
    from .facts import remembered

    def check() -> bool:
        from ..ir.passes import PipelineError, selected
        try:
            selected(opt_level, text)
        except PipelineError as e:
            raise ValueError(f"pass_options: {e}") from None
        return True

    remembered("pass-options", f"{opt_level}\0{text}", check)


def target_cores(cpu_name: str) -> int | None:
    """The cores a build for `cpu_name` cuts its ops for (passes.for_target): for this machine
    ("native"), its cores (whatever threads a call later runs on: the build does not depend on
    KINA_NUM_THREADS or `--threads`); None for a portable build (the pass table's parts)."""
    return os.cpu_count() or 1 if cpu_name == "native" else None
