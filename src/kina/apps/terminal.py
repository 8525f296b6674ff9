"""What the commands show a person while they work: one status line, and the first run's build.

In:  a stream (stderr) and what is happening: loading, compiling a kernel, prefilling a prompt.
Out: `Status`: `show(text)` puts a transient status line on a terminal, `clear()` removes it,
     `note(line)` writes a line that stays; `watching_builds(status)`: while it is active, a
     kernel build that is not in the compile cache is announced before it starts (what is
     compiled, that it happens once, where it is kept) and its elapsed time ticks on the status
     line; `unescape(text)`: llama-cli's escapes (`\\n`, `\\t`, ...) in a flag's value.

Guarantees: the status line lives on stderr only while nothing else is being written: every
caller clears it before writing text (to stdout or stderr), so streamed text is never erased
and never shares its row. Off a terminal there is no status line at all, only `note` lines.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from .. import knobs

CLEAR = "\r\x1b[2K"  # to the row's start, erase the row


class Status:
    def __init__(self, stream=None, enabled: bool | None = None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if enabled is None else enabled
        self.shown = False
        self.lock = threading.Lock()  # the build ticker writes from its own thread

    def show(self, text: str) -> None:
        if not self.live:
            return
        width = shutil.get_terminal_size((80, 24)).columns - 1
        with self.lock:
            self.stream.write(CLEAR + text[:width])
            self.stream.flush()
            self.shown = True

    def clear(self) -> None:
        with self.lock:
            if self.shown:
                self.stream.write(CLEAR)
                self.stream.flush()
                self.shown = False

    def note(self, line: str) -> None:
        self.clear()
        with self.lock:
            self.stream.write(line + "\n")
            self.stream.flush()


def build_is_cached(kernel: Path, options) -> bool:
    """Whether the compile cache holds a whole entry for `kernel` built with `options` (the
    driver's own key and check: kina.driver.cache)."""
    from ..driver import cache
    if knobs.get("KINA_NO_CACHE"):
        return False
    entry = cache.cache_dir() / cache.cache_key(kernel.read_bytes(), str(kernel), options)
    return cache.entry_ok(entry / f"{kernel.stem or 'module'}.so", str(kernel))


def build_line(kernel: Path, options) -> str:
    """What the first run says before it compiles."""
    dtypes = ", ".join(f"{k}={v}" for k, v in options.dtypes)
    return (f"compiling {kernel.name} ({dtypes}) to machine code: this happens once for these settings, "
            f"then it is cached in {knobs.get('KINA_CACHE_DIR')}")


class _Build:
    """The context a kernel build runs in (kina.models.kernels.watch_build)."""

    def __init__(self, status: Status, kernel: Path, options):
        self.status, self.kernel, self.options = status, Path(kernel), options
        self.stop = threading.Event()

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.cold = not build_is_cached(self.kernel, self.options)
        if self.cold:
            self.status.note(build_line(self.kernel, self.options))
            if self.status.live:
                threading.Thread(target=self._tick, daemon=True).start()
        return self

    def _tick(self):
        while not self.stop.wait(0.25):
            self.status.show(f"compiling {self.kernel.name}: {time.perf_counter() - self.t0:.0f} s")

    def __exit__(self, kind, *rest):
        self.stop.set()
        if self.cold:
            self.status.clear()
            if kind is None:
                self.status.note(f"compiled {self.kernel.name} in {time.perf_counter() - self.t0:.1f} s")


@contextlib.contextmanager
def watching_builds(status: Status):
    """Announce every kernel build that starts in the block and is not in the compile cache."""
    from ..models import kernels
    before = kernels.watch_build
    kernels.watch_build = lambda kernel, options: _Build(status, kernel, options)
    try:
        yield
    finally:
        kernels.watch_build = before


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b",
            "f": "\f", "v": "\v", "0": "\0"}


def unescape(text: str) -> str:
    """`\\n`, `\\t`, `\\r`, `\\\\`, quotes and `\\xNN` as the characters they stand for (llama-cli's
    escapes: a shell passes `--stop "\\n\\n"` as backslashes); any other backslash stays."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if nxt == "x" and i + 3 < len(text) and _is_hex(text[i + 2:i + 4]):
                out.append(chr(int(text[i + 2:i + 4], 16)))
                i += 4
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _is_hex(s: str) -> bool:
    return len(s) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in s)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
