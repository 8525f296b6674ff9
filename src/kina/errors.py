"""The compiler's error types, and the one renderer of a diagnostic.

In:  a location (file, line, column, optional end) and a message.
Out: `KinaError`, a user's error, which renders as ``file:line:col: error: message``,
     then the source line and a caret (``^~~~``) under the span, then any notes; with
     ``render(color=True)`` the same text with clang's ANSI colours, for a terminal
     (`kina.frontend.diagnostics.use_color` says when). Beside it, the errors that are
     not a program's: `InternalError` (a compiler bug, with a reproducer), `ToolError`
     (an external tool failed: its stderr and the command to rerun), `PipelineError`
     (a bad pass list or option) and `PassError` (a pass refused its input, at an op).

Guarantees: this is a leaf module (it imports nothing from `kina`), so every stage,
the passes and the driver raise the same types; and it is the only place that
formats a diagnostic, so every error looks the same. `InternalError` is kept apart:
it marks a compiler bug, never a user's mistake.
"""
from __future__ import annotations

from dataclasses import dataclass


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
        text = lambda loc: self.sources.get(loc.file, source)  # noqa: E731
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


class PipelineError(ValueError):
    """A bad pass list: an unknown pass or option, or a bad option value (one line)."""


class PassError(Exception):
    """A pass refused its input (`kina.ir.passes.Unsupported`): `loc` is the op's location
    as a source `Loc` (None when the op has none), `message` starts with the pass's name."""

    def __init__(self, pass_name: str, loc: Loc | None, message: str):
        super().__init__(message)
        self.pass_name, self.loc, self.message = pass_name, loc, message

    def __str__(self) -> str:
        return f"{self.loc or '<unknown>'}: error: {self.message}"


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

