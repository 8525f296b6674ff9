"""Parse Kina source into an AST.

In:  source text (str, or bytes that must be UTF-8) and a filename for locations.
Out: an `ast.Program`; nothing is type-checked yet, and a type parameter (`fn[T]`)
     is still a name in the types that use it (`check` gives it its dtype). Its `use`s
     are paths as written: this module reads no file (`uses.py` does).

Guarantees: every failure is a `KinaError` located at the offending character or
token, saying what was expected and what was found (never a Lark traceback).
Nesting deeper than `MAX_DEPTH` is refused up front, so recursion stays bounded.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import fields
from functools import lru_cache
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from . import ast, ops
from ..errors import KinaError, Loc
from .types import Dim

MAX_DEPTH = 200  # parentheses / operator nesting; far beyond any real program


@lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = (Path(__file__).parent / "grammar.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


@lru_cache(maxsize=1)
def words() -> frozenset[str]:
    """The words of the language, grammar.lark's literals that are names (let, fn, tensor,
    exp, sum, axis, use, ...): no function may be named so."""
    return frozenset(t.pattern.value for t in _parser().terminals
                     if t.pattern.type == "str" and t.pattern.value[0].isalpha())


def parse(source: str | bytes, filename: str = "<string>") -> ast.Program:
    text = _decode(source, filename)
    _check_depth(text, filename)
    try:
        tree = _parser().parse(text)
        _check_tree_depth(tree, filename, text)
        functions = _ToAst(filename).transform(tree)
    except UnexpectedInput as e:
        raise _syntax_error(e, text, filename).with_source(text) from None
    except VisitError as e:  # an error raised while building a node
        if isinstance(e.orig_exc, KinaError):
            raise e.orig_exc.with_source(text) from None
        raise
    except RecursionError:
        raise KinaError(Loc(filename, 1, 1), f"program is nested too deeply (more than {MAX_DEPTH} levels)",
                        source=text) from None
    uses = tuple(x for x in functions if isinstance(x, ast.Use))
    return ast.Program(tuple(x for x in functions if isinstance(x, ast.Function)), filename, text, uses)


def _shown(text: str) -> str:
    """A number's text as a message shows it: whole if short, else its ends and its length."""
    return text if len(text) <= 40 else f"{text[:16]}...{text[-8:]} ({len(text)} characters)"


def _decode(source: str | bytes, filename: str) -> str:
    if isinstance(source, bytes):
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as e:
            line = source.count(b"\n", 0, e.start) + 1
            col = e.start - (source.rfind(b"\n", 0, e.start) + 1) + 1
            raise KinaError(Loc(filename, line, col),
                            f"source is not valid UTF-8 (byte 0x{source[e.start]:02x} at offset {e.start})",
                            source=source.decode("utf-8", "replace")) from None
    source = source.removeprefix("\ufeff")  # a UTF-8 byte-order mark, as Python, clang and rustc accept it
    nul = source.find("\0")
    if nul >= 0:
        line = source.count("\n", 0, nul) + 1
        col = nul - (source.rfind("\n", 0, nul) + 1) + 1
        raise KinaError(Loc(filename, line, col), "source contains a NUL byte", source=source.replace("\0", " "))
    return source


def _check_depth(text: str, filename: str) -> None:
    """Refuse deep nesting before the recursive tree walks see it."""
    depth, line, col, in_comment = 0, 1, 0, False
    for i, ch in enumerate(text):
        col += 1
        if ch == "\n":
            line, col, in_comment = line + 1, 0, False
        elif in_comment:
            continue
        elif ch == "/" and text.startswith("//", i):
            in_comment = True
        elif ch == "(":
            depth += 1
            if depth > MAX_DEPTH:
                raise KinaError(Loc(filename, line, col), f"parentheses nested more than {MAX_DEPTH} deep",
                                source=text)
        elif ch == ")":
            depth = max(0, depth - 1)


def _check_tree_depth(tree: Tree, filename: str, text: str) -> None:
    """Refuse operator chains like `a + a + ... + a` whose tree is too deep to walk recursively.

    The LALR parser itself is iterative, so this walk (with its own stack) runs
    before anything recursive sees the tree; it points at the whole let value or
    result that is too deep.
    """
    stack = [(tree, 0, tree)]
    while stack:
        node, depth, top = stack.pop()
        if depth > MAX_DEPTH:  # point at the whole expression that is too deep
            raise KinaError(_loc(filename, top.meta), f"expression nested more than {MAX_DEPTH} deep; "
                                                      "split it into several let bindings", source=text)
        for child in node.children:
            if isinstance(child, Tree):
                stack.append((child, depth + 1, child if node.data in ("let", "tuple_let", "results") else top))


_TOKEN_NAMES = {"NAME": "a name", "INT": "an integer", "NUMBER": "a number", "$END": "end of file",
                "AXIS": "'axis=N'", "STRING": 'a file name in double quotes ("blocks.kina")'}
_NAME_END = re.compile(r"\b[A-Za-z_]\w*\s*\Z")  # a name just before a '(' that cannot start a call there
_OPERAND_START = {"LPAR", "NAME", "NUMBER", "MINUS"}  # what may begin an expression
_WORDS = ops.listing([op.name for op in ops.OPS if not op.symbol])  # the ops written as a word
# the ops written OP[...] x, by their token
_BRACKETED = {op.name.upper() for op in ops.OPS if op.family in ("concat", "transpose", "reshape", "slice", "convert")}
# the ops written OP(x, axis=N) or OP(x, y), by their token
_CALLS = {op.name.upper(): op for op in ops.OPS
          if op.family in ("softmax", "reduce") or (op.family == "elementwise" and not op.symbol)}


def _describe_terminal(name: str) -> str:
    if name in _TOKEN_NAMES:
        return _TOKEN_NAMES[name]
    for term in _parser().terminals:
        if term.name == name:
            return repr(term.pattern.value) if term.pattern.type == "str" else name.lower()
    return name


def _describe_token(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    return repr(str(tok))


def _syntax_error(e: UnexpectedInput, text: str, filename: str) -> KinaError:
    line, col = getattr(e, "line", -1), getattr(e, "column", -1)
    if isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if 0 <= e.pos_in_stream < len(text) else "?"
        shown = repr(ch) if ch.isascii() and ch.isprintable() else f"U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')})"
        if {"PLUS", "STAR", "AT"} <= set(e.allowed) and ch.isascii() and not ch.isalnum():  # after an operand
            return KinaError(Loc(filename, line, col), f"unexpected character {shown}: the operators are "
                                                       "'+', '-', '*', '/' and '@'")
        allowed = {"NAME"} if set(e.allowed) == {"NAME", "LPAR"} else e.allowed  # after let: let (a, b) is rarer
        return KinaError(Loc(filename, line, col), f"unexpected character {shown}{_expected(allowed, ', expected ')}")
    expected = set(getattr(e, "expected", ()) or ())
    if isinstance(e, UnexpectedEOF) or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
        # Lark's $END token borrows the position of the last real token: point just past it.
        tok = getattr(e, "token", None)
        if tok is not None and getattr(tok, "end_line", None):
            line, col = tok.end_line, tok.end_column
        else:
            lines = text.splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
        found = "end of file"
    else:
        found = _describe_token(e.token)
    loc = Loc(filename, line, col, line, col + (len(str(e.token)) if isinstance(e, UnexpectedToken) else 1))
    opened = _open_paren(e)
    if isinstance(opened, Token) and opened.type == "NAME" and {"COMMA", "RPAR"} <= expected:
        return KinaError(loc, f"expected ',' or ')' in the arguments of {opened}, found {found}")
    if isinstance(opened, Token) and opened.type == "LET" and {"COMMA", "RPAR"} <= expected:
        return KinaError(loc, f"expected ',' or ')' in the names of 'let (...) =', found {found}")
    if expected == {"LSQB"} and found == "'('" and (word := _innermost(e, _BRACKETED)):  # concat(a, b): not a function
        op = ops.BY_NAME[word.lower()]
        return KinaError(loc, f"{op.name} is an operation of the language, written {ops.FAMILIES[op.family]}; "
                              "it cannot be called as a function")
    if _innermost(e, ("LET", "LBRACE", "USE")) == "USE" and "SEMICOLON" in expected:
        if isinstance(e, UnexpectedToken) and e.token.type != "$END":
            loc = _just_after_previous_token(text, e.token.start_pos, filename)
        return KinaError(loc, f"expected ';' after the use, found {found}")
    if isinstance(e, UnexpectedToken) and e.token.type == "LPAR" and _NAME_END.search(text, 0, e.token.start_pos):
        return KinaError(loc, "a call cannot be the operand of concat, transpose, reshape, slice or convert as it "
                              "stands: write it in parentheses, (f(...))")
    if isinstance(e, UnexpectedToken) and str(e.token) == "use" and "LET" in expected:
        return KinaError(loc, "a use must come before the functions of the file")
    if "SEMICOLON" in expected and _inside_let(e):
        if isinstance(e, UnexpectedToken) and e.token.type == "RBRACE" and (paren := _call_on_next_line(e)):
            # `let b = a` then the result tuple `(b)`: the '(' would make a call, but the ';' is missing
            return KinaError(_just_after_previous_token(text, paren.start_pos, filename),
                             "expected ';' after let binding, found '('")
        if isinstance(e, UnexpectedToken) and e.token.type != "$END":
            loc = _just_after_previous_token(text, e.token.start_pos, filename)
        return KinaError(loc, f"expected ';' after let binding, found {found}")
    if "COMMA" in expected and "RPAR" in expected and not _inside_let(e):
        return KinaError(loc, f"expected ',' or ')' in the result tuple, found {found}")
    if _innermost(e, ("LET",)) and _stack_top(e) == "LET":  # let (a, b) = ... is the rarer form
        return KinaError(loc, f"expected a name, found {found}")
    if "LET" in expected and ("RBRACE" in expected or "LPAR" in expected):
        return KinaError(loc, f"expected a let binding or the result tuple '(...)', found {found}")
    if {"LPAR", "NAME"} <= expected <= _OPERAND_START:  # where an operand must start
        minus = "'-', " if "MINUS" in expected else ""  # an atom (concat's operands) has no unary minus
        return KinaError(loc, f"expected an expression (a name, a number, '(...)', {minus}{_WORDS}), found {found}")
    if expected == {"COMMA", "PLUS", "MINUS"}:  # only after OP(x: a results tuple would allow ')'
        op = _CALLS[_innermost(e, _CALLS) or "SOFTMAX"]
        if op.family == "elementwise":
            return KinaError(loc, f"expected ',' and the second operand of {op.name}, found {found}")
        return KinaError(loc, f"expected ', axis=N' after the {op.name} operand, found {found}")
    want = _expected(expected - {"USE"} if "LET" in expected else expected, "expected ")  # a function starts with let
    return KinaError(loc, f"{want}, found {found}" if want else f"unexpected {found}")


def _expected(terminals, prefix: str) -> str:
    """`prefix` + "A, B or C" for a short set of terminals; "" when the set is empty or too long to help."""
    names = sorted(_describe_terminal(t) for t in terminals or ())
    if not names or len(names) > 6:
        return ""
    return prefix + (names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1])


def _inside_let(e: UnexpectedInput) -> bool:
    """Is the parser inside a `let` statement, rather than in the result tuple?

    The LALR lookahead sets alone cannot tell (both may accept ';' after an
    expression in some states), so look at what has been shifted: the nearest
    'let' or '{' token on the parser's value stack decides."""
    return _innermost(e, ("LET", "LBRACE")) in ("LET", None)


def _open_paren(e: UnexpectedInput):
    """What stands before the innermost '(' still open: a NAME token for a call's arguments,
    LET for the names of a tuple let, another token or tree otherwise; None if no '(' is open."""
    state = getattr(getattr(e, "interactive_parser", None), "parser_state", None)
    stack = getattr(state, "value_stack", None) or []
    closed = 0  # ')' shifted but not yet reduced with its '('
    for i in range(len(stack) - 1, 0, -1):
        if isinstance(stack[i], Token) and stack[i].type == "RPAR":
            closed += 1
        elif isinstance(stack[i], Token) and stack[i].type == "LPAR":
            if not closed:
                return stack[i - 1]
            closed -= 1
    return None


def _call_on_next_line(e: UnexpectedInput) -> Token | None:
    """The '(' of the last call on the parser's stack whose '(' is on a later line than its name."""
    state = getattr(getattr(e, "interactive_parser", None), "parser_state", None)
    stack = getattr(state, "value_stack", None) or []
    for name, paren in reversed(list(zip(stack, stack[1:]))):
        if isinstance(name, Token) and isinstance(paren, Token) and name.type == "NAME" and paren.type == "LPAR":
            return paren if paren.line > name.line else None
    return None


def _stack_top(e: UnexpectedInput) -> str | None:
    """The type of the token last shifted, if the parser's stack ends with a token."""
    state = getattr(getattr(e, "interactive_parser", None), "parser_state", None)
    stack = getattr(state, "value_stack", None) or []
    return stack[-1].type if stack and isinstance(stack[-1], Token) else None


def _innermost(e: UnexpectedInput, types) -> str | None:
    """The type of the latest token of `types` on the parser's value stack (the
    operation being parsed), if any."""
    state = getattr(getattr(e, "interactive_parser", None), "parser_state", None)
    for item in reversed(getattr(state, "value_stack", None) or []):
        if isinstance(item, Token) and item.type in types:
            return item.type
    return None


def _just_after_previous_token(text: str, pos: int, filename: str) -> Loc:
    """Where a missing ';' belongs: right after the last code (not blank, not comment) before `pos`."""
    lines = text[:pos].split("\n")
    while len(lines) > 1 and not lines[-1].split("//")[0].strip():
        lines.pop()
    code = lines[-1].split("//")[0].rstrip()
    return Loc(filename, len(lines), len(code) + 1)


def _loc(filename: str, meta) -> Loc:
    return Loc(filename, meta.line, meta.column, meta.end_line, meta.end_column)


def _tok_loc(filename: str, tok: Token) -> Loc:
    return Loc(filename, tok.line, tok.column, tok.end_line, tok.end_column)


@v_args(meta=True)
class _ToAst(Transformer):
    """One method per grammar rule, each building that rule's node, but for the operations:
    `__default__` builds those from their entries in `ops.OPS`."""

    def __init__(self, filename: str):
        super().__init__()
        self.f = filename

    # start: use* function*
    def start(self, meta, items):
        return items

    # use: "use" STRING ";"
    def use(self, meta, items):
        (path,) = items
        return ast.Use(str(path)[1:-1], _tok_loc(self.f, path))

    # function: "let" NAME "=" "fn" [type_params] "(" _params ")" "->" "(" _types ")" "{" let* results "}"
    def function(self, meta, items):
        name, type_params, rest = items[0], items[1] or (), items[2:]
        params = tuple(x for x in rest if isinstance(x, ast.Param))
        types = tuple(x for x in rest if isinstance(x, ast.TypeAnn))
        lets = tuple(x for x in rest if isinstance(x, (ast.Let, ast.TupleLet)))
        results = rest[-1]
        return ast.Function(str(name), params, types, lets, results, _tok_loc(self.f, name), type_params)

    # type_params: "[" NAME ("," NAME)* "]"
    def type_params(self, meta, names):
        return tuple(ast.TypeParam(str(n), _tok_loc(self.f, n)) for n in names)

    # param: NAME ":" type
    def param(self, meta, items):
        name, ty = items
        return ast.Param(str(name), ty, _tok_loc(self.f, name))

    # type: "tensor" "<" NAME "," "[" [dim ("," dim)*] "]" "," "@" NAME ">"
    def type(self, meta, items):
        dtype, *dims, placement = items
        dims = [d for d in dims if d is not None]
        return ast.TypeAnn(str(dtype), tuple(d for d, _ in dims), str(placement), _loc(self.f, meta),
                           dim_locs=tuple(loc for _, loc in dims), dtype_loc=_tok_loc(self.f, dtype),
                           placement_loc=_tok_loc(self.f, placement))

    # dim: _dim_term ("+" _dim_term)*
    def dim(self, meta, terms):
        dim = Dim()
        for t in terms:
            dim = dim + (int(t) if t.type == "INT" else Dim.of(str(t)))
        return dim, _loc(self.f, meta)

    # let: "let" NAME "=" expr ";"
    def let(self, meta, items):
        name, value = items
        return ast.Let(str(name), value, _tok_loc(self.f, name))

    # let: "let" "(" NAME ("," NAME)* ")" "=" expr ";" -> tuple_let
    def tuple_let(self, meta, items):
        *names, value = items
        first, last = names[0], names[-1]
        span = Loc(self.f, first.line, first.column, last.end_line, last.end_column)
        return ast.TupleLet(tuple(map(str, names)), value, span, tuple(_tok_loc(self.f, n) for n in names))

    # ?atom: NAME "(" [expr ("," expr)*] ")" -> call
    def call(self, meta, items):
        name, *args = items
        return ast.Call(_loc(self.f, meta), str(name), tuple(a for a in args if a is not None),
                        callee_loc=_tok_loc(self.f, name))

    # results: "(" expr ("," expr)* ")"
    def results(self, meta, items):
        return tuple(items)

    def name(self, meta, items):
        return ast.Name(_tok_loc(self.f, items[0]), str(items[0]))

    # ?atom: NUMBER -> number
    def number(self, meta, items):
        text = str(items[0])
        # An integer of more than 309 digits is past every dtype; checked on the text, since Python
        # refuses to convert more than 4,300 digits to an int.
        too_large = len(text.lstrip("0")) > 309 if text.isdigit() else float(text) == float("inf")
        if too_large:  # past every dtype (F64 ends at 1.8e308): say so with the text as written
            raise KinaError(_loc(self.f, meta), f"the number {_shown(text)} is too large for any dtype "
                                                "(F64's largest finite value is 1.79769e+308)")
        value = int(text) if text.isdigit() else float(text)
        return ast.Number(_loc(self.f, meta), value)

    # ?unary: "-" unary -> neg; a minus written before a number is that number's sign
    def neg(self, meta, items):
        (operand,) = items
        if isinstance(operand, ast.Number):
            return ast.Number(_loc(self.f, meta), -operand.value)
        return ast.Neg(_loc(self.f, meta), operand)

    # an operation's rule, `-> NAME` for an entry of ops.OPS
    def __default__(self, data, children, meta):
        return _node(ops.BY_NAME[data].node, _loc(self.f, meta), children)


def _node(kind: type, loc: Loc, items: list) -> ast.Expr:
    """A `kind` node whose fields take the rule's items in order (grammar.lark writes an
    operation's parts in the order of its node's fields): an operand, an INT, a NAME (dtype=D,
    with its location), the INTs of a list (perm=[...]), or the dims of a list (dims=[...],
    with their locations)."""
    values = {}
    for f in fields(kind):
        if f.name in ("loc", "type", "dim_locs", "dtype_loc"):
            continue
        if f.type == "str":
            values[f.name], values[f"{f.name}_loc"] = str(items[0]), _tok_loc(loc.file, items[0])
            items = items[1:]
        elif f.type == "int":
            values[f.name], items = int(items[0]), items[1:]
        elif f.type == "tuple[int, ...]":
            n = _count(items, Token)
            values[f.name], items = tuple(int(i) for i in items[:n]), items[n:]
        elif f.type == "tuple[Dim, ...]":  # (Dim, Loc) pairs, or one None for an empty list
            n = _count(items, (tuple, type(None)))
            dims, items = [d for d in items[:n] if d is not None], items[n:]
            values[f.name], values["dim_locs"] = tuple(d for d, _ in dims), tuple(at for _, at in dims)
        else:  # an operand
            values[f.name], items = items[0], items[1:]
    return kind(loc, **values)


def _count(items: list, kinds) -> int:
    """How many items at the front of `items` are instances of `kinds`."""
    return next((i for i, x in enumerate(items) if not isinstance(x, kinds)), len(items))
