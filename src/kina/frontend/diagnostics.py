"""Source locations and the one error type every stage raises.

In:  a location (file, line, column, optional end) and a message.
Out: `KinaError`, which renders as ``file:line:col: error: message``, then the
     source line and a caret (``^~~~``) under the span, then any notes; with
     ``render(color=True)`` the same text with clang's ANSI colours, for a
     terminal (`use_color` says when).

Guarantees: this is a leaf module (it imports nothing from `kina` but the leaf
`kina.knobs`, for the colour variables), and it is
the only place that formats a diagnostic, so every error looks the same.
`InternalError` is kept apart: it marks a compiler bug, never a user's mistake.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import knobs


@dataclass(frozen=True)
class Loc:
    """A 1-based source position, with an optional end on the same line or later."""

    file: str
    line: int
    col: int
    end_line: int = 0
    end_col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class KinaError(Exception):
    """A user's error: bad source, bad types, or a bad call. Carries a location."""

    def __init__(self, loc: Loc, message: str, notes: list[tuple[Loc, str]] | None = None,
                 source: str | None = None):
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.notes = list(notes or [])
        self.source = source
        self.sources: dict[str, str] = {}  # file -> its text, for locations in other files (`use`)

    def with_source(self, source: str) -> "KinaError":
        if self.source is None:
            self.source = source
        return self

    def with_sources(self, texts: "dict[str, str]") -> "KinaError":
        """Add the text of each file in `texts` (by the name its `Loc`s carry), so that an error
        or a note located in a used file shows that file's line; texts already known stay."""
        for file, text in texts.items():
            self.sources.setdefault(file, text)
        return self

    def render(self, source: str | None = None, color: bool = False) -> str:
        """The diagnostic and its notes; `color` adds ANSI colours and changes nothing else.
        Each location shows its own file's line (`sources`), else a line of `source`."""
        source = source if source is not None else self.source
        text = lambda loc: self.sources.get(loc.file, source)
        parts = [_render_one(self.loc, "error", self.message, text(self.loc), color)]
        parts += [_render_one(loc, "note", msg, text(loc), color) for loc, msg in self.notes]
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()


class InternalError(Exception):
    """A compiler bug: generated MLIR failed to verify, or a pass failed on it."""

    def __init__(self, message: str, reproducer: str | None = None):
        super().__init__(message)
        self.message = message
        self.reproducer = reproducer

    def __str__(self) -> str:
        text = f"internal compiler error: {self.message}\nThis is a bug in kinac, not in your program."
        if self.reproducer:
            text += f"\nA reproducer was written to {self.reproducer}"
        return text


class ToolError(Exception):
    """An external tool (mlir-opt, opt, llc, cc) failed: its stderr and a repro command."""

    def __init__(self, tool: str, command: str, stderr: str):
        super().__init__(f"{tool} failed")
        self.tool, self.command, self.stderr = tool, command, stderr

    def __str__(self) -> str:
        return (f"error: {self.tool} failed\n{self.stderr.rstrip()}\n"
                f"to reproduce, run:\n  {self.command}")


def use_color(stream) -> bool:
    """Whether diagnostics written to `stream` should be coloured.

    A non-empty NO_COLOR never colours (no-color.org); a non-empty FORCE_COLOR
    colours even a pipe (force-color.org; CPython 3.13's tracebacks give NO_COLOR
    the same precedence); otherwise only a terminal that is not TERM=dumb is.
    """
    if knobs.get("NO_COLOR"):
        return False
    if knobs.get("FORCE_COLOR"):
        return True
    if knobs.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


# clang's scheme: bold location, bold red "error:" and a bold message, a highlighted "note:" with a
# plain message, and a bold green caret. A note is bold cyan (gcc's), not clang's bold black, which
# vanishes on a dark terminal.
_STYLE = {"loc": "1", "message": "1", "error": "1;31", "note": "1;36", "caret": "1;32"}


def _paint(text: str, style: str, color: bool) -> str:
    return f"\033[{_STYLE[style]}m{text}\033[0m" if color else text


def _render_one(loc: Loc, kind: str, message: str, source: str | None, color: bool = False) -> str:
    head = f"{_paint(f'{loc}:', 'loc', color)} {_paint(f'{kind}:', kind, color)} {_paint(message, 'message', color and kind == 'error')}"
    if not source or loc.line <= 0:
        return head
    lines = source.split("\n")  # as the parser counts lines: \f, \v and the like are not line breaks here
    if loc.line > len(lines):
        return head
    # control characters would move the terminal's cursor: each shows as one U+FFFD, so the caret still lines up
    text = lines[loc.line - 1].removesuffix("\r")
    if "\r" in text[loc.col - 1:]:  # an old Mac line end: the line as a terminal would show it ends there
        text = text[:text.index("\r", loc.col - 1)]
    text = "".join("\ufffd" if c != "\t" and (c < " " or "\x7f" <= c < "\xa0") else c for c in text)
    if len(text) > 200:  # keep a very long line readable: show a window around the column
        start = max(0, loc.col - 100)
        text, col = ("..." if start else "") + text[start:start + 200], loc.col - start + (3 if start else 0)
    else:
        col = loc.col
    width = 1
    if loc.end_line == loc.line and loc.end_col > loc.col:
        width = loc.end_col - loc.col
    elif loc.end_line > loc.line:
        width = max(1, len(text) - col + 1)
    prefix = "".join(c if c == "\t" else " " for c in text[:max(col - 1, 0)])
    return f"{head}\n{text}\n{prefix}{_paint('^' + '~' * (min(width, 200) - 1), 'caret', color)}"

