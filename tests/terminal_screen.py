"""A command at a pseudo-terminal, and the screen a person would be left looking at.

`run_in_pty(argv, script)` runs `kina ARGV...` (kina.__main__.kina, as the console script does)
as the session leader of a new pseudo-terminal, so that Ctrl-C typed there (\\x03) is a SIGINT
and Ctrl-D (\\x04) an end of input, as at a real terminal; `script` is a list of (wait for
this text, then, 0.3 s later, type this). It returns the exit status and everything the
terminal received. `screen(raw)` replays that as a terminal does (carriage return, line feed,
backspace, erase in line; other escape sequences ignored) and returns the rows left on the screen.
"""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
CODE = "import sys\nsys.argv[0] = 'kina'\nfrom kina.__main__ import kina\nsys.exit(kina())"


def run_in_pty(argv: list[str], script: list[tuple[str, str]] = (), timeout: float = 120) -> tuple[int, str]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: a new session whose controlling terminal is the pty
        env = {**os.environ, "PYTHONPATH": str(SRC), "TERM": "xterm"}
        os.execve(sys.executable, [sys.executable, "-c", CODE, *argv], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    raw, since, steps, deadline = b"", 0, list(script), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if steps and steps[0][0].encode() in raw[since:]:
            time.sleep(0.3)  # as a person reads before typing: the program is at its prompt, not just past it
            since = len(raw)
            os.write(fd, steps.pop(0)[1].encode())
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child has closed the terminal
                break
            if not data:
                break
            raw += data
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), raw.decode(errors="replace")


ESCAPE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b[()][A-Za-z0-9]|\x1b[=>]")


def screen(raw: str) -> list[str]:
    rows, row, col, i = [[]], 0, 0, 0
    while i < len(raw):
        m = ESCAPE.match(raw, i)
        if m:
            if m.group(2) == "K":  # erase in line: 0 (or none) to the end, 1 to the start, 2 all
                arg = m.group(1) or "0"
                line = rows[row]
                if arg == "0":
                    del line[col:]
                elif arg == "1":
                    line[:col] = [" "] * min(col, len(line))
                else:
                    line.clear()
            i = m.end()
            continue
        c = raw[i]
        i += 1
        if c == "\r":
            col = 0
        elif c == "\n":
            row += 1
            while len(rows) <= row:
                rows.append([])
        elif c == "\b":
            col = max(col - 1, 0)
        elif c >= " ":
            line = rows[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = c
            col += 1
    return ["".join(r).rstrip() for r in rows]
