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
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from .. import abi, knobs
from ..frontend import uses
from ..version import __version__
from . import interrupts, toolchain
from .interrupts import remove_temporary
from .options import Options, target_cores


class CacheWarning(UserWarning):
    """The compile cache cannot be written: kinac builds without it (said once per folder)."""


def cache_dir() -> Path:
    return knobs.get("KINA_CACHE_DIR")


# what a build is made by: the compiler's packages, the leaves they read, and what links into a .so
# (editing the models, the apps or the runtime's Python builds nothing again)
COMPILER_CODE = ("frontend", "ir", "driver", "dtypes.py", "errors.py", "abi.py", "version.py", "knobs.py", "files.py",
                 "runtime/kina_threads.c", "runtime/kina_abi.h", "runtime/cpu.py")


@lru_cache(maxsize=1)
def compiler_digest() -> str:
    """A hash of kinac's own code (`COMPILER_CODE`), so that editing the compiler never serves a
    stale build. Read once per process: the code of a running process does not change."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent  # the kina package
    paths = []
    for part in COMPILER_CODE:
        where = root / part
        paths += [where] if where.is_file() else [p for p in where.rglob("*") if p.suffix in (".py", ".lark", ".c", ".h")]
    for path in sorted(paths):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


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


def remembered(kind: str, key: str, compute: Callable[[], Any]) -> Any:
    """`compute()` (a JSON value, a fact about kinac's input that only its code decides: pass
    options it takes, a kernel file's declared parameters), remembered for this compiler
    (`compiler_digest`): in this process, and in the cache folder (`.facts/KIND/HASH.json`), so
    that a later process finds it without loading what computing it needs (lark, mlir). What
    `compute` raises is raised and nothing is remembered; a fact file that cannot be read or
    written is as if absent (KINA_NO_CACHE=1: none is read or written)."""
    if (kind, key) in _facts:
        return _facts[kind, key]
    path = None
    if not knobs.get("KINA_NO_CACHE"):
        digest = hashlib.sha256(f"{compiler_digest()}\0{kind}\0{key}".encode()).hexdigest()[:32]
        path = cache_dir() / ".facts" / kind / f"{digest}.json"
        try:
            fact = json.loads(path.read_bytes())
            if isinstance(fact, dict) and fact.get("kind") == kind and fact.get("key") == key and "value" in fact:
                _facts[kind, key] = fact["value"]
                return fact["value"]
        except (OSError, ValueError):
            pass
    value = compute()
    _facts[kind, key] = value
    if path is not None:
        _write_fact(path, {"kind": kind, "key": key, "value": value})
    return value


def _write_fact(path: Path, fact: dict) -> None:
    """Write `fact` to `path` whole (a temp file, then a rename), or not at all."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(fact, f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


_facts: dict[tuple[str, str], Any] = {}


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
