"""`use "FILE";`: the files a program brings in, and the functions a call in each may name.

In:  a parsed `ast.Program`, whose `uses` are paths as written.
Out: `load(program)`, a `Library`: every file the program reaches through `use`, each
     read and parsed once, and for each file (by the name its `Loc`s carry) its scope,
     the functions a call in it may name: its own, and those of every file it uses,
     directly or through others. `used_files(source, filename)`: the files `use` reaches
     and their bytes, found without parsing, for the compile cache's key.

Guarantees: a used path is relative to the folder of the file that uses it; a source
given as a string is named `<string>` (or whatever name it is given), whose folder is
the current directory. A file's locations carry its path as reached from the main
file's (`dir/blocks.kina`), and its text is added to the `texts` given to `load`, so a
diagnostic located there shows its own line. Every mistake is a `KinaError` with notes: a
file that cannot be read (at the `use`), a cycle of uses (at the use that closes it), one
function name in two files of a scope (at the use that brings in the second), a function
named like a word of the language (at its name; it could not be called). Only the
functions a program calls are checked (`check`, at each call); a used file's functions are
never entries of the .so. Imports no `mlir`; the parser (`syntax`, lark) only when a file is
parsed, so that the compile cache's key (`used_files`) costs neither.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import files
from ..errors import KinaError

if TYPE_CHECKING:
    from . import ast


@dataclass
class Library:
    """The files a program reaches through `use`, and the scope of each."""

    scopes: dict[str, dict[str, ast.Function]] = field(default_factory=dict)  # file -> name -> function

    def scope(self, fn: ast.Function) -> dict[str, ast.Function]:
        """The functions a call in `fn` may name: those of its file's scope."""
        return self.scopes.get(fn.loc.file, {})


def load(program: ast.Program, texts: dict[str, str] | None = None) -> Library:
    """Read and parse every file `program` uses, directly or not, and make each file's scope.
    The text of each file read is added to `texts` (by its name), as soon as it is read."""
    loader = _Loader(Library(), texts if texts is not None else {})
    loader.visit(program, _identity(program.filename), [])
    return loader.library


def resolve(using_file: str, path: str) -> str:
    """The name of the file `use "path"` in `using_file` reads: relative to its folder."""
    return os.path.normpath(os.path.join(os.path.dirname(using_file), path))


def _identity(name: str) -> str:
    """One key per file, however it is reached (dir/../blocks.kina, a link)."""
    return os.path.realpath(name)


class _Loader:
    def __init__(self, library: Library, texts: dict[str, str]):
        self.library, self.texts = library, texts
        self.names: dict[str, str] = {}  # identity -> the file's name, once visited

    def visit(self, program: ast.Program, key: str, trail: list[tuple[str, ast.Use]]) -> None:
        """Make the scope of `program`'s file, visiting each file it uses first. `trail` is the
        chain of uses from the main file to this one (the file each is in, and the use)."""
        self.names[key] = program.filename
        scope: dict[str, ast.Function] = {}
        for fn in program.functions:
            _check_name(fn)
            if fn.name in scope and trail:  # the main file's own: check.py says so, in its order
                raise KinaError(fn.loc, f"function '{fn.name}' is already defined",
                                [(scope[fn.name].loc, f"'{fn.name}' first defined here")])
            scope.setdefault(fn.name, fn)
        for use in program.uses:
            name = resolve(program.filename, use.path)
            used = _identity(name)
            chain = [k for k, _ in trail] + [key]
            if used in chain:
                self._cycle(trail[chain.index(used):], program.filename, use)
            if used not in self.names:
                self.visit(self._parse(name, use), used, trail + [(key, use)])
            for fname, fn in self.library.scopes[self.names[used]].items():
                if fname in scope and scope[fname] is not fn:
                    first, second = scope[fname], fn
                    raise KinaError(use.loc, f"function '{fname}' is defined in both {first.loc.file} and "
                                             f"{second.loc.file}", [(first.loc, f"'{fname}' defined here"),
                                                                    (second.loc, f"'{fname}' defined here")])
                scope[fname] = fn
        self.library.scopes[program.filename] = scope

    def _parse(self, name: str, use: ast.Use) -> ast.Program:
        try:
            data = files.read_bytes(name, "")
        except files.FileError as e:
            raise KinaError(use.loc, f"cannot use \"{use.path}\": {name}: {e.problem}") from None
        from . import syntax
        try:
            program = syntax.parse(data, name)
        except KinaError as e:
            e.notes.append((use.loc, f"in {name}, used here"))
            raise
        self.texts.setdefault(name, program.source)
        return program

    def _cycle(self, trail: list[tuple[str, ast.Use]], file: str, use: ast.Use) -> None:
        """`use` in `file` closes a cycle: the uses in `trail` lead from the file it names back to `file`."""
        chain = [self.names[k] for k, _ in trail] + [file]
        if len(chain) == 1:
            raise KinaError(use.loc, f"{file} uses itself")
        notes = [(u.loc, f"{self.names[k]} uses {resolve(self.names[k], u.path)} here") for k, u in trail]
        raise KinaError(use.loc, "cycle of uses: " + " uses ".join(chain + [chain[0]]), notes)


def _check_name(fn: ast.Function) -> None:
    from . import ops, syntax
    if fn.name in syntax.words():
        what = "an operation" if fn.name in ops.BY_NAME else "a word"
        raise KinaError(fn.loc, f"a function cannot be named '{fn.name}': it is {what} of the language, "
                                "so it could not be called")


# -- the files `use` reaches, without parsing: the compile cache's key -------------------------

# What may come before a file's functions, as grammar.lark has it: blanks, comments and uses.
_PREFIX_TOKEN = re.compile(r'\s+|//[^\n]*|(use)\b|"([^"\n]*)"|(;)')


def used_paths(text: str) -> list[str]:
    """The paths of the `use`s at the top of `text`, as written (the scan stops at the first
    thing that is not a blank, a comment or part of a use)."""
    paths, want, pos = [], "use", 0
    while m := _PREFIX_TOKEN.match(text, pos):
        pos = m.end()
        got = "use" if m[1] else "path" if m[2] is not None else ";" if m[3] else None
        if got is None:
            continue
        if got != want:
            break
        if got == "path":
            paths.append(m[2])
        want = {"use": "path", "path": ";", ";": "use"}[got]
    return paths


def used_files(source: str | bytes, filename: str) -> list[tuple[str, bytes | None]]:
    """Every file the uses of `source` (named `filename`) reach, directly or not, once each
    and in the order met, with its bytes (None if it cannot be read: the build will say so)."""
    out: list[tuple[str, bytes | None]] = []
    seen = {_identity(filename)}
    todo = [(filename, source)]
    while todo:
        file, data = todo.pop(0)
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        for path in used_paths(text):
            name = resolve(file, path)
            if _identity(name) in seen:
                continue
            seen.add(_identity(name))
            try:
                used = files.read_bytes(name, "")
            except files.FileError:
                used = None
            out.append((name, used))
            if used is not None:
                todo.append((name, used))
    return out
