"""kina.knobs: the one table of environment variables, and the one error a bad value gets.

Every read of the environment in src/kina goes through `knobs.get` (a grep), every
knob in the table is read somewhere, docs/cli-and-api.md's Environment section is the
table's markdown, and a bad value of a knob that is used is the same one line from the API
(a ValueError) and from kinac, kinac run and kinac bench (exit status 1); one that
is not used (KINA_OPT_LEVEL under -O) is no error.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kina
from kina import knobs
from kina.driver.pipeline import Options

from conftest import EXAMPLES, ROOT
from test_cli import kinac

SRC = ROOT / "src" / "kina"
STATIC = EXAMPLES / "storylm0_kv_step.kina"
TINY = "let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n  (a + a)\n}\n"
ENV_READ = re.compile(r"\benviron\b|\bgetenv\b|\bputenv\b")


def env_reads(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if ENV_READ.search(line)]


def test_only_knobs_reads_the_environment():
    offenders = {str(p.relative_to(SRC)): env_reads(p.read_text()) for p in sorted(SRC.rglob("*.py"))
                 if p.name != "knobs.py" or p.parent != SRC}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert env_reads((SRC / "knobs.py").read_text()), "the grep must see knobs.py's own read"


def test_the_grep_can_fail():
    assert env_reads('x = os.environ.get("KINA_CC")\ny = os.getenv("A")\nfrom os import environ\nz = 1')  \
        == ['x = os.environ.get("KINA_CC")', 'y = os.getenv("A")', "from os import environ"]


def test_every_knob_is_read_somewhere_and_every_read_is_a_knob():
    code = {p: p.read_text() for p in [*SRC.rglob("*.py"), *(ROOT / "tests").glob("*.py")] if p.name != "knobs.py"}
    read = {name for text in code.values() for name in re.findall(r"knobs\.get\(\"(\w+)\"\)", text)}
    assert read == set(knobs.KNOBS)
    for k in knobs.KNOBS.values():
        where = [p for p, text in code.items() if f'knobs.get("{k.name}")' in text]
        assert all(("tests" in p.parts) == k.test_only for p in where), (k.name, where)


def test_docs_environment_section_is_the_table():
    doc = (ROOT / "docs" / "cli-and-api.md").read_text()
    start = doc.index("\n## Environment\n")
    end = doc.find("\n## ", start + 1)
    section = doc[start:end if end != -1 else len(doc)]
    table = "".join(line + "\n" for line in section.splitlines() if line.startswith("|"))
    assert table == knobs.markdown(), \
        "docs/cli-and-api.md's Environment table is stale: paste `python -m kina.knobs`"


def test_python_m_kina_knobs_prints_the_table():
    proc = subprocess.run([sys.executable, "-m", "kina.knobs"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == knobs.markdown()


@pytest.mark.parametrize("name, text, value", [
    ("KINA_OPT_LEVEL", None, 3), ("KINA_OPT_LEVEL", "0", 0), ("KINA_OPT_LEVEL", "", 3),
    ("KINA_NO_CACHE", None, False), ("KINA_NO_CACHE", "1", True), ("KINA_NO_CACHE", "0", False),
    ("KINA_NUM_THREADS", None, None), ("KINA_NUM_THREADS", "4", 4),
    ("KINA_TRANSLATE", None, "in-process"), ("KINA_TRANSLATE", "binary", "binary"),
    ("KINA_CACHE_DIR", "/x/y", Path("/x/y")), ("KINA_CACHE_DIR", None, Path.home() / ".cache" / "kina"),
    ("NO_COLOR", "1", True), ("NO_COLOR", None, None), ("KINA_FUZZ_EXAMPLES", None, 0),
])
def test_values_and_defaults(monkeypatch, name, text, value):
    if text is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, text)
    assert knobs.get(name) == value


BAD = [
    ("KINA_OPT_LEVEL", "7", "KINA_OPT_LEVEL: expected 0, 1, 2 or 3, got '7'"),
    ("KINA_OPT_LEVEL", "-1", "KINA_OPT_LEVEL: expected 0, 1, 2 or 3, got '-1'"),
    ("KINA_NO_CACHE", "yes", "KINA_NO_CACHE: expected 0 or 1, got 'yes'"),
    ("KINA_NUM_THREADS", "abc", "KINA_NUM_THREADS: expected a positive integer, got 'abc'"),
    ("KINA_NUM_THREADS", "0", "KINA_NUM_THREADS: expected a positive integer, got '0'"),
    ("KINA_NUM_THREADS", "²", "KINA_NUM_THREADS: expected a positive integer, got '²'"),
    ("KINA_TRANSLATE", "mlir", "KINA_TRANSLATE: expected in-process or binary, got 'mlir'"),
    ("KINA_FUZZ_EXAMPLES", "many", "KINA_FUZZ_EXAMPLES: expected a non-negative integer, got 'many'"),
]


@pytest.mark.parametrize("name, text, message", BAD)
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, name, text, message):
    monkeypatch.setenv(name, text)
    with pytest.raises(knobs.KnobError) as e:
        knobs.get(name)
    assert str(e.value) == message and isinstance(e.value, ValueError)


def test_knobs_are_read_at_use_time():
    with knobs.scoped(KINA_OPT_LEVEL=1):
        assert Options().opt_level == 1
    with knobs.scoped(KINA_OPT_LEVEL=2):
        assert Options().opt_level == 2


def test_scoped_sets_checked_knobs_for_a_block_and_restores_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KINA_NO_CACHE", "0")
    monkeypatch.delenv("KINA_OPT_LEVEL", raising=False)
    before = dict(os.environ)
    with knobs.scoped(KINA_NO_CACHE=None, KINA_OPT_LEVEL=1, KINA_CACHE_DIR=tmp_path):
        assert "KINA_NO_CACHE" not in os.environ and Options().opt_level == 1
        assert os.environ["KINA_CACHE_DIR"] == str(tmp_path)
    assert dict(os.environ) == before
    with pytest.raises(RuntimeError), knobs.scoped(KINA_NO_CACHE="1"):
        raise RuntimeError  # restored on an error too
    assert dict(os.environ) == before
    with pytest.raises(knobs.KnobError, match=r"^KINA_OPT_LEVEL: expected 0, 1, 2 or 3, got '7'$"):
        with knobs.scoped(KINA_NO_CACHE="1", KINA_OPT_LEVEL=7):
            pass  # never reached: every value is checked before any is set
    assert dict(os.environ) == before


def test_api_errors_and_an_explicit_level_overrides(monkeypatch):
    monkeypatch.setenv("KINA_OPT_LEVEL", "7")
    with pytest.raises(ValueError, match=r"^KINA_OPT_LEVEL: expected 0, 1, 2 or 3, got '7'$"):
        kina.compile_source(TINY)
    import numpy as np
    f = kina.compile_source(TINY, options=Options(opt_level=2)).f  # the level given: the knob is not read
    monkeypatch.setenv("KINA_NUM_THREADS", "abc")
    with pytest.raises(ValueError, match=r"^KINA_NUM_THREADS: expected a positive integer, got 'abc'$"):
        f(np.ones(2, np.float32))
    assert f(np.ones(2, np.float32), threads=1)[0].tolist() == [2.0, 2.0]
    monkeypatch.setenv("KINA_NO_CACHE", "yes")
    with pytest.raises(ValueError, match=r"^KINA_NO_CACHE: expected 0 or 1, got 'yes'$"):
        kina.compile_source(TINY, options=Options(opt_level=2))


@pytest.mark.parametrize("args, env, message", [
    (["{src}", "-o", "{tmp}/x.so"], {"KINA_OPT_LEVEL": "7"}, "KINA_OPT_LEVEL: expected 0, 1, 2 or 3, got '7'"),
    (["{src}", "-O", "2", "--emit", "llvm", "-o", "{tmp}/x.ll"], {"KINA_TRANSLATE": "mlir", "KINA_NO_CACHE": "1"},
     "KINA_TRANSLATE: expected in-process or binary, got 'mlir'"),
    (["run", "{src}", "--output-dir", "{tmp}"], {"KINA_NUM_THREADS": "abc"},
     "KINA_NUM_THREADS: expected a positive integer, got 'abc'"),
    (["bench", "{src}", "--repeats", "1"], {"KINA_NUM_THREADS": "abc"},
     "KINA_NUM_THREADS: expected a positive integer, got 'abc'"),
    (["run", "{src}"], {"KINA_NO_CACHE": "yes"}, "KINA_NO_CACHE: expected 0 or 1, got 'yes'"),
])
def test_cli_bad_knob_is_one_line_and_exit_1(tmp_path, args, env, message):
    proc = kinac(*[a.format(src=STATIC, tmp=tmp_path) for a in args], env=env)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"kinac: error: {message}\n"
    assert not list(tmp_path.iterdir())


def test_cli_explicit_level_ignores_a_bad_KINA_OPT_LEVEL(tmp_path):
    proc = kinac(STATIC, "-O", "2", "-o", tmp_path / "x.so", env={"KINA_OPT_LEVEL": "7"})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "x.so").exists()


def test_cli_opt_uses_no_knob(tmp_path):
    """kinac opt reads no knob, so a bad one changes nothing."""
    mlir = tmp_path / "k.mlir"
    assert kinac(STATIC, "--emit", "mlir", "-o", mlir).returncode == 0
    proc = kinac("opt", mlir, "--passes", "abi", env={"KINA_OPT_LEVEL": "7", "KINA_NUM_THREADS": "x"})
    assert proc.returncode == 0 and "func.func" in proc.stdout, proc.stderr
