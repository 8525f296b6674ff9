"""One LLVM module's text as a few modules, by function, so that `opt` and `llc` run on them at once.

    define void @kina_f(...) { ... }                   part 0: kina_f and _mlir_ciface_kina_f defined,
    define void @_mlir_ciface_kina_f(...) { ... }              kina_g_threaded declared
    define void @kina_g_threaded(...) { ... }          part 1: kina_g_threaded and its wrappers defined,
    define void @kina_g_team(...) { ... }                      kina_f declared
    declare ..., attributes #0 = ..., !0 = ...          in every part

In:  LLVM IR text as `driver/translate.py` makes it (functions of external linkage, their
     declarations, attribute groups and metadata; perhaps private constants).
Out: `split(text)`: at most `MAX_PARTS` modules whose functions together are the input's,
     each defined in exactly one of them and declared in the others, every line outside
     a function body in all of them; None when the module is too small to be worth it or
     holds something a part cannot repeat (a global that is not a private constant, a
     function of local linkage, an alias).

Which part a function goes to: a small function (a C-interface wrapper, a team or packed
entry, a workspace sizing) goes with the functions it calls, so that it can still inline
them; then the groups are dealt to parts largest first, each to the part that is smallest
so far (the parts' lines within a few percent of each other for the model kernels). The
split depends on the text alone, never on the machine (its cores decide only how many
parts run at once), so a build's bytes do not either.

Guarantees: the parts, compiled and linked together, define the same symbols with the same
code as the whole module would, but for what LLVM does across functions of different
parts: it cannot inline one into another (only large functions are apart: they call no
other large function) or infer a callee's attributes; the values computed are the same.
"""
from __future__ import annotations

import re

MAX_PARTS = 4  # a kernel's decode and prefill bodies (plain and threaded, but for threads{copy=false}), a part each
MIN_BYTES = 1 << 20  # smaller modules (a few functions, under a second of opt and llc) stay whole
SMALL_LINES = 1000  # a function of fewer lines goes with the functions it calls

_DEFINE = re.compile(rb"^define ([^@]*)@([\w.$-]+|\"[^\"]*\")\(", re.M)
_REF = re.compile(rb"@([\w.$-]+)")
_GLOBAL = re.compile(rb"^@[\w.$-]+ = (private|internal) (unnamed_addr )?constant ", re.M)


def _functions(text: bytes):
    """[(name, start, end)] of each `define ... { ... }` (end after its closing line), in order;
    None if a definition is not of external linkage."""
    found = []
    for m in _DEFINE.finditer(text):
        if re.search(rb"\b(private|internal|linkonce\w*|weak\w*|available_externally)\b", m.group(1)):
            return None
        end = text.find(b"\n}\n", m.end())
        if end < 0:
            return None
        found.append((m.group(2).decode(), m.start(), end + 3))
    return found


def _declaration(header: bytes) -> bytes:
    """`define <sig> {` as `declare <sig>`: parameter names and attribute groups are kept (the parser takes both)."""
    line = header.rstrip()
    if line.endswith(b"{"):
        line = line[:-1].rstrip()
    return b"declare" + line[len(b"define"):] + b"\n"


def split(text: bytes) -> list[bytes] | None:
    if len(text) < MIN_BYTES:
        return None
    functions = _functions(text)
    if functions is None or len(functions) < 2:
        return None
    # anything else at the top that a part could not repeat: a global other than a private constant, an alias
    outside = b"".join(text[a:b] for a, b in _gaps(functions, len(text)))
    for line in outside.splitlines():
        if line.startswith(b"@") and not _GLOBAL.match(line + b" "):
            return None
    names = [n for n, _, _ in functions]
    index = {n: i for i, n in enumerate(names)}
    lines = [text.count(b"\n", s, e) for _, s, e in functions]
    parent = list(range(len(functions)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for i, (name, s, e) in enumerate(functions):
        if lines[i] >= SMALL_LINES:
            continue
        body = text[text.find(b"{", s):e]
        for ref in sorted({r.decode() for r in _REF.findall(body)} & index.keys()):
            a, b = root(i), root(index[ref])
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(functions)):
        groups.setdefault(root(i), []).append(i)
    if len(groups) < 2:
        return None
    n_parts = min(MAX_PARTS, len(groups))
    sizes, members = [0] * n_parts, [[] for _ in range(n_parts)]
    for g in sorted(groups.values(), key=lambda g: (-sum(lines[i] for i in g), g[0])):
        p = min(range(n_parts), key=lambda p: (sizes[p], p))
        sizes[p] += sum(lines[i] for i in g)
        members[p] += g
    parts = []
    for mine in members:
        mine = set(mine)
        out, at = [], 0
        for i, (_, s, e) in enumerate(functions):
            out.append(text[at:s])
            if i in mine:
                out.append(text[s:e])
            else:
                out.append(_declaration(text[s:text.index(b"\n", s) + 1]))
            at = e
        out.append(text[at:])
        parts.append(b"".join(out))
    return parts


def _gaps(functions, n: int):
    at = 0
    for _, s, e in functions:
        yield at, s
        at = e
    yield at, n
