"""A Pygments lexer for `.kina` files, so `pygmentize -l kina FILE.kina` highlights them.

In:  Kina source text (Pygments calls the lexer; pyproject.toml registers it under
     the `pygments.lexers` entry point as `kina`, for `*.kina`).
Out: Pygments tokens: `let`, `fn` and `use` keywords, the builtins (`concat`, `softmax`,
     `broadcast`, `exp`, `sum`, `tensor`, ...), dtypes and placements (`@host`) inside a tensor
     type, function names (where a function is defined, and where it is called: a name written
     right before '(', as in `rms_norm(x, g)`), a used file's name (`"blocks.kina"`), names,
     integers and floats, operators, punctuation and `//` comments.

Guarantees: the words, symbols and terminal patterns come from grammar.lark (the
language reference) and the dtypes and placements from `kina.frontend.types`, so a literal
added to the grammar is highlighted without touching this file; the only choices
made here are which words are keywords and which symbols are operators. Every
character the grammar accepts gets a non-Error token and the tokens concatenate
back to the source; a character the grammar rejects (`$`, `%`) is an Error token,
as a compiler would flag it. Imports lark and pygments, never `mlir`.
"""
from __future__ import annotations

from pathlib import Path

from lark import Lark
from pygments.lexer import RegexLexer, bygroups, include, words
from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, String, Whitespace

from ..frontend.types import DTYPES, PLACEMENTS


def _grammar_terminals() -> dict[str, object]:
    """Every terminal of grammar.lark by name: NAME, INT, COMMENT, WS and one per literal."""
    grammar = Lark((Path(__file__).parent.parent / "frontend" / "grammar.lark").read_text(), parser="lalr")
    return {t.name: t.pattern for t in grammar.terminals}


_TERMINALS = _grammar_terminals()
_LITERALS = sorted(p.value for p in _TERMINALS.values() if p.type == "str")
_NAME, _INT, _NUMBER, _COMMENT, _WS, _STRING = (_TERMINALS[n].to_regexp()
                                                for n in ("NAME", "INT", "NUMBER", "COMMENT", "WS", "STRING"))

# The choices: a grammar word is a builtin unless listed here; a symbol is punctuation unless an operator.
KEYWORDS = {"let": Keyword.Declaration, "fn": Keyword, "use": Keyword.Namespace}
ATTRIBUTES = ("axis", "perm", "dims", "start", "size", "dtype")  # of builtins: concat[axis=N], reshape[dims=[...]]
OPERATORS = ("@", "*", "/", "+", "-", "->", "=")

_WORDS = [w for w in _LITERALS if w[0].isalpha()]
BUILTINS = tuple(w for w in _WORDS if w not in KEYWORDS and w not in ATTRIBUTES)
PUNCTUATION = tuple(s for s in _LITERALS if s not in _WORDS and s not in OPERATORS)


def _number(lexer, match):
    """An INT or NUMBER: 2 is an integer, 0.5 and 1e-6 are floats."""
    text = match.group()
    yield match.start(), Number.Integer if text.isdigit() else Number.Float, text


class KinaLexer(RegexLexer):
    """Kina source: a tensor type's `<...>` is its own state, so `@host` there is a
    placement while `q @ k` outside it is the matmul operator."""

    name = "Kina"
    aliases = ["kina"]
    filenames = ["*.kina"]
    mimetypes = ["text/x-kina"]

    tokens = {
        "root": [
            # let NAME = fn(...): the function being defined
            (rf"(let)({_WS})({_NAME})({_WS})?(=)({_WS})?(fn)\b",
             bygroups(KEYWORDS["let"], Whitespace, Name.Function, Whitespace, Operator, Whitespace, KEYWORDS["fn"])),
            ("<", Punctuation, "type"),  # '<' opens a tensor type and nothing else
            include("common"),
        ],
        "type": [
            (">", Punctuation, "#pop"),
            (words(DTYPES, suffix=r"\b"), Keyword.Type),
            (rf"(@)({_WS})?({'|'.join(PLACEMENTS)})\b", bygroups(Name.Decorator, Whitespace, Name.Decorator)),
            include("common"),
        ],
        "common": [
            (_WS, Whitespace),
            (_COMMENT, Comment.Single),
            *((rf"{word}\b", token) for word, token in KEYWORDS.items()),
            (words(BUILTINS, suffix=r"\b"), Name.Builtin),
            (words(ATTRIBUTES, suffix=r"\b"), Name.Attribute),
            # f(x): a call. The grammar allows a blank before '(', but `concat[axis=0] k (v)` is two
            # operands, not a call, so only a name written right before '(' is taken for a function.
            (rf"{_NAME}(?=\()", Name.Function),
            (_NAME, Name),
            (_STRING, String),  # use "blocks.kina";
            (_NUMBER, _number),  # NUMBER also matches every INT
            (words(OPERATORS), Operator),
            (words(PUNCTUATION), Punctuation),
        ],
    }
