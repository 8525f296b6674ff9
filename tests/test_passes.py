"""The pass tests of tests/passes/ (one .mlir file per Kina pass, RUN and CHECK lines
as in MLIR's own test suite), run by lit, one pytest case per file, so that a
failing CHECK fails `make test` with lit's output (the command it ran and
FileCheck's diagnostic) in the report.
"""
import importlib.util
import re
import subprocess
import sys

import pytest

from kina.driver import toolchain
from kina.frontend.diagnostics import ToolError

from conftest import ROOT

SUITE = ROOT / "tests" / "passes"
FILES = sorted(SUITE.glob("*.mlir"))
LIT = [sys.executable, "-c", "import sys; from lit.main import main; sys.exit(main())"]


def _missing() -> str | None:
    """Why lit cannot run here, or None."""
    if importlib.util.find_spec("lit") is None:
        return "lit is not installed (pip install -e '.[dev]')"
    try:
        toolchain.find("FileCheck")
    except ToolError as e:
        return str(e)
    return None


def lit(*paths) -> subprocess.CompletedProcess:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    return subprocess.run([*LIT, "-v", *map(str, paths)], capture_output=True, text=True)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_pass(path):
    proc = lit(path)
    assert proc.returncode == 0, f"lit failed on {path.name}:\n{proc.stdout}\n{proc.stderr}"
    assert f"PASS: kina-passes :: {path.name}" in proc.stdout, proc.stdout


def test_every_kina_pass_has_a_file():
    from kina.ir.passes import PASSES
    assert {f"{p.name}.mlir" for p in PASSES if p.kind == "kina"} <= {p.name for p in FILES}


def test_a_check_that_cannot_match_fails(tmp_path):
    """The suite's own configuration, on a file whose CHECK is not in the output."""
    (tmp_path / "lit.cfg.py").write_text(f"lit_config.load_config(config, {str(SUITE / 'lit.cfg.py')!r})\n")
    (tmp_path / "never.mlir").write_text(
        "// RUN: kinac opt %s --passes exp-to-arith | FileCheck %s\n"
        "// CHECK: func.func @this_name_is_not_in_the_input\n"
        "func.func @f(%x: f32) -> f32 {\n"
        "  %e = math.exp %x : f32\n"
        "  return %e : f32\n"
        "}\n")
    proc = lit(tmp_path / "never.mlir")
    assert proc.returncode != 0, proc.stdout
    assert "FAIL: kina-passes :: never.mlir" in proc.stdout, proc.stdout
    assert "expected string not found in input" in proc.stdout + proc.stderr, proc.stdout


def test_a_refused_input_is_exit_1_with_a_diagnostic_per_section(capsys):
    """preconditions.mlir's abi sections: each refused at its op, exit 1 (a user's
    error), never 2 (internal) or a traceback; the other sections still print."""
    from kina.driver import cli
    status = cli.main(["opt", str(SUITE / "preconditions.mlir"), "--split-input-file", "--passes", "abi"])
    out = capsys.readouterr()
    assert status == 1, out.err
    assert len(re.findall(r"^\S+preconditions\.mlir:\d+:\d+: error: abi: ", out.err, re.M)) == 7, out.err
    assert "internal" not in out.err and "Traceback" not in out.err
    assert "func.func @kina_leftover" not in out.out  # it returns a memref: refused too


def test_options_are_the_passes_own_fields():
    from kina.ir.passes import BY_NAME, PipelineError, parse
    from kina.ir.passes.matmul_loops import MatmulLoops
    chosen = parse("matmul-loops{unroll=4 vector-bytes=64},sum-loops,abi{prefix=x_}")
    assert chosen[0] == MatmulLoops(unroll=4, vector_bytes=64) and chosen[1] is BY_NAME["sum-loops"]
    assert [p.spec for p in chosen] == ["matmul-loops{unroll=4 vector-bytes=64}", "sum-loops", "abi{prefix=x_}"]
    assert [o.name for o in MatmulLoops.options()][:2] == ["unroll", "vector-bytes"]
    assert MatmulLoops.options()[0].default == 8 and MatmulLoops.options()[0].type is int
    for bad, message in [("matmul-loops{unroll=0}", "matmul-loops: option 'unroll': expected an integer from 1 to 64, got 0"),
                         ("sum-loops{vector-bytes}", "sum-loops: option 'vector-bytes': expected a power of two"),
                         ("nope", "unknown pass 'nope': expected one of fuse-concat-matmul,"),
                         ("", "no pass given")]:
        with pytest.raises(PipelineError, match=re.escape(message)):
            parse(bad)
    with pytest.raises(PipelineError, match="got 0"):  # made directly, the same check
        MatmulLoops(unroll=0)


def test_a_pass_given_options_twice_takes_both():
    """selected's options set a pass that runs once: a pass named again keeps what it was
    given before (StoryLM's fma=true with a caller's matmul-loops{unroll=4}); where both
    give one option, the later wins. `kinac opt --passes` is a pipeline and keeps each."""
    from kina.ir.passes import parse, selected
    mm = lambda passes: next(p for p in passes if p.name == "matmul-loops")
    both = mm(selected(3, "matmul-loops{fma=true},threads{parts=3},matmul-loops{unroll=4}"))
    assert both.fma and both.unroll == 4
    assert mm(selected(3, "matmul-loops{unroll=2},matmul-loops{unroll=4}")).unroll == 4
    assert [(p.fma, p.unroll) for p in parse("matmul-loops{fma=true},matmul-loops{unroll=4}")] == [(True, 8), (False, 4)]


def test_a_target_without_avx512_gets_register_tiles_that_fit_its_registers():
    """selected(..., flags): without avx512f, matmul-loops' tiles keep 64 bytes of sums per
    row (16 registers of 32 bytes), else the table's 384; options given on top still win,
    and a build for x86-64-v3 / -v4 takes its level's table."""
    from kina.driver.pipeline import Build, Options
    from kina.ir.passes import BY_NAME, selected
    tiles = lambda passes: next(p for p in passes if p.name == "matmul-loops").tile_row_bytes
    assert BY_NAME["matmul-loops"].tile_row_bytes == 384
    assert tiles(selected(3, "", ("avx2", "fma"))) == 64
    assert tiles(selected(3, "", ("avx2", "avx512f"))) == 384
    given = selected(3, "matmul-loops{fma=true}", ("avx2",))
    assert tiles(given) == 64 and next(p for p in given if p.name == "matmul-loops").fma
    assert tiles(selected(3, "matmul-loops{tile-row-bytes=128}", ("avx2",))) == 128
    for level, want in (("x86-64-v3", 64), ("x86-64-v4", 384)):
        assert tiles(Build("", "t.kina", Options(cpu=level), workdir=None).passes) == want
