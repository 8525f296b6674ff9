"""Internal errors are kept apart from user errors.

If the reference IR fails to verify, or a pass fails or leaves invalid IR, that is
a compiler bug: kinac says "internal compiler error", names the pass, writes a
reproducer (the pass's input and the command that reruns it) to a file, prints
its path, and exits 2 (a user's error exits 1). The bugs are injected by
monkeypatching: `lower.lower` emitting a function whose signature does not match
its body, a Kina pass that breaks the IR or raises, and a skipped `abi` pass that
leaves upstream bufferization IR it cannot finish.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from mlir import ir

from kina import knobs
from kina.driver import cli
from kina.ir import lower
from kina.driver import toolchain
from kina.ir.passes import BY_NAME, abi, copies_to_linalg

SOURCE = """let f = fn(a: tensor<F32, [2, 3], @host>) -> (tensor<F32, [2, 3], @host>) {
  let b = a + a;
  (b)
}
"""


@pytest.fixture
def src(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # reproducers land here
    path = tmp_path / "ok.kina"
    path.write_text(SOURCE)
    with knobs.scoped(KINA_NO_CACHE=1):  # a cached .so would skip the broken stage
        yield path


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


def _erase_returns(module_op):
    """A broken pass: erases every func.return, so the function's block has no terminator."""
    found = []
    module_op.walk(lambda op: (found.append(op) if op.name == "func.return" else None) or ir.WalkResult.ADVANCE)
    for op in found:
        op.erase()


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
def test_reference_ir_that_does_not_verify_is_an_internal_error(src, monkeypatch, capsys, emit):
    monkeypatch.setattr(lower, "lower", _bad_lower)
    status, err = run(capsys, src, "--emit", emit, "-o", src.with_suffix(".out"))
    assert status == 2, err
    assert err.startswith("kinac: internal compiler error: the reference IR does not verify"), err
    assert "'func.return' op has" in err, "the verifier's own message is shown"
    assert "This is a bug in kinac, not in your program." in err
    text = reproducer_path(err).read_text()
    assert f"internal kinac error on {src}" in text and "func.func @f" in text
    assert 'loc("' in text or "loc(#loc" in text, "the reproducer keeps source locations"
    proc = mlir_opt(reproducer_path(err))  # and it reproduces: mlir-opt refuses the same module
    assert proc.returncode != 0 and "'func.return' op has" in proc.stderr, proc.stderr


def test_kina_pass_that_breaks_the_ir_is_named_and_reproducible(src, monkeypatch, capsys):
    monkeypatch.setattr(copies_to_linalg.CopiesToLinalg, "run", lambda self, module_op: _erase_returns(module_op))
    status, err = run(capsys, src, "--emit", "so")
    assert status == 2, err
    assert err.startswith("kinac: internal compiler error: pass 'copies-to-linalg' failed"), err
    assert "block with no terminator" in err, "the verifier's message after the pass is shown"
    assert f'"{src}":1:5' in err, "the error points back into the .kina source"
    repro = reproducer_path(err)
    text = repro.read_text()
    assert f"Run: kinac opt {repro} --passes copies-to-linalg" in text
    assert "memref.copy" in text and re.search(r"^\s+return\b", text, re.M), \
        "the reproducer is the pass's input: bufferized, not yet rewritten"
    # rerunning that one pass on the reproducer fails the same way; the real pass does not
    status, err2 = run(capsys, "opt", repro, "--passes", "copies-to-linalg")
    assert status == 2 and "block with no terminator" in err2, err2
    monkeypatch.undo()
    status, _ = run(capsys, "opt", repro, "--passes", "copies-to-linalg")
    assert status == 0
    assert not src.with_suffix(".so").exists()


def test_kina_pass_that_raises_is_an_internal_error(src, monkeypatch, capsys):
    def explode(self, module_op):
        raise KeyError("no such op")
    monkeypatch.setattr(abi.Abi, "run", explode)
    status, err = run(capsys, src, "--emit", "abi")
    assert status == 2, err
    assert err.startswith("kinac: internal compiler error: pass 'abi' raised KeyError"), err
    assert "--passes abi" in reproducer_path(err).read_text()


def test_kina_pass_that_refuses_the_reference_ir_is_an_internal_error(src, monkeypatch, capsys):
    """A refusal (`Unsupported`) is the user's error in kinac opt, but in a build the
    IR is kinac's own: an internal error naming the pass, the op's place and why."""
    from kina.ir.passes import Unsupported

    def refuse(self, module_op):
        raise Unsupported(module_op.regions[0].blocks[0].operations[0], "cannot take this on purpose")
    monkeypatch.setattr(abi.Abi, "run", refuse)
    status, err = run(capsys, src, "--emit", "abi")
    assert status == 2, err
    assert err.startswith(f"kinac: internal compiler error: pass 'abi' cannot take {src}: {src}:1:"), err
    assert "error: abi: cannot take this on purpose" in err
    assert "--passes abi" in reproducer_path(err).read_text()


def test_failing_upstream_pass_names_its_pipeline(src, monkeypatch, capsys):
    # Without the abi pass the function keeps tensor parameters; one-shot bufferization
    # leaves to_buffer ops on them that the deallocate pipeline cannot legalize.
    monkeypatch.setattr(abi.Abi, "run", lambda self, module_op: None)
    status, err = run(capsys, src, "--emit", "to-llvm")
    assert status == 2, err
    assert err.startswith("kinac: internal compiler error: pass 'deallocate' failed"), err
    assert f'"{src}":1:12): failed to legalize' in err, "the pass error points back into the .kina source"
    repro = reproducer_path(err)
    pipe = BY_NAME["deallocate"].pipeline
    assert f"--pass-pipeline='builtin.module({pipe})'" in repro.read_text()
    proc = mlir_opt(repro, f"--pass-pipeline=builtin.module({pipe})")
    assert proc.returncode != 0 and "failed to legalize operation 'bufferization.to_buffer'" in proc.stderr, \
        "the reproducer must fail the same way"


def test_user_error_still_exits_1_when_the_back_end_is_broken(src, monkeypatch, capsys):
    # A user's error stops in the front end, before any broken stage runs.
    monkeypatch.setattr(lower, "lower", _bad_lower)
    src.write_text(SOURCE.replace("a + a", "a @ a"))
    status, err = run(capsys, src)
    assert status == 1, err
    assert err.startswith(f"{src}:2:11: error: matmul: contraction dims differ"), err
    assert "internal" not in err and not list(src.parent.glob("kina-repro-*"))
