"""Every environment variable Kina reads, in one table: its values, default and effect.

In:  the process environment, at the moment a knob is read: `get("KINA_OPT_LEVEL")`.
Out: the knob's value, parsed (an int, a Path, a choice, True), or its default when
     the variable is unset or empty (`None` where the default is worked out by the
     code that reads it, like the cores for KINA_NUM_THREADS).

Guarantees: this is a leaf module (it imports nothing from `kina`) and the only
module of `kina` that reads `os.environ` (tests/test_knobs.py greps for any other).
A knob is read each time it is used, never cached, so a variable set while the
program runs counts; and only where it is used, so a bad value of a knob that a
command does not use (KINA_OPT_LEVEL when `-O` is given, KINA_CC on a cache hit)
is no error. A bad value of a knob that is used is a `KnobError`, a ValueError of
one line naming the variable, what was expected and what it got
(`KINA_OPT_LEVEL: expected 0, 1, 2 or 3, got '7'`); kinac prints it as
`kinac: error: ...` and exits 1.

Tests and commands that want a knob for a while write it through `scoped`, not into
`os.environ`: the values are checked as `set` checks them, and the environment is as it
was after the block.

`python -m kina.knobs` prints the table as markdown: the README's Environment
section is that output, and a test keeps the two the same.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


class KnobError(ValueError):
    """An environment variable with a value its knob does not accept."""


@dataclass(frozen=True)
class Knob:
    name: str
    values: str  # what the variable accepts, as the table and the error message say it
    parse: Callable[[str], Any]  # a non-empty value to the knob's value; ValueError if bad
    default: str | None  # parsed like a value; None: the reading code decides, as `effect` says
    effect: str  # one line of markdown
    test_only: bool = False  # read by tests/, not by kina


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(text)
        return text
    return parse


def _integer(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or int(text) < least:
            raise ValueError(text)
        return int(text)
    return parse


def _present(text: str) -> bool:
    return True


KNOBS: dict[str, Knob] = {k.name: k for k in [
    Knob("KINA_OPT_LEVEL", "0, 1, 2 or 3", lambda t: int(_one_of("0", "1", "2", "3")(t)), "3",
         "the optimisation level of a build that gives none (`-O N` and `Options(opt_level=N)` override it, "
         "and then it is not read); `0` runs none of the optimisation passes"),
    Knob("KINA_CACHE_DIR", "a folder", lambda t: Path(t).expanduser(), "~/.cache/kina",
         "the folder of the compile cache; one that cannot be written is skipped, with one warning"),
    Knob("KINA_NO_CACHE", "0 or 1", lambda t: _one_of("0", "1")(t) == "1", "0",
         "`1`: compile afresh, neither reading nor writing the cache"),
    Knob("KINA_CC", "a command", str, None,
         "the C compiler that links the `.so` (default: `cc`, `gcc` or `clang`, the first on `PATH`)"),
    Knob("KINA_TRANSLATE", "in-process or binary", _one_of("in-process", "binary"), "in-process",
         "`binary`: translate MLIR to LLVM IR with the `mlir-translate` binary instead of in process "
         "(for work on the passes: a module the translator rejects then fails with a `ToolError` "
         "instead of crashing)"),
    Knob("KINA_NUM_THREADS", "a positive integer", _integer(1), None,
         "the threads a large call may use (default: the cores this process may run on); builds do not "
         "depend on it (a build for this machine cuts ops of static size into one part per core, at least 2)"),
    Knob("KINA_BUILD_JOBS", "a positive integer", _integer(1), None,
         "the `opt` and `llc` processes a build runs at once on the parts of a large module (a model's kernel "
         "is cut into up to 4 by function; default: the cores this process may run on); the parts, and so "
         "the bytes built, do not depend on it"),
    Knob("NO_COLOR", "any non-empty value", _present, None,
         "no colour in kinac's diagnostics, even on a terminal ([no-color.org](https://no-color.org))"),
    Knob("FORCE_COLOR", "any non-empty value", _present, None,
         "colour in kinac's diagnostics even when stderr is not a terminal (`NO_COLOR` wins)"),
    Knob("TERM", "a terminal type", str, None, "`dumb`: no colour in kinac's diagnostics"),
    Knob("KINA_FUZZ_EXAMPLES", "a non-negative integer", _integer(0), "0",
         "scale the hypothesis fuzzing in `tests/test_fuzz.py` (`make fuzz` uses 5000)", test_only=True),
    Knob("KINA_REAL_MODELS", "0 or 1", lambda t: _one_of("0", "1")(t) == "1", "0",
         "`1`: run the tests on real model files that take minutes (the Gemma 3 270M file against "
         "transformers, when its wheels are installed)", test_only=True),
]}


def get(name: str) -> Any:
    """The value of knob `name` now; `KnobError` if the variable's value is bad."""
    knob = KNOBS[name]
    text = os.environ.get(name, "")
    if not text:
        return None if knob.default is None else knob.parse(knob.default)
    try:
        return knob.parse(text)
    except ValueError:
        raise KnobError(f"{name}: expected {knob.values}, got {text!r}") from None


def set(name: str, text: str, what: str | None = None) -> None:
    """Give knob `name` the value `text` for this process (and the tools it starts), as a
    command-line flag does (`kina generate --threads 2`); a bad value is a `KnobError`
    naming `what` (the flag), or else the variable."""
    os.environ[name] = _checked(name, text, what)


@contextmanager
def scoped(**values):
    """Knobs set for the length of a block, then the environment as it was (on an error too):

        with knobs.scoped(KINA_NO_CACHE="1", KINA_CACHE_DIR=folder):
            ...

    Each value is checked as `set` checks it, all before any is set; it may be anything
    whose `str` the knob takes (a Path, an int), and None unsets the variable for the block.
    The variables are the process's (the tools it starts see them), so a block is not
    thread-safe against another that sets the same knobs."""
    texts = {name: None if value is None else _checked(name, str(value)) for name, value in values.items()}
    saved = {name: os.environ.get(name) for name in texts}
    try:
        for name, text in texts.items():
            _put(name, text)
        yield
    finally:
        for name, text in saved.items():
            _put(name, text)


def _checked(name: str, text: str, what: str | None = None) -> str:
    """`text` if knob `name` takes it, else a `KnobError` naming `what` (or the variable)."""
    knob = KNOBS[name]
    try:
        knob.parse(text)
    except ValueError:
        raise KnobError(f"{what or name}: expected {knob.values}, got {text!r}") from None
    return text


def _put(name: str, text: str | None) -> None:
    if text is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = text


def markdown() -> str:
    """The knob table as the README's Environment section shows it."""
    rows = ["| variable | values | default | effect |", "| --- | --- | --- | --- |"]
    for k in KNOBS.values():
        default = "" if k.default is None else f"`{k.default}`"
        rows.append(f"| `{k.name}` | {k.values} | {default} | {'(tests) ' if k.test_only else ''}{k.effect} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
