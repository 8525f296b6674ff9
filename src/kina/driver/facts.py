"""Where the compile cache lives, what its keys hash of the compiler, and facts remembered in it.

In:  KINA_CACHE_DIR; kinac's own code (`COMPILER_CODE`); a fact to compute (`remembered`).
Out: `cache_dir()`; `compiler_digest()`, a hash of kinac's code; `remembered(kind, key,
     compute)`, a JSON value computed once per compiler and kept in `<cache>/.facts/`.

Guarantees: nothing here imports MLIR or the front end, so a process whose builds are all
cache hits (`kina.driver.options` checking pass options, `kina.models.kernels` reading a
kernel's parameters) can ask for facts without them; a fact is written whole or not at all.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from .. import knobs


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
