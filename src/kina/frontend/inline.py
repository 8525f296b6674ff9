"""Calls, inlined as the caller is checked: the first transformation of the MLIR Toy
tutorial (chapter 4), done on the AST.

In:  a `Call` met by the checker of a function (`check._FunctionChecker`), the
     callee found in the scope of the caller's file (`uses.Library`).
Out: the call's lets, checked, appended to the caller's checked body; the call's
     result stands where the call was (a `Name` of it, or the value of the let the
     call is bound to).

How: the arguments are typed in the caller. Each type parameter of the callee takes
the dtype of an argument declared with it, and each dim name the caller's dim where
a parameter's type has the name alone: an int, a caller's name, or an affine dim such
as `S+1`. The parameter types so specialised must equal the arguments' types. The
callee is then checked afresh with those values, as an entry is (so an error in its
body is its own, with a note "in the call of f here"), and its checked lets are
renamed into the caller's.

Guarantees:
  * the checked program has no `Call` and no `TupleLet`: every stage after `check`
    sees one function, as if each callee had been written out by hand (the same
    ops, in that order);
  * inlined names never clash with the caller's, and say where they come from: a
    callee's let `ms` is `PREFIX.ms`, where PREFIX is `h` for `let h = f(...)`,
    `y.f` for a call inside the value of `let y`, `f` for a call in the result tuple
    or `let (a, b) = f(...)` (`f.2`, ... for the next); an argument that is not a name
    becomes the let `PREFIX.PARAM`. A name written in Kina has no '.';
  * inlined lets keep the callee's locations, so the IR of its ops points into the
    callee's source, in its own file when it was used;
  * recursion, direct or through other functions, is an error at the call that closes
    the cycle, with a note at each call of it.

Imports nothing from `check` (it is handed the checker) and no `mlir`.
"""
from __future__ import annotations

import dataclasses
import difflib

from . import ast, syntax
from ..errors import KinaError, Loc
from .types import DTYPES, Dim, TensorType

MAX_CALL_DEPTH = 32  # calls inside calls; far beyond any real program, and well within Python's stack


class Inliner:
    """The calls of one function being checked: `checker` is its `_FunctionChecker`, `calls`
    the chain of (function, call location) from the entry to it (the entry's location None)."""

    def __init__(self, checker, library, calls: tuple[tuple[ast.Function, Loc | None], ...]):
        self.checker, self.library, self.calls = checker, library, calls
        self.failed = False  # an error came from a callee, or from a recursive call

    # -- where a call may stand ------------------------------------------------------------
    def let(self, let: ast.Let | ast.TupleLet) -> None:
        """`let h = f(...)` or `let (a, b) = f(...)`: each name is bound to a result."""
        if not isinstance(let.value, ast.Call):
            raise KinaError(let.value.loc, f"only a call may stand on the right of 'let ({', '.join(let.names)}) = ...', "
                                           "to bind its results")
        call = let.value
        if isinstance(let, ast.TupleLet):
            results = self._inline(call, self._fresh(call.callee), len(let.names), let)
            for name, loc, value in zip(let.names, let.name_locs, results):
                self.checker.define(name, value, loc)
        else:
            (value,) = self._inline(call, self._fresh(let.name), 1)
            self.checker.define(let.name, value, let.loc)

    def value(self, call: ast.Call) -> ast.Name:
        """A call as an operand, or in the result tuple: its value is the let `y.f` (or `f`)."""
        binding = self.checker.binding
        name = self._fresh(f"{binding}.{call.callee}" if binding else call.callee)
        (value,) = self._inline(call, name, 1)
        self.checker.define(name, value, call.loc)
        return ast.Name(call.loc, name, type=value.type)

    # -- inlining ------------------------------------------------------------------------------
    def _inline(self, call: ast.Call, prefix: str, results: int, let: ast.TupleLet | None = None) -> list[ast.Expr]:
        """Inline `call`, whose `results` results are wanted, naming its lets `prefix.NAME`;
        returns the result expressions, typed, in terms of the caller's names."""
        callee = self._callee(call, results, let)
        args = [self._argument(arg, f"{prefix}.{p.name}") for p, arg in zip(callee.params, call.args)]
        dtypes, dims = _bind(call, callee, args)
        names = {}
        for p, arg, written in zip(callee.params, args, call.args):  # an argument that is not a name becomes a let
            if not isinstance(arg, ast.Name):
                self.checker.define(f"{prefix}.{p.name}", arg, written.loc)
            names[p.name] = arg.id if isinstance(arg, ast.Name) else f"{prefix}.{p.name}"
        checked = self._check(callee, dtypes, dims, call)
        for let in checked.body:
            names[let.name] = f"{prefix}.{let.name}"
            self.checker.define(names[let.name], _renamed(let.value, names), let.loc)
        self.checker.temporaries.extend(checked.sig.temporaries)
        return [_renamed(r, names) for r in checked.results]

    def _argument(self, arg: ast.Expr, name: str) -> ast.Expr:
        """`arg` typed in the caller; a call there is inlined with the prefix `name`, the
        let its value becomes when it is not a name."""
        if isinstance(arg, ast.Call):
            (value,) = self._inline(arg, name, 1)
            return value
        outer, self.checker.binding = self.checker.binding, name
        try:
            return self.checker.expr(arg)
        finally:
            self.checker.binding = outer

    def _callee(self, call: ast.Call, results: int, let: ast.TupleLet | None) -> ast.Function:
        """The function `call` names, if it may be called here with its arguments, for `results` results."""
        scope = self.library.scope(self.calls[-1][0])
        callee = scope.get(call.callee)
        where = call.callee_loc or call.loc
        if callee is None:
            raise KinaError(where, self._unknown(call, scope))
        cycle = next((i for i, (fn, _) in enumerate(self.calls) if _same(fn, callee)), None)
        if cycle is not None:
            self._recursion(call, callee, cycle)
        if len(self.calls) > MAX_CALL_DEPTH:
            raise KinaError(where, f"calls nested more than {MAX_CALL_DEPTH} deep: "
                                   f"{' calls '.join(fn.name for fn, _ in self.calls[:3])} calls ... {callee.name}")
        defined = [(callee.loc, f"{callee.name} defined here")]
        declared = len(callee.result_types)
        if let is not None and declared != results:
            raise KinaError(let.loc, f"'let ({', '.join(let.names)}) = ...' binds {results} name(s) but "
                                     f"{callee.name} returns {declared} result(s)", defined)
        if let is None and declared > 1:  # (none: the callee's own error, when it is checked)
            raise KinaError(call.loc, f"{callee.name} returns {declared} results, so its call is not a value: "
                                      f"bind them with 'let ({', '.join(f'r{i}' for i in range(declared))}) = "
                                      f"{callee.name}(...);'", defined)
        if len(call.args) != len(callee.params):
            raise KinaError(call.loc, f"{callee.name} takes {len(callee.params)} argument(s) but the call gives "
                                      f"{len(call.args)}", defined)
        return callee

    def _unknown(self, call: ast.Call, scope: dict[str, ast.Function]) -> str:
        name = call.callee
        if name in syntax.words():
            return f"'{name}' is a word of the language, not a function"
        if name in self.checker.env:
            on_next_line = call.callee_loc and call.args and call.args[0].loc.line > call.callee_loc.line
            return f"'{name}' is a tensor, not a function" + (
                " (is a ';' missing before the '(' on the next line?)" if on_next_line else "")
        close = difflib.get_close_matches(name, list(scope), n=1)
        return f"unknown function '{name}'" + (f" (did you mean '{close[0]}'?)" if close else "")

    def _recursion(self, call: ast.Call, callee: ast.Function, start: int) -> None:
        """`call` of `callee` closes a cycle that starts at `self.calls[start]`."""
        chain = [fn.name for fn, _ in self.calls[start:]]
        said = f"{chain[0]} calls itself" if len(chain) == 1 else \
            f"{chain[0]} calls " + ", which calls ".join(chain[1:] + [callee.name])
        notes = [(loc, f"{self.calls[i - 1][0].name} calls {fn.name} here")
                 for i, (fn, loc) in enumerate(self.calls) if i > start]
        self.failed = True
        raise KinaError(call.callee_loc or call.loc, f"recursive call: {said} (calls are inlined, so a function "
                                                     "may not call itself, directly or through others)", notes)

    def _check(self, callee: ast.Function, dtypes: dict[str, str], dims: dict[str, Dim], call: ast.Call) -> ast.Function:
        """`callee` checked afresh, specialised with the values the call gives it."""
        checker = type(self.checker)(callee, dtypes, dims, self.library, self.calls + ((callee, call.loc),),
                                     whence=("the arguments", "the arguments"))
        try:
            return checker.run()
        except RecursionError:  # the callee's expressions, inside the caller's, deeper than Python's stack
            self.failed = True
            raise KinaError(call.loc, f"the call of {callee.name} is nested too deeply in this expression for "
                                      f"{callee.name}'s own: bind it to a let of its own, "
                                      f"let y = {callee.name}(...);") from None
        except KinaError as e:  # the callee's own error; say which call led there (once: a cycle's notes say it)
            self.failed = True
            if all(loc != call.loc and loc != call.callee_loc for loc, _ in e.notes):
                e.notes.append((call.loc, f"in the call of {callee.name} here"))
            raise

    def _fresh(self, base: str) -> str:
        """`base`, or `base.2`, `base.3`, ...: a prefix that no name defined so far has."""
        taken = self.checker.env
        name, n = base, 1
        while name in taken or any(t.startswith(name + ".") for t in taken):
            n += 1
            name = f"{base}.{n}"
        return name


def _same(a: ast.Function, b: ast.Function) -> bool:
    return (a.loc.file, a.name) == (b.loc.file, b.name)


def _renamed(e: ast.Expr, names: dict[str, str]) -> ast.Expr:
    """`e` with each name replaced by its new name (types and locations kept)."""
    if isinstance(e, ast.Name):
        return dataclasses.replace(e, id=names[e.id])
    return ast.with_children(e, lambda c: _renamed(c, names))


def _bind(call: ast.Call, callee: ast.Function, args: list[ast.Expr]) -> tuple[dict[str, str], dict[str, Dim]]:
    """The values the arguments give the callee's type parameters and dim names; each
    argument's type must then be its parameter's, specialised with them."""
    generic = {t.name for t in callee.type_params}
    dtypes: dict[str, tuple[str, int]] = {}  # name -> (value, the argument it comes from)
    dims: dict[str, tuple[Dim, int]] = {}
    for i, (p, arg) in enumerate(zip(callee.params, args)):
        if len(p.type.dims) != arg.type.rank:
            raise _mismatch(call, callee, i, arg, {}, {})
        if p.type.dtype in generic:
            dtypes.setdefault(p.type.dtype, (arg.type.dtype, i))
        for d, actual in zip(p.type.dims, arg.type.dims):
            if d.symbol:
                dims.setdefault(d.symbol, (actual, i))
    for t in callee.type_params:
        if t.name not in dtypes and any(ann.dtype == t.name for ann in callee.result_types):
            raise KinaError(call.loc, f"{callee.name}: type parameter '{t.name}' cannot be bound from the arguments: "
                                      f"no parameter of {callee.name} has dtype {t.name}",
                            [(t.loc, f"'{t.name}' declared here"), (callee.loc, f"{callee.name} defined here")])
    for p in callee.params:
        for d, loc in zip(p.type.dims, p.type.dim_locs):
            for name in d.names:
                if name not in dims:
                    raise KinaError(call.loc, f"{callee.name}: dim name '{name}' cannot be bound from the arguments: "
                                              f"no parameter of {callee.name} has '{name}' alone as one of its dims",
                                    [(loc, f"'{name}' used here")])
    for i, (p, arg) in enumerate(zip(callee.params, args)):
        dtype = dtypes[p.type.dtype][0] if p.type.dtype in dtypes else p.type.dtype
        want = TensorType(dtype, tuple(d.substitute({n: v for n, (v, _) in dims.items()}) for d in p.type.dims),
                          p.type.placement)
        if dtype in DTYPES and want != arg.type:  # an unknown dtype is the callee's own error, when checked
            raise _mismatch(call, callee, i, arg, dtypes, dims, want)
    return {n: v for n, (v, _) in dtypes.items()}, {n: v for n, (v, _) in dims.items()}


def _mismatch(call: ast.Call, callee: ast.Function, i: int, arg: ast.Expr, dtypes: dict, dims: dict,
              want: TensorType | None = None) -> KinaError:
    """Argument `i` of `call` does not have its parameter's type (`want`, once specialised)."""
    p = callee.params[i]
    ann = p.type
    written = f"tensor<{ann.dtype}, [{', '.join(map(str, ann.dims))}], @{ann.placement}>"
    if want is None:
        expected = f"{written} (rank {len(ann.dims)})"
    else:
        used = [n for n in (ann.dtype, *(n for d in ann.dims for n in d.names)) if n in dtypes or n in dims]
        origin = [f"{n}={(dtypes.get(n) or dims[n])[0]} from '{callee.params[(dtypes.get(n) or dims[n])[1]].name}'"
                  for n in dict.fromkeys(used)]
        expected = str(want) + (f" ({written} with {', '.join(origin)})" if origin else "")
    return KinaError(call.args[i].loc, f"{callee.name}: argument '{p.name}' has type {arg.type}, expected {expected}",
                     [(p.loc, f"parameter '{p.name}' of {callee.name} declared here")])
