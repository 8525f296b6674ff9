"""Editors and terminals: the Pygments lexer (through its entry point), coloured
diagnostics (only on a terminal, never with NO_COLOR, tested through a pseudo-
terminal) and `python -m kina` as `kinac`.
"""
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from kina import knobs
from kina.driver import cli
from kina.frontend.diagnostics import KinaError, Loc, use_color

from conftest import EXAMPLES, ROOT

pygments = pytest.importorskip("pygments")
from pygments.lexers import get_lexer_by_name, get_lexer_for_filename  # noqa: E402
from pygments.token import Comment, Error, Keyword, Name, Number, Operator, Punctuation, String  # noqa: E402

SOURCES = sorted(EXAMPLES.glob("*.kina")) + sorted((ROOT / "src/kina/models").rglob("*.kina"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BAD = "let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n  (a @ a)\n}\n"
SYNTAX_ERROR = BAD.replace("@ a", "$ a")  # kinac stops in the parser: bad.kina:2:6
# a terminal that wants colour: none of the variables that would switch it off or force it on
TTY_ENV = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")} | {"TERM": "xterm"}


def tokens(text):
    return [(t, v) for t, v in get_lexer_by_name("kina").get_tokens(text) if v.strip()]


# --- the lexer ---------------------------------------------------------------------------------

def test_lexer_is_found_through_the_entry_point():
    from kina.editors.pygments_lexer import KinaLexer
    assert type(get_lexer_by_name("kina")) is KinaLexer
    assert type(get_lexer_for_filename("attn.kina")) is KinaLexer
    assert KinaLexer.name == "Kina"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_every_shipped_program_lexes_without_errors_and_losslessly(path):
    text = path.read_text()
    toks = list(get_lexer_by_name("kina").get_tokens(text))
    assert [v for t, v in toks if t in Error] == []
    assert "".join(v for _, v in toks) == text


def test_tokens_follow_the_grammar():
    toks = tokens("// c\nlet kv = fn(q: tensor<F32, [B, S+1], @host>) -> (tensor<F32, [1], @device>) {\n"
                  "  let s = softmax(q @ broadcast(q) * q + q, axis=1);\n  (concat[axis=0] s s)\n}\n")
    assert toks[:4] == [(Comment.Single, "// c"), (Keyword.Declaration, "let"), (Name.Function, "kv"),
                        (Operator, "=")]
    assert (Keyword, "fn") in toks and (Operator, "->") in toks
    assert (Keyword.Type, "F32") in toks and (Number.Integer, "1") in toks and (Name, "S") in toks
    assert (Name.Decorator, "host") in toks and (Name.Decorator, "device") in toks
    assert {v for t, v in toks if t is Name.Builtin} == {"tensor", "softmax", "broadcast", "concat"}
    assert (Name.Attribute, "axis") in toks
    # '@' is the matmul operator outside a type, a placement inside one
    assert [t for t, v in toks if v == "@"] == [Name.Decorator, Name.Decorator, Operator]
    assert {v for t, v in toks if t is Punctuation} == set("(),:<>[]{};")
    toks = tokens("let y = -x / 2 - mean(reshape[dims=[B, 8]] x, axis=1) * 1e-6 + 0.5;")
    assert [v for t, v in toks if t is Operator] == ["=", "-", "/", "-", "=", "=", "*", "+"]
    assert [(t, v) for t, v in toks if t in Number] == [(Number.Integer, "2"), (Number.Integer, "8"),
                                                        (Number.Integer, "1"), (Number.Float, "1e-6"),
                                                        (Number.Float, "0.5")]
    assert (Name.Attribute, "dims") in toks and (Name.Builtin, "mean") in toks


def test_uses_and_calls_are_highlighted():
    toks = tokens('use "blocks.kina";\nlet f = fn(x: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n'
                  "  let (a, b) = two(x);\n  (exp(rms_norm(a, concat[axis=0] k (v))))\n}\n")
    assert toks[:3] == [(Keyword.Namespace, "use"), (String, '"blocks.kina"'), (Punctuation, ";")]
    assert {v for t, v in toks if t is Name.Function} == {"f", "two", "rms_norm"}  # defined, or called
    assert (Name.Builtin, "exp") in toks and (Name, "k") in toks  # concat's operand before '(' is no call


def test_words_and_symbols_come_from_the_grammar():
    from lark import Lark
    from kina.editors import pygments_lexer as highlight
    grammar = Lark((ROOT / "src/kina/frontend/grammar.lark").read_text(), parser="lalr")
    literals = {t.pattern.value for t in grammar.terminals if t.pattern.type == "str"}
    classified = {*highlight.KEYWORDS, *highlight.ATTRIBUTES, *highlight.BUILTINS,
                  *highlight.OPERATORS, *highlight.PUNCTUATION}
    assert classified == literals
    assert set(highlight.BUILTINS) == {"concat", "softmax", "broadcast", "tensor", "transpose", "reshape", "slice", "convert",
                                       "exp", "sqrt", "rsqrt", "sigmoid", "maximum", "sum", "max", "mean"}


def test_characters_outside_the_language_are_error_tokens():
    toks = tokens("let b = a $ a % a;")
    assert [v for t, v in toks if t in Error] == ["$", "%"]
    assert (Name, "a") in toks


def test_lexer_does_not_import_mlir():
    code = "import sys, kina.editors.pygments_lexer; assert 'mlir' not in sys.modules, 'mlir imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pygmentize_highlights_the_example():
    path = EXAMPLES / "storylm0_kv_step.kina"
    out = subprocess.run([sys.executable, "-m", "pygments", "-l", "kina", "-f", "terminal", str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert ANSI.search(out)
    assert ANSI.sub("", out) == path.read_text()


# --- colour ------------------------------------------------------------------------------------

class FakeStream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        if self.tty is None:
            raise ValueError("I/O operation on closed file")
        return self.tty


@pytest.mark.parametrize("env, tty, expected", [
    ({}, True, True),
    ({}, False, False),
    ({}, None, False),                              # a closed stream
    ({"NO_COLOR": "1"}, True, False),
    ({"NO_COLOR": ""}, True, True),                 # empty means unset (no-color.org)
    ({"FORCE_COLOR": "1"}, False, True),
    ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False, False),
    ({"TERM": "dumb"}, True, False),
])
def test_use_color(monkeypatch, env, tty, expected):
    with knobs.scoped(**{"NO_COLOR": None, "FORCE_COLOR": None, "TERM": None, **env}):
        assert use_color(FakeStream(tty)) is expected
        assert use_color(object()) is (expected and "FORCE_COLOR" in env)  # no isatty at all


def test_colour_changes_only_the_escapes():
    e = KinaError(Loc("t.kina", 2, 4, 2, 9), "matmul: contraction dims differ",
                  notes=[(Loc("t.kina", 1, 15), "a is declared here")], source=BAD)
    plain, coloured = e.render(), e.render(color=True)
    assert plain == str(e) == e.render(color=False) and not ANSI.search(plain)
    assert ANSI.sub("", coloured) == plain
    assert "\x1b[1;31merror:\x1b[0m" in coloured and "\x1b[1;36mnote:\x1b[0m" in coloured
    assert "\x1b[1;32m^~~~~\x1b[0m" in coloured and "\x1b[1mmatmul: contraction dims differ\x1b[0m" in coloured


def run_kina(args, cwd, env, tty_out=False, tty_err=False):
    """Run `python -m kina ARGS` with stdout and/or stderr on a pseudo-terminal: (status, stdout, stderr)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "kina", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=slave if tty_out else subprocess.PIPE, stderr=slave if tty_err else subprocess.PIPE)
    os.close(slave)
    seen = b""
    while True:  # drain the terminal until the child closes it (EIO on Linux)
        ready, _, _ = select.select([master], [], [], 60)
        try:
            chunk = os.read(master, 4096) if ready else b""
        except OSError:
            chunk = b""
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out, err = proc.communicate(timeout=60)
    seen = seen.decode().replace("\r\n", "\n")
    return proc.returncode, seen if tty_out else out.decode(), seen if tty_err else err.decode()


@pytest.fixture
def bad(tmp_path):
    (tmp_path / "bad.kina").write_text(SYNTAX_ERROR)
    return tmp_path


def test_diagnostics_are_coloured_on_a_terminal(bad):
    rc, _, err = run_kina(["bad.kina"], bad, TTY_ENV, tty_err=True)
    assert rc == 1
    assert "\x1b[1;31merror:\x1b[0m" in err and "\x1b[1;32m^" in err
    assert ANSI.sub("", err).startswith("bad.kina:2:6: error: unexpected character")


@pytest.mark.parametrize("how", ["piped", "NO_COLOR", "stdout only is a terminal"])
def test_diagnostics_are_plain_otherwise(bad, how):
    env = TTY_ENV | ({"NO_COLOR": "1"} if how == "NO_COLOR" else {})
    rc, _, err = run_kina(["bad.kina"], bad, env, tty_out=how.startswith("stdout"), tty_err=how == "NO_COLOR")
    assert rc == 1 and err.startswith("bad.kina:2:6: error: unexpected character")
    assert "\x1b" not in err


def test_force_color_colours_a_pipe(bad):
    rc, _, err = run_kina(["bad.kina"], bad, TTY_ENV | {"FORCE_COLOR": "1"})
    assert rc == 1 and "\x1b[1;31merror:\x1b[0m" in err


# --- python -m kina ----------------------------------------------------------------------------

def test_python_m_kina_is_kinac(capsys, tmp_path):
    path = EXAMPLES / "storylm0_kv_step.kina"
    assert cli.main([str(path), "--emit", "ast"]) == 0
    expected = capsys.readouterr().out
    result = subprocess.run([sys.executable, "-m", "kina", str(path), "--emit", "ast"],
                            capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, expected, "")
    kinac = Path(sys.executable).with_name("kinac")
    if kinac.exists():  # the console script of the same install agrees byte for byte
        assert subprocess.run([kinac, str(path), "--emit", "ast"], capture_output=True, text=True).stdout == expected
    missing = subprocess.run([sys.executable, "-m", "kina", str(tmp_path / "nope.kina")], capture_output=True,
                             text=True)
    assert missing.returncode == 1 and "nope.kina" in missing.stderr and "Traceback" not in missing.stderr
