"""Where a diagnostic is shown: whether a stream gets clang's colours (`use_color`).

The error types (`Loc`, `KinaError`, `InternalError`, `ToolError`) and the renderer that
formats every diagnostic live in the leaf `kina.errors`; they are imported here too, so
that code which imports them from this module, as all of Kina once did, still runs.

Guarantees: imports nothing from `kina` but the leaves `kina.errors` and `kina.knobs`
(for the colour variables).
"""
from __future__ import annotations

from .. import knobs
from ..errors import InternalError, KinaError, Loc, ToolError

__all__ = ["InternalError", "KinaError", "Loc", "ToolError", "use_color"]


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

