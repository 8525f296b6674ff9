"""A family's kernel file, compiled: what its functions declare, and its builds.

In:  a kernel file (`Family.kernel`), and for a build the dtypes of its type parameters, the dims
     fixed at compile time, and the decoder's build options (`fma`, `threaded`, `pass_options`).
Out: `kernel_params(path)`: each function's parameters' declared dtypes, by name;
     `program(kernel, dtypes, dims, ...)`: the compiled module (`kina.compile_file`), once per
     process for the same arguments; `watch_build`, the hook a build runs in.

Guarantees: a model whose builds are all in the compile cache loads without the front end's
parser or MLIR: `kernel_params` is remembered in the cache by the file's bytes, and a cache hit
compiles nothing.
"""
from __future__ import annotations

import functools
from pathlib import Path

# Who watches kernel builds: None, or watch_build(kernel, options) -> a context manager that a
# build runs in (its `options` specialised: dtypes and dims fixed). kina.apps sets it to say,
# before a build that is not in the compile cache, what is compiled and where it is kept.
watch_build = None


@functools.lru_cache(maxsize=None)
def kernel_params(path: Path) -> dict[str, dict[str, str]]:
    """Each function of a kernel file: its parameters' declared dtypes (a dtype or a type parameter),
    by name. Parsed once per file's bytes and compiler, then remembered in the compile cache, so
    that a model whose builds are cached loads without the parser (lark)."""
    import hashlib
    from ..driver.facts import remembered
    data = Path(path).read_bytes()

    def parse() -> dict[str, dict[str, str]]:
        from ..frontend import syntax
        program = syntax.parse(data, str(path))
        return {fn.name: {p.name: p.type.dtype for p in fn.params} for fn in program.functions}

    return remembered("kernel-params", hashlib.sha256(data).hexdigest(), parse)


@functools.lru_cache(maxsize=None)
def program(kernel: Path, dtypes: tuple, dims: tuple, fma: bool = False, threaded: bool = True,
             pass_options: str = ""):
    """`kernel` compiled for these type parameters and dims (B = 1; S and P stay symbolic); with
    `fma`, its matmuls round each multiply-add once (matmul-loops{fma=true}) and its
    block-quantized ones sum each group first (quantized-matmul-loops{fma=true block-sums=true});
    `threaded`, a function with a threaded entry keeps no body of its own beside it
    (threads{copy=false}: the plain call runs the entry on one thread): half the code to
    compile, a cold build of SmolLM2-135M 35% shorter, for the same bits and, one thread or
    two, the same decode and prefill speed (docs/log/2026-12-05-cold-build.md); without
    `threaded`, no op of a symbolic size is split either (threads{symbolic=false}), so that,
    every static one being small, no function gets a threaded entry; `pass_options`: more pass
    options, on top of those (a pass named in both takes both)."""
    import kina
    from kina.driver.options import Options
    options = Options()
    fast = ["matmul-loops{fma=true}", "quantized-matmul-loops{fma=true block-sums=true}"]
    given = [*(fast if fma else []), "threads{copy=false}" if threaded else "threads{symbolic=false}"]
    if options.opt_level == 0:  # neither pass runs
        given = []
    if given or pass_options:
        options = Options(pass_options=",".join([*given, *filter(None, [pass_options])]))
    if watch_build is None:
        return kina.compile_file(kernel, options, dims=dict(dims), dtypes=dict(dtypes))
    from kina.driver.api import specialized
    with watch_build(kernel, specialized(options, dict(dtypes), dict(dims))):
        return kina.compile_file(kernel, options, dims=dict(dims), dtypes=dict(dtypes))
