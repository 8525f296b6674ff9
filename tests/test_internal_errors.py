"""Internal errors are kept apart from user errors.

If the MLIR that kinac generates fails to verify, or a pass fails on it, that is a
compiler bug: kinac says "internal compiler error", writes a reproducer (the MLIR
and the pipeline) to a file, prints its path, and exits 2 (a user's error exits 1).
The bugs are injected by monkeypatching: `lower.lower` emitting a function whose
signature does not match its body, and a pass pipeline that cannot finish.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from mlir import ir

from kina import cli, lower, pipeline, toolchain

SOURCE = """let f = fn(a: tensor<F32, [2, 3], @host>) -> (tensor<F32, [2, 3], @host>) {
  let b = a + a;
  (b)
}
"""


@pytest.fixture
def src(tmp_path, monkeypatch):
    monkeypatch.setenv("KINA_NO_CACHE", "1")  # a cached .so would skip the broken stage
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # reproducers land here
    path = tmp_path / "ok.kina"
    path.write_text(SOURCE)
    return path


def _bad_lower(program, context=None):
    """The real lowering, then a bug: the first function declares a result its return lacks."""
    module = _real_lower(program, context)
    with module.context:
        op = module.body.operations[0]
        ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        op.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(list(ftype.inputs), [*ftype.results, ir.F32Type.get()]))
    return module


_real_lower = lower.lower


def run(capsys, *argv) -> tuple[int, str]:
    status = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return status, out.err


def reproducer_path(err: str) -> Path:
    m = re.search(r"A reproducer was written to (\S+)", err)
    assert m, err
    path = Path(m[1])
    assert path.is_file()
    return path


def mlir_opt(*args) -> subprocess.CompletedProcess:
    return subprocess.run([toolchain.find("mlir-opt"), *map(str, args)], capture_output=True, text=True)


@pytest.mark.parametrize("emit", ["mlir", "so"])
def test_mlir_that_does_not_verify_is_an_internal_error(src, monkeypatch, capsys, emit):
    monkeypatch.setattr(lower, "lower", _bad_lower)
    status, err = run(capsys, src, "--emit", emit, "-o", src.with_suffix(".out"))
    assert status == 2, err
    assert err.startswith("kinac: internal compiler error: the generated MLIR does not verify"), err
    assert "'func.return' op has" in err, "the verifier's own message is shown"
    assert "This is a bug in kinac, not in your program." in err
    repro = reproducer_path(err)
    text = repro.read_text()
    assert f"internal kinac error on {src}" in text and "func.func @kina_f" in text
    assert 'loc("' in text or "loc(#loc" in text, "the reproducer keeps source locations"
    # and it reproduces: mlir-opt refuses the same module
    proc = mlir_opt(repro)
    assert proc.returncode != 0 and "'func.return' op has" in proc.stderr, proc.stderr


def test_failing_pass_is_an_internal_error_with_its_pipeline(src, monkeypatch, capsys):
    # Lowering func and arith to LLVM in place of bufferizing leaves tensor ops that the
    # next pipeline (DEALLOCATE) cannot legalize: the reproducer is its input and its pipeline.
    monkeypatch.setattr(pipeline, "BUFFERIZE", "convert-func-to-llvm,convert-arith-to-llvm,reconcile-unrealized-casts")
    status, err = run(capsys, src, "--emit", "lowered")
    assert status == 2, err
    assert err.startswith("kinac: internal compiler error: the pass pipeline failed on the generated MLIR"), err
    assert f'"{src}":1:12: failed to legalize' in err, "the pass error points back into the .kina source"
    repro = reproducer_path(err)
    text = repro.read_text()
    assert f"--pass-pipeline='builtin.module({pipeline.DEALLOCATE})'" in text
    proc = mlir_opt(repro, f"--pass-pipeline=builtin.module({pipeline.DEALLOCATE})")
    assert proc.returncode != 0 and "failed to legalize operation 'bufferization.to_tensor'" in proc.stderr, \
        "the reproducer must fail the same way"
    assert not src.with_suffix(".so").exists()


def test_user_error_still_exits_1_when_the_back_end_is_broken(src, monkeypatch, capsys):
    # A user's error stops in the front end, before any broken stage runs.
    monkeypatch.setattr(lower, "lower", _bad_lower)
    src.write_text(SOURCE.replace("a + a", "a @ a"))
    status, err = run(capsys, src)
    assert status == 1, err
    assert err.startswith(f"{src}:2:11: error: matmul: contraction dims differ"), err
    assert "internal" not in err and not list(src.parent.glob("kina-repro-*"))
