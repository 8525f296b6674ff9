"""The compile cache: a .so built once per source, options and compiler, and checked on every hit.

In:  Kina source, its file name and `Options` (`build_so`).
Out: the path of a built .so with its sidecar beside it: a cache entry, or (outside the
     cache: KINA_NO_CACHE=1, a dump folder, or a cache that cannot be written) a work
     folder of its own that the caller removes with `discard`.

An entry is a folder <cache>/<key>/ holding <stem>.so and its sidecar <stem>.json,
which records the .so's size and sha256. The key hashes the source, the options,
kinac's version and its own code (`compiler_digest`), the MLIR/LLVM version, the
target CPU and the cores a native build cuts its ops for.

Guarantees: an entry is handed out only after both files are checked (the sidecar
parses, describes this build and matches the .so's bytes: `entry_ok`); a damaged one
is built again and replaced. Entries are written whole (a temp folder, then a rename),
and a cache folder that cannot be written is skipped with one `CacheWarning` per folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from .. import abi, knobs
from ..frontend import uses
from ..version import __version__
from . import interrupts, toolchain
from .interrupts import remove_temporary
from .facts import cache_dir, compiler_digest
from .options import Options, target_cores


class CacheWarning(UserWarning):
    """The compile cache cannot be written: kinac builds without it (said once per folder)."""


def cache_key(source: str | bytes, filename: str, options: Options) -> str:
    data = source if isinstance(source, bytes) else source.encode()
    _, host_cpu = toolchain.host()
    # every file `use` reaches is part of the program: editing one rebuilds
    used = [[name, None if text is None else hashlib.sha256(text).hexdigest()]
            for name, text in uses.used_files(data, filename)]
    meta = json.dumps({"kina": __version__, "compiler": compiler_digest(), "llvm": toolchain.llvm_version(),
                       "host_cpu": host_cpu, "cores": target_cores(options.cpu), "filename": filename,
                       "options": options.cache_key(), "uses": used},
                      sort_keys=True)
    return hashlib.sha256(meta.encode() + b"\0" + data).hexdigest()[:32]


def entry_ok(so: Path, filename: str) -> bool:
    """Whether the cache entry of `so` is whole: its sidecar parses, is a sidecar of
    this kinac for `filename`, and gives the size and sha256 of the .so's bytes."""
    try:
        sidecar = json.loads(so.with_suffix(".json").read_bytes())
        data = so.read_bytes()
    except (OSError, ValueError):  # missing, unreadable, not JSON (or not UTF-8)
        return False
    return (isinstance(sidecar, dict) and sidecar.get("format") == abi.SIDECAR_FORMAT
            and sidecar.get("kina_version") == __version__ and sidecar.get("source") == filename
            and isinstance(sidecar.get("functions"), list) and sidecar.get("so_size") == len(data)
            and sidecar.get("so_sha256") == hashlib.sha256(data).hexdigest())


def build_so(source: str | bytes, filename: str = "<string>", options: Options | None = None,
             dump_dir: Path | None = None) -> Path:
    """Build (or fetch a checked entry from the cache) a .so for `source`; returns its path.

    Outside the cache (KINA_NO_CACHE=1, `dump_dir`, or a cache that cannot be
    written) the .so is in a work folder of its own, which the caller removes
    (`discard`) once it is done with it."""
    options = options or Options()  # made per call, so KINA_OPT_LEVEL set at any time counts
    use_cache = not knobs.get("KINA_NO_CACHE") and dump_dir is None
    if use_cache:
        entry = cache_dir() / cache_key(source, filename, options)
        so = entry / f"{Path(filename).stem or 'module'}.so"
        if entry_ok(so, filename):
            return so
    from . import pipeline  # a miss: the compiler (lark, mlir) is loaded now, not for a hit
    b = pipeline.run_stages(source, filename, "so", options, dump_dir=dump_dir)  # through the module: tests count builds
    if not use_cache:
        return b.so_path
    try:
        _store(b.so_path, entry, filename)
    except OSError as e:
        _warn_unwritable(entry.parent, e)
        return b.so_path  # outside the cache: the caller's to discard
    except BaseException:
        remove_temporary(b.workdir)
        raise
    remove_temporary(b.workdir)
    return so


def _store(built: Path, entry: Path, filename: str) -> None:
    """Copy the .so at `built` and its sidecar into the cache as `entry`, atomically:
    into a temp folder beside it, then renamed. A damaged entry in the way is moved
    aside first; a whole one, written meanwhile by another process, is kept."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with interrupts.deferred():
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
        interrupts.track(tmp)
    try:
        for path in (built, built.with_suffix(".json")):
            shutil.copyfile(path, tmp / path.name)
        try:
            os.rename(tmp, entry)  # atomic: readers see the whole entry or none of it
        except OSError:
            if not entry.is_dir():
                raise
            if entry_ok(entry / built.name, filename):
                return  # another process's entry: as good as ours
            with interrupts.deferred():
                aside = Path(tempfile.mkdtemp(prefix=".damaged-", dir=entry.parent))
                interrupts.track(aside)
            os.rename(entry, aside / entry.name)
            os.rename(tmp, entry)
            remove_temporary(aside)
    finally:
        remove_temporary(tmp)


_warned: set[Path] = set()


def _warn_unwritable(folder: Path, e: OSError) -> None:
    if folder not in _warned:
        _warned.add(folder)
        warnings.warn(f"the compile cache {folder} cannot be written ({e.strerror or e}); "
                      "compiling without it", CacheWarning, stacklevel=3)


def discard(so: Path) -> None:
    """Remove a .so from `build_so` that is not a cache entry (its whole work folder)."""
    if cache_dir() not in so.parents:
        remove_temporary(so.parent)
