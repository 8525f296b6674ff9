"""The negative corpus: every bad program in tests/errors/ gets its one clear, located error.

Each file in tests/errors/ holds many small cases separated by `// ---` lines. A
case carries its expected diagnostic in a comment, normally beside the offending
line, with its position relative to the comment, as MLIR's `expected-error@+1` does:

    let f = fn(a: tensor<F32, [1, 2, 1, 3], @host>, b: ...) -> (...) {
      (a @ b)  // expected-error@:4 {{matmul: contraction dims differ: lhs [1, 2, 1, 3] has K=3, ...}}
      // expected-note@-2:12 {{lhs 'a' defined here}}

`@+N` and `@-N` count lines down or up from the annotation's own line, a bare `@`
is that line itself, and `:COL` is the column, so inserting a case renumbers
nothing. The position must fall inside the annotation's case. A case is run as
the file with every other case blanked out, so the rendered line numbers are the
ones an editor shows. When a case has `expected-note` lines, the rendered notes
must be exactly those, in order.

Each case runs through `kinac --emit mlir` (in process, so @device is refused at
compile as it would be); the test checks exit status 1, the rendered first line
`file:line:col: error: message`, the quoted source line and caret, and that no
traceback appears. Odd inputs that cannot carry a comment (an empty file, nesting
thousands deep, a very long line) are generated below, and a few cases also run
through a real `kinac` process.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import check_against_numpy
from kina.driver import cli
from kina.frontend import syntax

CORPUS = Path(__file__).resolve().parent / "errors"
_ANNOTATION = re.compile(rb"//\s*expected-(error|note)@([+-]\d+)?:(\d+) \{\{(.*)\}\}\s*$")
_ANY_ANNOTATION = re.compile(rb"expected-\w|//\s*(error|note)\b")  # so a typo is not skipped
_SEPARATOR = re.compile(rb"^// ---")


def corpus_cases(folder: Path = CORPUS) -> list:
    """(file, text with other cases blanked, (line, col, message), [notes]) per case."""
    cases = []
    for path in sorted(folder.glob("*.kina")):
        lines = path.read_bytes().split(b"\n")
        starts = [0] + [i + 1 for i, line in enumerate(lines) if _SEPARATOR.match(line)]
        ends = [i for i, line in enumerate(lines) if _SEPARATOR.match(line)] + [len(lines)]
        for index, (start, end) in enumerate(zip(starts, ends)):
            text = b"\n".join(line if start <= i < end else b"" for i, line in enumerate(lines))
            error, notes = None, []
            for i in range(start, end):
                where = f"{path.name}:{i + 1} (case {index})"
                m = _ANNOTATION.search(lines[i])
                if not m:
                    assert not _ANY_ANNOTATION.search(lines[i]), \
                        f"{where}: malformed annotation; expected '// expected-error@+N:COL {{{{message}}}}'"
                    continue
                line = i + 1 + int(m[2] or 0)
                assert start < line <= end, f"{where}: the annotation points at line {line}, outside its case"
                expected = (line, int(m[3]), m[4].decode())
                if m[1] == b"error":
                    assert error is None, f"{where}: two error annotations in one case"
                    error = expected
                else:
                    notes.append(expected)
            cases.append(pytest.param(path, text, error, notes, id=f"{path.stem}-{index}"))
    return cases


CASES = corpus_cases()


def test_corpus_is_not_empty():
    # A broken splitter must not make the corpus pass vacuously.
    assert len(CASES) >= 100, len(CASES)
    assert {p.values[0].stem for p in CASES} >= {"syntax", "names", "results", "concat", "matmul",
                                                 "elementwise", "softmax", "types", "bytes"}


def run_kinac(tmp_path: Path, name: str, data: bytes, capsys, *flags: str) -> tuple[int, Path, str]:
    path = tmp_path / name
    path.write_bytes(data)
    status = cli.main([str(path), "--emit", "mlir", "-o", str(tmp_path / "out.mlir"), *flags])
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    return status, path, out.err


def assert_diagnostic(err: str, path: Path, source: bytes, line: int, col: int, message: str,
                      notes: list | None = None) -> None:
    rendered = err.rstrip("\n").split("\n")
    assert rendered[0] == f"{path}:{line}:{col}: error: {message}", err
    src_lines = source.decode("utf-8", "replace").replace("\0", " ").splitlines()
    if 0 < line <= len(src_lines) and len(src_lines[line - 1]) <= 200:
        assert rendered[1] == src_lines[line - 1], err  # the offending line, quoted
        assert rendered[2].index("^") == col - 1, err  # and a caret under the column
    if notes:
        got = [ln for ln in rendered if ln.startswith(f"{path}:") and ": note: " in ln]
        assert got == [f"{path}:{ln}:{c}: note: {msg}" for ln, c, msg in notes], err


@pytest.mark.parametrize("path,text,error,notes", CASES)
def test_corpus_case(path, text, error, notes, tmp_path, capsys):
    assert error is not None, f"{path.name}: a case without an '// expected-error@+N:COL {{{{message}}}}' annotation"
    status, written, err = run_kinac(tmp_path, path.name, text, capsys)
    assert status == 1, err
    assert_diagnostic(err, written, text, *error, notes)


def test_a_wrong_offset_fails(tmp_path, capsys):
    # The offsets are read and checked: the first matmul case, its error moved one line down, fails.
    (tmp_path / "corpus").mkdir()
    case = (CORPUS / "matmul.kina").read_bytes().split(b"// ---")[0]
    assert b"(a @ b)  // expected-error@:4 " in case
    (tmp_path / "corpus" / "moved.kina").write_bytes(case.replace(b"expected-error@:", b"expected-error@+1:"))
    (param,) = corpus_cases(tmp_path / "corpus")
    path, text, (line, col, message), notes = param.values
    assert (line, col, [ln for ln, _, _ in notes]) == (4, 4, [2, 2])
    status, written, err = run_kinac(tmp_path, path.name, text, capsys)
    assert status == 1
    assert_diagnostic(err, written, text, line - 1, col, message, notes)  # where the error really is
    with pytest.raises(AssertionError):
        assert_diagnostic(err, written, text, line, col, message, notes)


# -- odd files that are generated rather than written out ---------------------------------

HEAD = "let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n"


@pytest.mark.parametrize("name,source,line,col,message", [
    ("empty.kina", "", 1, 1, "no function defined: expected 'let NAME = fn(...) -> (...) { ... }'"),
    ("blank.kina", "\n\n   \n", 1, 1, "no function defined: expected 'let NAME = fn(...) -> (...) { ... }'"),
    ("parens.kina", HEAD + "  (" + "(" * 5000 + "a" + ")" * 5000 + ")\n}\n", 2, 203,
     f"parentheses nested more than {syntax.MAX_DEPTH} deep"),
    ("chain.kina", HEAD + "  let b = a" + " + a" * 5000 + ";\n  (b)\n}\n", 2, 11,
     f"expression nested more than {syntax.MAX_DEPTH} deep; split it into several let bindings"),
    ("concats.kina", HEAD + "  (" + "concat[axis=0] " * 3000 + "a" + " a" * 3000 + ")\n}\n", 2, 4,
     f"expression nested more than {syntax.MAX_DEPTH} deep; split it into several let bindings"),
    ("softmaxes.kina", HEAD + "  (" + "softmax(" * 3000 + "a" + ", axis=0)" * 3000 + ")\n}\n", 2, 3 + 8 * 200,
     f"parentheses nested more than {syntax.MAX_DEPTH} deep"),
    ("long_line.kina", HEAD + "  let b = a" + " + (a)" * 20000 + " a;\n  (b)\n}\n", 2, 12 + 6 * 20000,
     "expected ';' after let binding, found 'a'"),
    ("long_name.kina", HEAD + "  (" + "x" * 100000 + ")\n}\n", 2, 4, f"undefined name '{'x' * 100000}'"),
    ("long_comment.kina", "// " + "é" * 200000 + "\n" + HEAD + "  (a) )\n}\n", 3, 7, "expected '}', found ')'"),
    # Python converts at most 4,300 digits to an int: the text is checked first, and shown by its ends
    ("long_number.kina", HEAD + "  (a * 1" + "0" * 4400 + ")\n}\n", 2, 8,
     "the number 1000000000000000...00000000 (4401 characters) is too large for any dtype "
     "(F64's largest finite value is 1.79769e+308)"),
    ("digits_310.kina", HEAD + "  (a * 1" + "0" * 309 + ")\n}\n", 2, 8,
     "the number 1000000000000000...00000000 (310 characters) is too large for any dtype "
     "(F64's largest finite value is 1.79769e+308)"),
    ("bom_then_error.kina", "\ufeff" + HEAD + "  (b)\n}\n", 2, 4, "undefined name 'b'"),
])
def test_generated_odd_file(name, source, line, col, message, tmp_path, capsys):
    status, path, err = run_kinac(tmp_path, name, source.encode(), capsys)
    assert status == 1, err
    assert_diagnostic(err, path, source.encode(), line, col, message)
    assert all(len(ln) < 1000 for ln in err.splitlines()[1:3]), "a very long line is shown as a window"


def test_a_byte_order_mark_is_accepted(tmp_path, capsys):
    # A UTF-8 byte-order mark opens some editors' files; Python, clang and rustc skip it, and so does Kina
    # (columns on the first line count from after it).
    path = tmp_path / "bom.kina"
    path.write_bytes(("\ufeff" + HEAD + "  (a)\n}\n").encode())
    from kina.frontend import syntax as s
    program = s.parse(path.read_bytes(), str(path))
    assert [f.name for f in program.functions] == ["f"] and program.functions[0].loc.col == 5
    status, _, err = run_kinac(tmp_path, "bom2.kina", ("\ufeff" + HEAD + "  (a)\n}\n").encode(), capsys,
                               "--emit", "typed")
    assert status == 0, err


def test_309_digits_are_an_f64_number():
    from kina.frontend import syntax as s
    program = s.parse(HEAD + "  (a * 1" + "0" * 300 + ")\n}\n")
    assert program.functions[0].results[0].rhs.value == 10 ** 300


def test_nesting_just_below_the_limit_compiles_and_runs():
    # The limits refuse only what is too deep; just below them everything still works.
    depth = syntax.MAX_DEPTH - 10
    source = HEAD.replace("[2]", "[3]") + "  let b = a" + " + a" * depth + ";\n  (" + "(" * depth + "b" + ")" * depth + ")\n}\n"
    a = np.arange(3, dtype=np.float32)
    (got,) = check_against_numpy(source, "f", a, exact=(0,))
    np.testing.assert_array_equal(got, a * (depth + 1))


def test_user_errors_exit_1_in_a_real_process(tmp_path):
    # The whole path a user sees: a separate kinac process, exit status, no traceback.
    for name, data in [("mm.kina", (CORPUS / "matmul.kina").read_bytes().split(b"// ---")[0]),
                       ("bad.kina", b"let f\xff"), ("empty.kina", b"")]:
        path = tmp_path / name
        path.write_bytes(data)
        proc = subprocess.run([sys.executable, "-m", "kina", str(path)], capture_output=True, text=True)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith(f"{path}:") and ": error: " in proc.stderr.splitlines()[0], proc.stderr
        assert "Traceback" not in proc.stderr
        assert not path.with_suffix(".so").exists()


def test_missing_file_is_a_user_error(tmp_path, capsys):
    assert cli.main([str(tmp_path / "nope.kina")]) == 1
    assert "kinac: error: cannot read" in capsys.readouterr().err


# -- dims of 0 are legal: they compile and run --------------------------------------------

ZERO = """
let f = fn(a: tensor<F32, [0, 3], @host>, b: tensor<F32, [3, 0], @host>, c: tensor<F32, [2, 0], @host>,
           d: tensor<F32, [0, 4], @host>, s: tensor<F32, [1, 1], @host>)
  -> (tensor<F32, [0, 0], @host>, tensor<F32, [2, 4], @host>, tensor<F32, [0, 3], @host>,
      tensor<F32, [3, 0], @host>, tensor<F32, [0, 3], @host>, tensor<F32, [2, 0], @host>) {
  let empty = a @ b;
  let zeros = c @ d;
  let grown = concat[axis=0] a a;
  (empty, zeros, grown, softmax(b, axis=1), softmax(a, axis=0) * broadcast(s), softmax(c, axis=1) + c)
}
"""


def test_zero_dims_compile_and_run():
    r = np.random.default_rng(0)
    args = [r.standard_normal(s).astype(np.float32) for s in [(0, 3), (3, 0), (2, 0), (0, 4), (1, 1)]]
    got = check_against_numpy(ZERO, "f", *args, exact=(0, 1, 2, 3, 4, 5))
    np.testing.assert_array_equal(got[1], np.zeros((2, 4), np.float32))  # a sum over K=0 is 0


def test_symbolic_dim_of_0():
    source = """
let f = fn(a: tensor<F32, [B, S], @host>, k: tensor<F32, [B, 1], @host>, w: tensor<F32, [S, 2], @host>)
  -> (tensor<F32, [B, S+1], @host>, tensor<F32, [B, 2], @host>, tensor<F32, [B, S], @host>) {
  (concat[axis=1] a k, a @ w, softmax(a, axis=1))
}
"""
    for B, S in [(0, 3), (2, 0), (0, 0)]:
        r = np.random.default_rng(B * 10 + S)
        args = [r.standard_normal(s).astype(np.float32) for s in [(B, S), (B, 1), (S, 2)]]
        got = check_against_numpy(source, "f", *args, exact=(0,))
        assert [g.shape for g in got] == [(B, S + 1), (B, 2), (B, S)]
