"""Load a kinac-built .so through its sidecar: `load`, `Module`, `LoadError`.

In:  a .so built by kinac and its sidecar `<name>.json` (format `kina.abi.SIDECAR_FORMAT`:
     the function signatures, whether each has a threaded entry, the CPU it was built for,
     the .so's size and sha256).
Out: a `Module` whose attributes are callable `kina.runtime.calls.Function`s.

Guarantees: a .so is loaded only if its sidecar parses, describes these very bytes
(sha256) and asks for no CPU feature this machine lacks; every function the sidecar
lists must be in the .so (its threaded entry too, if it says it has one); else
`LoadError`, saying what to do. A closed module refuses calls (ValueError) rather than
crashing. Nothing in this package imports `mlir` or `lark`.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import threading
from pathlib import Path

from .. import abi
from ..frontend.types import Signature
from . import workers
from .calls import Function
from .cpu import cpu_flags


class LoadError(ValueError):
    """A .so that cannot be used: missing or mismatched sidecar, wrong CPU, missing symbol."""


class Module:
    """A loaded .so: one attribute per Kina function. Use `close()` or `with`."""

    def __init__(self, path: Path, sidecar: dict):
        self.path, self.sidecar, self.closed = path, sidecar, False
        self._teams: dict[int, workers.Team] = {}
        self._teams_lock = threading.Lock()
        try:
            self._lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise LoadError(f"{path}: cannot be loaded: {e}") from None
        self._run_sequence = workers.host_call(self._lib, abi.RUN_SEQUENCE)  # (CallSequence) or None
        self.functions: dict[str, Function] = {}
        for obj in sidecar["functions"]:
            sig = Signature.from_json(obj)
            try:
                cfunc = getattr(self._lib, abi.c_interface(sig.name))
            except AttributeError:
                raise LoadError(f"{path}: sidecar lists function '{sig.name}' but the .so has no "
                                f"{abi.c_interface(sig.name)}") from None
            threaded = None
            if obj.get("threaded"):
                try:
                    threaded = (getattr(self._lib, abi.c_interface(sig.name, abi.THREADED)),
                                getattr(self._lib, abi.c_interface(sig.name, abi.WORKSPACE)),
                                # an older .so has no counters function: all its workspace is zeroed
                                getattr(self._lib, abi.c_interface(sig.name, abi.COUNTERS), None),
                                # without a team entry (an older .so), each call starts its threads
                                getattr(self._lib, abi.exported(sig.name, abi.TEAM), None))
                except AttributeError:
                    raise LoadError(f"{path}: sidecar says function '{sig.name}' is threaded but the .so has no "
                                    f"threaded entry for it") from None
            self.functions[sig.name] = Function(self, sig, cfunc, obj.get("independent_axes", 0), threaded,
                                                # an older .so, or one built without team-entries, has none
                                                getattr(self._lib, abi.exported(sig.name, abi.PACKED), None))

    def __repr__(self) -> str:
        state = "closed" if self.closed else ", ".join(self.functions)
        return f"<kina module {self.path.name}: {state}>"

    def __getattr__(self, name: str) -> Function:
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"module {self.__dict__.get('path')} has no function {name!r} "
                             f"(it has: {', '.join(functions) or 'none'})")

    def __dir__(self):
        return [*super().__dir__(), *self.functions]

    def team(self, n: int) -> "workers.Team":
        """The `n` worker threads that run threaded calls of this .so (made on first use)."""
        with self._teams_lock:
            team = self._teams.get(n)
            if team is None or not team._threads:
                team = self._teams[n] = workers.Team(self._lib, n)
            return team

    def close(self) -> None:
        """Unload the .so; any later call raises ValueError instead of crashing."""
        if not self.closed:
            with self._teams_lock:
                for team in self._teams.values():  # their threads are in the .so's code
                    team.close()
                self._teams.clear()
            self.closed = True
            handle, self._lib = self._lib._handle, None
            import _ctypes
            _ctypes.dlclose(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load(path: str | Path) -> Module:
    """Load a kinac output (.so) through the sidecar beside it."""
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"{path}: no such shared object")
    sidecar_path = path.with_suffix(".json")
    if not sidecar_path.is_file():
        raise LoadError(f"{path}: its sidecar {sidecar_path.name} is missing; rebuild with kinac")
    try:
        sidecar = json.loads(sidecar_path.read_text())
        if sidecar.get("format") != abi.SIDECAR_FORMAT:
            raise ValueError(f"unknown format {sidecar.get('format')!r}")
        for obj in sidecar["functions"]:
            Signature.from_json(obj)
    except (ValueError, KeyError, TypeError) as e:
        raise LoadError(f"{sidecar_path}: not a valid kina sidecar ({e})") from None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if sidecar.get("so_sha256") != digest:
        raise LoadError(f"{sidecar_path.name} does not match {path.name}: it describes another build; rebuild with kinac")
    missing = sorted(set(sidecar.get("cpu_flags", [])) - set(cpu_flags()))
    if missing:
        raise LoadError(f"{path.name} was built for CPU {sidecar.get('cpu')} and uses {', '.join(missing)}, "
                        f"which this CPU lacks; rebuild here, or with --cpu x86-64 for a portable .so")
    return Module(path, sidecar)


__all__ = ["Module", "Function", "CallSequence", "LoadError", "load", "Dim", "TensorType"]
