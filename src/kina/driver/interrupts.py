"""Ctrl-C in kinac, and the files a command writes: all of them or none.

In:  SIGINT at any moment of a kinac command, from its first import to its last write.
Out: the one line `kinac: interrupted` on stderr and exit status 130, with no
     output file written, no work folder left and no tool still running; or, when
     it comes after the command's outputs were put in place (`write_outputs`),
     nothing at all: the work is done, and the command ends as it would have.

How: `install()`, among the first things kinac's entry points run (`kina.__main__`,
and `cli.main` for an older console script), replaces Python's SIGINT handler with
one that undoes what is in flight and exits at once: it kills the tools `track`ed
as running, removes the folders and files `track`ed as temporary, prints the line
and ends the process with `os._exit(130)`. It does not raise
KeyboardInterrupt: an exception can be caught and turned into another on its way
up (NumPy's C extension makes one raised while it imports an ImportError), while
this works wherever the interrupt lands, in any import or any `finally`.
Creating a temporary and tracking it is one step (`deferred()` holds an interrupt
that comes between the two until both are done); untracking one that is gone is
not needed, as removing it twice is harmless. Once the outputs are being renamed
into place, an interrupt is ignored.

Only the kinac program installs it: `import kina`, and `cli.main(argv)` called
in-process (by the tests), leave the signal handlers alone; then `track` does
nothing and the code's own `finally` clauses clean up after a KeyboardInterrupt.
"""
from __future__ import annotations

import _signal  # signal.py's C core: signal.py itself imports enum, milliseconds before `install`
import os
import sys

LINE = "kinac: interrupted"

# What the handler does now: None (not installed), "exit", "defer" or "ignore".
_mode: str | None = None
_pending = False  # an interrupt held by `deferred()`
_temporaries: set[str] = set()  # paths to remove on an interrupt
_running: set = set()  # subprocess.Popen objects to kill on an interrupt


def install(program: str = "kinac") -> None:
    """Take over SIGINT for the rest of this process (the entry points of kinac and of
    `kina generate` only); the line names `program`."""
    global _mode, LINE
    LINE = f"{program}: interrupted"
    if _mode is None:
        _mode = "exit"
        _signal.signal(_signal.SIGINT, _on_sigint)


def _on_sigint(signum, frame) -> None:
    global _pending
    if _mode == "ignore":
        return
    if _mode == "defer":
        _pending = True
        return
    _exit()


def _exit() -> None:
    """Undo what is in flight, print the line, exit 130. Never returns."""
    for proc in list(_running):
        try:
            proc.kill()
        except OSError:
            pass
    for path in sorted(_temporaries, reverse=True):  # a file inside a folder goes first
        _remove(path)
    announce()
    os._exit(130)


def _remove(path: str) -> None:
    """Remove a file or a folder tree, each entry that can be, with `os` alone: an
    interrupt can land while a module is half imported, and importing (shutil, say)
    here could then fail on it (functools without lru_cache yet) and print a
    traceback, not the line."""
    def quietly(fn, p):
        try:
            fn(p)
        except OSError:
            pass
    if os.path.isdir(path) and not os.path.islink(path):
        for top, dirs, names in os.walk(path, topdown=False):
            for name in names:
                quietly(os.unlink, os.path.join(top, name))
            for name in dirs:
                d = os.path.join(top, name)
                quietly(os.unlink if os.path.islink(d) else os.rmdir, d)
        quietly(os.rmdir, path)
    else:
        quietly(os.unlink, path)


def announce() -> None:
    """Print the one line."""
    if _mode is None:  # an in-process call: print where its caller may be capturing stderr
        print(LINE, file=sys.stderr)
        return
    try:
        os.write(2, (LINE + "\n").encode())  # one write: not cut in half
    except OSError:
        pass


def track(path) -> None:
    """Remove `path` (a file or a folder) if the process is interrupted."""
    if _mode is not None:
        _temporaries.add(os.fspath(path))


def untrack(path) -> None:
    _temporaries.discard(os.fspath(path))


def remove_temporary(path) -> None:
    """Remove a work or temp folder, which an interrupt then no longer needs to."""
    import shutil
    shutil.rmtree(path, ignore_errors=True)
    untrack(path)


def track_process(proc) -> None:
    """Kill `proc` (a subprocess.Popen) if the process is interrupted."""
    if _mode is not None:
        _running.add(proc)


def untrack_process(proc) -> None:
    _running.discard(proc)


class deferred:
    """`with deferred():` an interrupt waits until the block has ended (create, then track).
    (A class, not contextlib's decorator: contextlib is not imported before `install`.)"""

    def __enter__(self):
        global _mode
        self.active = _mode == "exit"
        if self.active:
            _mode = "defer"

    def __exit__(self, *exc):
        global _mode
        if self.active and _mode == "defer":
            _mode = "exit"
            if _pending:
                _exit()


def done() -> None:
    """The command's outputs are in place: an interrupt from now on changes nothing."""
    global _mode
    if _mode is not None:
        _mode = "ignore"


def write_outputs(files: dict) -> None:
    """Write each path's contents (bytes, or the file at a Path, copied), all or none.

    Each goes to a temporary file beside its target first; only when all are written
    are they renamed into place, with interrupts ignored from then on (`done`). A
    failure or an interrupt before that leaves no file, temporary or not."""
    temps = []
    try:
        for target, contents in files.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = target.with_name(f".{target.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
            with deferred():
                temps.append((temp, target))
                track(temp)
            with open(temp, "xb") as f:  # not mkstemp: the output gets the umask's mode, as any file
                f.write(contents if isinstance(contents, bytes) else contents.read_bytes())
        done()
        for temp, target in temps:
            temp.replace(target)
    finally:
        for temp, _ in temps:
            temp.unlink(missing_ok=True)
            untrack(temp)
