"""The compiler's public API: Kina source in, a loaded module out.

    mod = kina.compile_file("examples/storylm0_kv_step.kina")
    k_next, v_next, context = mod.kv_step(q, k_past, k_new, v_past, v_new, scale)

In:  Kina source (text or a file), `Options`, and a generic program's type parameters
     (`dtypes`) or dims fixed at compile time (`dims`).
Out: a loaded `kina.runtime.Module` whose attributes are the program's functions.

Guarantees: the build goes through the compile cache (`kina.driver.cache`); a .so
outside it is removed once loaded (it stays mapped), and a cache entry that does not
load is built again, once. Errors are those of the stages (`kina.driver.pipeline`).
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from .. import files
from .cache import build_so, cache_dir, discard
from .options import Options


def specialized(options: Options, dtypes=None, dims=None) -> Options:
    """`options` with `dtypes` ({"T": "F16"}) and `dims` ({"S": 128}) fixed as well."""
    for what, given in (("dtypes", dtypes), ("dims", dims)):
        if given is not None and not isinstance(given, Mapping):
            raise TypeError(f"{what}: expected a mapping of names to values, got {type(given).__name__}")
    return replace(options, dtypes=tuple(sorted({**dict(options.dtypes), **(dtypes or {})}.items())),
                   dims=tuple(sorted({**dict(options.dims), **(dims or {})}.items())))


def compile_source(text: str | bytes, filename: str = "<string>", options: Options | None = None, *,
                   dtypes: Mapping[str, str] | None = None, dims: Mapping[str, int] | None = None):
    """Compile Kina source to a loaded module whose attributes are the Kina functions.

    `dtypes` gives a generic program's type parameters (`{"T": "F16"}`) and `dims`
    fixes symbolic dims (`{"S": 128}`, a static specialisation); both are checked by
    the checker, and the compile cache keys on them."""
    options = options or Options()  # made per call, so KINA_OPT_LEVEL set at any time counts
    from ..runtime import LoadError, load
    options = specialized(options, dtypes, dims)
    so = build_so(text, filename, options)
    try:
        try:
            return load(so)
        except LoadError:
            if cache_dir() not in so.parents:
                raise
        # a checked entry that still does not load (dlopen fails): build it again, once
        shutil.rmtree(so.parent, ignore_errors=True)
        so = build_so(text, filename, options)
        return load(so)
    finally:
        discard(so)  # a .so outside the cache stays mapped after its files go


def compile_file(path: str | os.PathLike, options: Options | None = None, *,
                 dtypes: Mapping[str, str] | None = None, dims: Mapping[str, int] | None = None):
    """`compile_source` of the file at `path` (diagnostics name that file)."""
    path = Path(path)
    return compile_source(files.read_bytes(path, "the source"), str(path), options, dtypes=dtypes, dims=dims)
