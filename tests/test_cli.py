"""kinac from the command line: exit codes, diagnostics, every --emit stage, --dump-dir, -o,
--version, and `kinac run` compiled and interpreted.

Most tests call `cli.main(argv)` in-process (fast); the ones about what a user
sees at the process level (no traceback, --version, exit status) run
`python -m kina.cli` in a subprocess.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kina
from kina import cli

from conftest import EXAMPLES

STATIC = EXAMPLES / "storylm0_kv_step.kina"
DYN = EXAMPLES / "storylm0_kv_step_dyn.kina"


def kinac(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "kina.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def main(capsys, *args):
    """Run kinac in-process: (exit status, stdout, stderr)."""
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def example(tmp_path):
    """A private copy of the static example (some stages write next to the source)."""
    path = tmp_path / "kv.kina"
    shutil.copy(STATIC, path)
    return path


# -- exit codes and diagnostics ----------------------------------------------------------------

USER_ERRORS = [
    # (source, line, col, message fragment)
    ("let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n  let b = a @ @ a;\n  (b)\n}\n",
     2, 15, "expected"),
    ("let f = fn(a: tensor<F32, [2, 3], @host>) -> (tensor<F32, [2, 3], @host>) {\n  let b = a @ a;\n  (b)\n}\n",
     2, 11, "matmul: contraction dims differ"),
    ("let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n  (c)\n}\n",
     2, 4, "undefined name 'c'"),
    ("let f = fn(a: tensor<F32, [2], @device>) -> (tensor<F32, [2], @device>) {\n  (a)\n}\n",
     1, 33, "only @host tensors can be compiled"),
]


@pytest.mark.parametrize("source,line,col,fragment", USER_ERRORS)
def test_user_error_exits_1_with_located_diagnostic(tmp_path, source, line, col, fragment):
    bad = tmp_path / "bad.kina"
    bad.write_text(source)
    proc = kinac(bad)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.splitlines()
    head = f"{bad}:{line}:{col}: error: "
    assert lines[0].startswith(head) and fragment in lines[0], proc.stderr
    assert lines[1] == source.splitlines()[line - 1]
    caret = lines[2]
    assert re.fullmatch(r" *\^~*", caret) and caret.index("^") == col - 1, caret
    assert not (tmp_path / "bad.so").exists()


def test_missing_file_exits_1(tmp_path, capsys):
    rc, out, err = main(capsys, tmp_path / "nope.kina")
    assert rc == 1 and "cannot read" in err and "nope.kina" in err


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([str(STATIC), "--emit", "bogus"])
    assert info.value.code == 2


def test_failing_external_tool_exits_2_with_its_stderr_and_command(example):
    fake_cc = example.parent / "fake-cc"
    fake_cc.write_text("#!/bin/sh\necho 'fake-cc: refusing to link' >&2\nexit 3\n")
    fake_cc.chmod(0o755)
    proc = kinac(example, env={"KINA_CC": str(fake_cc), "KINA_NO_CACHE": "1"})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "cc failed" in proc.stderr and "fake-cc: refusing to link" in proc.stderr
    assert "to reproduce, run:" in proc.stderr and str(fake_cc) in proc.stderr


# -- --emit, stage by stage ----------------------------------------------------------------------

def test_emit_ast(capsys, example):
    rc, out, _ = main(capsys, example, "--emit", "ast")
    assert rc == 0
    assert out.startswith("Function kv_step")
    assert "Param k_past: tensor<F32, [1, 2, 2, 3], @host>" in out
    assert "Let k_next" in out and "Concat axis=3  @16:16" in out and "Softmax axis=3" in out
    assert " : tensor<" not in out  # not typed yet


def test_emit_typed(capsys, example):
    rc, out, _ = main(capsys, example, "--emit", "typed")
    assert rc == 0
    assert "Concat axis=3 : tensor<F32, [1, 2, 2, 4], @host>" in out
    assert "MatMul : tensor<F32, [1, 2, 1, 4], @host>" in out
    assert "Name k_past : tensor<F32, [1, 2, 2, 3], @host>" in out


def test_emit_typed_symbolic(capsys):
    rc, out, _ = main(capsys, DYN, "--emit", "typed")
    assert rc == 0 and "Concat axis=3 : tensor<F32, [B, H, Dh, S+1], @host>" in out


def test_emit_mlir(capsys, example):
    rc, out, _ = main(capsys, example, "--emit", "mlir")
    assert rc == 0
    assert "func.func @kina_kv_step" in out and "tensor.insert_slice" in out and "tensor.concat" not in out
    assert "loc(" not in out
    rc, with_locs, _ = main(capsys, example, "--emit", "mlir", "--locs")
    assert f'loc("{example}":16:16)' in with_locs


def test_emit_lowered(capsys, example):
    rc, out, _ = main(capsys, example, "--emit", "lowered")
    assert rc == 0
    assert "llvm.func @kina_kv_step" in out and "llvm.func @_mlir_ciface_kina_kv_step" in out
    assert not re.search(r"\b(tensor|linalg|memref|bufferization)\.\w+ ", out)


def test_emit_llvm(capsys, example):
    rc, out, _ = main(capsys, example, "--emit", "llvm")
    assert rc == 0
    assert re.search(r"^define .*@_mlir_ciface_kina_kv_step\(", out, re.M)
    assert "target triple" in out


def test_emit_obj(capsys, example):
    rc, out, err = main(capsys, example, "--emit", "obj")
    obj = example.with_suffix(".o")
    assert rc == 0 and out == "" and f"wrote {obj}" in err
    data = obj.read_bytes()
    assert data[:4] == b"\x7fELF"
    symbols = subprocess.run(["nm", str(obj)], capture_output=True, text=True).stdout
    assert re.search(r"\bT _mlir_ciface_kina_kv_step$", symbols, re.M)


def test_emit_so_default_next_to_source(capsys, example):
    rc, out, err = main(capsys, example)
    so, sidecar = example.with_suffix(".so"), example.with_suffix(".json")
    assert rc == 0 and so.is_file() and sidecar.is_file() and "wrote" in err
    with kina.load(so) as mod:
        args = [np.ones(s, np.float32) for s in [(1, 2, 1, 2), (1, 2, 2, 3), (1, 2, 2, 1), (1, 2, 3, 2),
                                                  (1, 2, 1, 2), (1, 1, 1, 1)]]
        k_next, v_next, context = mod.kv_step(*args)
    assert k_next.shape == (1, 2, 2, 4) and v_next.shape == (1, 2, 4, 2) and context.shape == (1, 2, 1, 2)
    np.testing.assert_allclose(context, 1.0, rtol=1e-6)


def test_output_option(capsys, example, tmp_path):
    rc, out, _ = main(capsys, example, "--emit", "mlir", "-o", tmp_path / "out.mlir")
    assert rc == 0 and out == ""
    assert "func.func @kina_kv_step" in (tmp_path / "out.mlir").read_text()
    rc, _, _ = main(capsys, example, "-o", tmp_path / "sub" / "dir" / "step.so")
    assert rc == 0
    assert (tmp_path / "sub" / "dir" / "step.so").is_file() and (tmp_path / "sub" / "dir" / "step.json").is_file()
    assert not example.with_suffix(".so").exists()
    rc, _, _ = main(capsys, example, "--emit", "obj", "-o", tmp_path / "x.o")
    assert rc == 0 and (tmp_path / "x.o").read_bytes()[:4] == b"\x7fELF"


def test_dump_dir_writes_every_stage_numbered(capsys, example, tmp_path):
    dump = tmp_path / "dump"
    rc, _, _ = main(capsys, example, "--dump-dir", dump, "-o", tmp_path / "kv.so")
    assert rc == 0
    names = sorted(p.name for p in dump.iterdir())
    assert names == ["0-ast.txt", "1-typed.txt", "2-mlir.mlir", "3-lowered.mlir", "4-llvm.ll", "5-obj.o", "6-so.txt"]
    assert all((dump / n).stat().st_size > 0 for n in names)
    # each dump is what --emit prints for that stage
    for stage, name in [("ast", "0-ast.txt"), ("typed", "1-typed.txt"), ("mlir", "2-mlir.mlir"),
                        ("lowered", "3-lowered.mlir")]:
        rc, out, _ = main(capsys, example, "--emit", stage)
        assert out == (dump / name).read_text(), stage
    assert (dump / "5-obj.o").read_bytes()[:4] == b"\x7fELF"
    assert (dump / "6-so.txt").read_text().strip().endswith(".so")


def test_dump_dir_stops_at_emit(capsys, example, tmp_path):
    dump = tmp_path / "dump"
    rc, _, _ = main(capsys, example, "--emit", "mlir", "--dump-dir", dump)
    assert rc == 0 and sorted(p.name for p in dump.iterdir()) == ["0-ast.txt", "1-typed.txt", "2-mlir.mlir"]


def test_print_ir_after_all(example):
    proc = kinac(example, "--emit", "lowered", "--print-ir-after-all")
    assert proc.returncode == 0
    assert "IR Dump After" in proc.stderr and "llvm.func @kina_kv_step" in proc.stdout


def test_version():
    proc = kinac("--version")
    assert proc.returncode == 0
    assert f"kinac {kina.__version__}" in proc.stdout
    from kina import toolchain
    assert re.search(rf"MLIR/LLVM {re.escape(toolchain.llvm_version())}\b", proc.stdout)
    assert toolchain.llvm_version().startswith("22.")
    for wheel, version in toolchain.PINNED.items():
        assert f"{wheel} {version}" in proc.stdout


# -- kinac run ---------------------------------------------------------------------------------

def _parse_run(text: str):
    """`kinac run` output -> [(header, values)]: the headers exactly, the values as floats."""
    blocks = re.split(r"^(result \d+: \S+ \[[\d, ]*\])$", text, flags=re.M)
    assert blocks[0].strip() == ""
    out = []
    for header, body in zip(blocks[1::2], blocks[2::2]):
        out.append((header, np.array([float(x) for x in re.findall(r"-?\d+\.\d*(?:e[-+]\d+)?", body)])))
    return out


@pytest.mark.parametrize("path,extra", [(STATIC, []), (DYN, ["--dim", "B=2", "--dim", "H=3", "--dim", "Dh=4",
                                                              "--dim", "S=5"])])
def test_run_compiled_and_interpreted_agree(capsys, path, extra):
    rc, compiled, _ = main(capsys, "run", path, "--seed", "7", *extra)
    assert rc == 0
    rc, interpreted, _ = main(capsys, "run", path, "--interpret", "--seed", "7", *extra)
    assert rc == 0
    got, want = _parse_run(compiled), _parse_run(interpreted)
    assert [h for h, _ in got] == [h for h, _ in want]
    assert len(got) == 3 and all(len(v) > 0 for _, v in got)
    for (h, g), (_, w) in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6, err_msg=h)
    # and the seed matters: another seed gives other numbers
    rc, other, _ = main(capsys, "run", path, "--interpret", "--seed", "8", *extra)
    assert not np.array_equal(_parse_run(other)[0][1], want[0][1])


def test_run_headers(capsys):
    rc, out, _ = main(capsys, "run", DYN, "--interpret", "--dim", "B=1", "--dim", "H=2", "--dim", "Dh=3",
                      "--dim", "S=0")
    assert rc == 0
    assert [h for h, _ in _parse_run(out)] == ["result 0: float32 [1, 2, 3, 1]", "result 1: float32 [1, 2, 1, 3]",
                                               "result 2: float32 [1, 2, 1, 3]"]


def test_run_in_a_subprocess_has_no_traceback():
    proc = kinac("run", STATIC)
    assert proc.returncode == 0 and proc.stdout.startswith("result 0: float32 [1, 2, 2, 4]")


@pytest.mark.parametrize("args,fragment", [
    (["run", DYN, "--interpret"], "give them with --dim NAME=N"),
    (["run", DYN, "--interpret", "--dim", "S=x"], "--dim expects NAME=N"),
    (["run", STATIC, "--interpret", "--fn", "nope"], "has no function 'nope'"),
])
def test_run_user_errors_exit_1(capsys, args, fragment):
    rc, out, err = main(capsys, *args)
    assert rc == 1 and fragment in err and "Traceback" not in err


def test_bench_times_compiled_against_numpy_and_checks_agreement(capsys):
    code, out, err = main(capsys, "bench", str(EXAMPLES / "storylm0_kv_step_dyn.kina"), "--repeats", "3",
                          "--dim", "B=1", "--dim", "H=2", "--dim", "Dh=4", "--dim", "S=9")
    assert code == 0, err
    assert re.search(r"^kina\s+median\s+[\d.]+ ms .*3 calls\)$", out, re.M)
    assert re.search(r"^kina into\s+median\s+[\d.]+ ms .*3 calls\)$", out, re.M)
    assert re.search(r"^numpy\s+median\s+[\d.]+ ms", out, re.M)
    assert re.search(r"^kina / numpy: [\d.]+ {2}\(results agree; largest difference [\d.e+-]+\)$", out, re.M)


def test_bench_without_dims_is_a_user_error(capsys):
    code, out, err = main(capsys, "bench", str(EXAMPLES / "storylm0_kv_step_dyn.kina"))
    assert code == 1 and "give them with --dim NAME=N" in err and "Traceback" not in err


# -- paths, options and temporary files ------------------------------------------------------------

def test_output_into_a_folder(capsys, example, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    code, out, err = main(capsys, example, "-o", folder)
    assert code == 0, err
    assert (folder / "kv.so").is_file() and (folder / "kv.json").is_file()
    code, out, err = main(capsys, example, "--emit", "mlir", "-o", folder)
    assert code == 0 and "func.func @kina_kv_step" in (folder / "kv.mlir").read_text()


@pytest.mark.parametrize("args, fragment", [
    (["--dump-dir", "{file}"], "kinac: error: [Errno 17] File exists"),
    (["--cpu", "nosuchcpu"], "kinac: error: unknown --cpu 'nosuchcpu'"),
    (["--cpu", "znver4"], "use 'native' or one of x86-64, x86-64-v2, x86-64-v3, x86-64-v4"),
])
def test_bad_paths_and_options_are_user_errors(capsys, example, args, fragment):
    code, out, err = main(capsys, example, *[a.format(file=example) for a in args])
    assert code == 1 and fragment in err and "Traceback" not in err


@pytest.mark.parametrize("dim, fragment", [
    ("=3", "--dim expects NAME=N"), ("Q=2", "--dim Q: kv_step has no such dim (its dims are: B, Dh, H, S)")])
def test_run_dim_errors(capsys, dim, fragment):
    code, out, err = main(capsys, "run", EXAMPLES / "storylm0_kv_step_dyn.kina", "--dim", dim)
    assert code == 1 and fragment in err


def test_no_temporary_folder_is_left_behind(capsys, example, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    bad = tmp_path / "bad.kina"
    bad.write_text("let f = fn(")
    monkeypatch.setenv("KINA_NO_CACHE", "1")
    for args in ([example, "--emit", "llvm"], [example, "--emit", "obj", "-o", tmp_path / "kv.o"],
                 [example, "-o", tmp_path / "x.so"], [bad]):
        main(capsys, *args)
    assert list((tmp_path / "tmp").iterdir()) == []
