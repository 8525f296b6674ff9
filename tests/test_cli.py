"""kinac from the command line: exit codes, diagnostics, every --emit stage, --dump-dir, -o,
--version, and `kinac run` compiled and interpreted.

Most tests call `cli.main(argv)` in-process (fast); the ones about what a user
sees at the process level (no traceback, --version, exit status) run
`python -m kina` in a subprocess.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kina
from kina import knobs
from kina.driver import cli
from kina.driver import pipeline
from kina.driver import toolchain
from kina.frontend.diagnostics import KinaError, ToolError

from conftest import EXAMPLES

STATIC = EXAMPLES / "storylm0_kv_step.kina"
DYN = EXAMPLES / "storylm0_kv_step_dyn.kina"


def kinac(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "kina", *map(str, args)], capture_output=True, text=True,
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
    assert "func.func @kv_step(%q_new: tensor<1x2x1x2xf32>" in out and "tensor.insert_slice" in out
    assert "tensor.concat" not in out and "memref" not in out
    assert "loc(" not in out
    rc, with_locs, _ = main(capsys, example, "--emit", "mlir", "--locs")
    assert f'loc("{example}":16:16)' in with_locs and re.search(r'= loc\("k_next"\(#loc\d*\)\)', with_locs)


@pytest.mark.parametrize("level", ["-O0", "-O3"])
def test_emit_after_a_pass(capsys, example, level):
    rc, out, _ = main(capsys, example, "--emit", "abi", level)
    assert rc == 0 and "func.func @kina_kv_step(%q_new: memref<1x2x1x2xf32" in out and "llvm.emit_c_interface" in out
    rc, out, _ = main(capsys, example, "--emit", "matmul-loops", level)
    assert rc == 0 and ("scf.for" in out) == (level == "-O3") and "memref.alloc" in out


def test_list_passes(capsys):
    from kina.ir.passes import PASSES
    rc, out, _ = main(capsys, "--list-passes")
    assert rc == 0
    rows = [r for r in out.splitlines()[1:] if r and not r[0].isspace() and not r.startswith("Options")]
    assert [r.split()[0] for r in rows] == [p.name for p in PASSES]
    assert all(r.split()[1] in ("kina", "upstream") for r in rows)
    # each pass's options follow its row, with their defaults
    # indented lines only ([ ]+, not \s+, which also matches a newline and backtracks exponentially)
    assert re.search(r"^matmul-loops .*\n(?:[ ]+.*\n)*?[ ]+unroll=8: ", out, re.M), out
    assert re.search(r"^sum-loops .*\n\s+vector-bytes=256: ", out, re.M), out
    assert "--passes 'matmul-loops{unroll=4},sum-loops'" in out


def test_list_passes_shows_what_a_build_for_the_cpu_changes(capsys):
    """An option a build for --cpu runs with another value than its default says so: without
    AVX-512, register tiles keep 64 bytes of sums per row (passes.for_target)."""
    rc, avx2, _ = main(capsys, "--list-passes", "--cpu", "x86-64-v3")
    assert rc == 0 and re.search(r"^[ ]+tile-row-bytes=384: .*\[this target: 64\]$", avx2, re.M), avx2
    assert avx2.count("[this target:") == 1
    rc, avx512, _ = main(capsys, "--list-passes", "--cpu", "x86-64-v4")
    assert rc == 0 and "[this target:" not in avx512
    rc, _, err = main(capsys, "--list-passes", "--cpu", "pentium")
    assert rc == 1 and "unknown --cpu 'pentium'" in err


def test_a_build_for_this_machine_cuts_ops_into_one_part_per_core(capsys, tmp_path, monkeypatch):
    """threads' parts: a build for this machine cuts an op of static size into one part per
    core of the machine (at least 2), whatever KINA_NUM_THREADS says (a build does not depend
    on the threads a call later runs on), and --list-passes says so; a portable build keeps
    the table's 4. x[4, 576] @ W[576, 1536] is cut along W's columns."""
    src = tmp_path / "mm.kina"
    src.write_text("let f = fn(x: tensor<F32, [4, 576], @host>, w: tensor<F32, [576, 1536], @host>) "
                   "-> (tensor<F32, [4, 1536], @host>) {\n  (x @ w)\n}\n")
    widths = {}
    for cores, threads, cpu, width in [(2, "1", "native", 768), (2, "8", "native", 768), (8, "2", "native", 192),
                                       (1, "1", "native", 768), (8, "8", "x86-64-v4", 384)]:
        monkeypatch.setattr("os.cpu_count", lambda: cores)
        with knobs.scoped(KINA_NUM_THREADS=threads):
            rc, out, _ = main(capsys, src, "--emit", "threads", "--cpu", cpu)
            widths[cores, threads, cpu] = re.findall(r"memref.subview %w\[0, %\w+\] \[576, (\d+)\]", out)
            assert rc == 0 and widths[cores, threads, cpu] == [str(width)], (cores, threads, cpu, widths)
            rc, out, _ = main(capsys, "--list-passes", "--cpu", cpu)
            shown = re.search(r"^[ ]+parts=4: .*?(\[this target: (\d+)\])?$", out, re.M)
            assert rc == 0 and shown and shown.group(2) == (None if cpu != "native" or cores == 4 else
                                                            str(max(2, cores)))


MATMUL = "let f = fn(x: tensor<F32, [4, 64], @host>, w: tensor<F32, [64, 48], @host>) -> (tensor<F32, [4, 48], @host>) {\n  (x @ w)\n}\n"


def test_pass_options_reach_the_build(capsys, tmp_path):
    """--pass-options gives a pass of the build its options (fma: one rounding per
    multiply-add, other bits than -O0), in the CLI and through Options; a bad one is a
    one-line error naming the flag, or a ValueError naming the parameter."""
    src = tmp_path / "mm.kina"
    src.write_text(MATMUL)
    rc, plain, _ = main(capsys, src, "--emit", "matmul-loops")
    rc2, fused, _ = main(capsys, src, "--emit", "matmul-loops", "--pass-options", "matmul-loops{fma=true}")
    assert rc == rc2 == 0 and "math.fma" in fused and "math.fma" not in plain
    for bad, says in [("matmul-loops{fma=tru}", "option 'fma': expected true or false, got 'tru'"),
                      ("no-such-pass", "unknown pass 'no-such-pass'")]:
        rc, _, err = main(capsys, src, "--pass-options", bad)
        assert rc == 1 and err.startswith("kinac: error: --pass-options: ") and says in err, err
    rc, _, err = main(capsys, src, "-O0", "--pass-options", "matmul-loops{unroll=2}")
    assert rc == 1 and "pass 'matmul-loops' does not run at -O0" in err, err
    with pytest.raises(ValueError, match=r"^pass_options: matmul-loops: unknown option 'unrol'"):
        pipeline.Options(pass_options="matmul-loops{unrol=2}")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 64), np.float32), rng.standard_normal((64, 48), np.float32)
    m0 = kina.compile_source(MATMUL, "mm.kina")
    m1 = kina.compile_source(MATMUL, "mm.kina", pipeline.Options(pass_options="matmul-loops{fma=true}"))
    assert np.allclose(m0.f(x, w)[0], m1.f(x, w)[0], atol=1e-4) and not np.array_equal(m0.f(x, w)[0], m1.f(x, w)[0])


def test_emit_to_llvm(capsys, example):
    rc, out, _ = main(capsys, example, "--emit", "to-llvm")
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
    assert "func.func @kv_step" in (tmp_path / "out.mlir").read_text()
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
    from kina.driver.pipeline import DUMP_EXT, STAGE_NAMES
    names = sorted(p.name for p in dump.iterdir())
    assert names == [f"{i:02d}-{s}.{DUMP_EXT[s]}" for i, s in enumerate(STAGE_NAMES)]
    assert all((dump / n).stat().st_size > 0 for n in names)
    # each dump is what --emit prints for that stage, passes included
    for i, stage in enumerate(STAGE_NAMES[:-3]):
        rc, out, _ = main(capsys, example, "--emit", stage)
        assert out == (dump / names[i]).read_text(), stage
    assert (dump / names[-2]).read_bytes()[:4] == b"\x7fELF"
    assert (dump / names[-1]).read_text().strip().endswith(".so")


def test_dump_dir_at_O0_has_no_file_for_a_skipped_pass(capsys, example, tmp_path):
    from kina.ir.passes import PASSES
    rc, _, _ = main(capsys, example, "-O0", "--emit", PASSES[-1].name, "--dump-dir", tmp_path / "dump")
    assert rc == 0
    written = {p.name.split("-", 1)[1].rsplit(".", 1)[0] for p in (tmp_path / "dump").iterdir()}
    assert written == {"ast", "typed", "mlir"} | {p.name for p in PASSES if not p.optimisation}


def test_dump_dir_stops_at_emit(capsys, example, tmp_path):
    dump = tmp_path / "dump"
    rc, _, _ = main(capsys, example, "--emit", "mlir", "--dump-dir", dump)
    assert rc == 0 and sorted(p.name for p in dump.iterdir()) == ["00-ast.txt", "01-typed.txt", "02-mlir.mlir"]


def test_print_ir_after_all(example):
    from kina.ir.passes import PASSES
    proc = kinac(example, "--emit", PASSES[-1].name, "--print-ir-after-all")
    assert proc.returncode == 0
    assert "llvm.func @kina_kv_step" in proc.stdout
    for p in PASSES:  # Kina's passes are printed as upstream ones are
        if p.kind == "kina":
            assert f"// -----// IR Dump After {p.name} ({p.name}) //----- //" in proc.stderr, p.name
    assert "IR Dump After OneShotBufferize" in proc.stderr


def test_version():
    proc = kinac("--version")
    assert proc.returncode == 0
    assert f"kinac {kina.__version__}" in proc.stdout
    from kina.driver import toolchain
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
    assert code == 0 and "func.func @kv_step" in (folder / "kv.mlir").read_text()


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
    with knobs.scoped(KINA_NO_CACHE=1):
        for args in ([example, "--emit", "llvm"], [example, "--emit", "obj", "-o", tmp_path / "kv.o"],
                     [example, "-o", tmp_path / "x.so"], [bad]):
            main(capsys, *args)
    assert list((tmp_path / "tmp").iterdir()) == []


# -- kinac run with real data: --input NAME=@FILE.npy | NAME=NUMBER, --output-dir, --compare ----------

PARAMS = ("q_new", "k_past", "k_new", "v_past", "v_new", "scale")


def _npy_inputs(folder, arrays, names=PARAMS):
    """Save `arrays` as folder/NAME.npy; the matching --input arguments."""
    folder.mkdir(exist_ok=True)
    args = []
    for name, a in zip(names, arrays):
        np.save(folder / f"{name}.npy", a)
        args += ["--input", f"{name}=@{folder / name}.npy"]
    return args


def test_run_round_trips_through_npy_files(capsys, tmp_path):
    from conftest import kv_inputs
    arrays = list(kv_inputs(1, 2, 2, 3, seed=5))
    inputs = _npy_inputs(tmp_path / "in", arrays[:5]) + ["--input", "scale=0.125"]
    arrays[5] = np.full((1, 1, 1, 1), 0.125, np.float32)  # a number fills the parameter's shape
    for flags, want in [([], kina.compile_file(STATIC).kv_step(*arrays)),
                        (["--interpret"], kina.interpret(STATIC.read_text()).kv_step(*arrays))]:
        out = tmp_path / ("out" + "".join(flags))
        rc, stdout, err = main(capsys, "run", STATIC, *inputs, *flags, "--output-dir", out)
        assert rc == 0 and stdout == "", err
        assert sorted(p.name for p in out.iterdir()) == ["0.npy", "1.npy", "2.npy"]
        assert f"wrote {out / '0.npy'}, {out / '1.npy'}, {out / '2.npy'}" in err
        for i, w in enumerate(want):
            got = np.load(out / f"{i}.npy")
            assert got.dtype == w.dtype and got.shape == w.shape
            np.testing.assert_array_equal(got, w)  # bit for bit what the Python API returns
    # a result read back is an input again: the new caches are the next step's past ones
    rc, _, err = main(capsys, "run", DYN, *_npy_inputs(tmp_path / "in2", [arrays[0]]),
                      "--input", f"k_past=@{out / '0.npy'}", "--input", f"v_past=@{out / '1.npy'}",
                      "--input", "k_new=@" + str(tmp_path / "in" / "k_new.npy"),
                      "--input", "v_new=@" + str(tmp_path / "in" / "v_new.npy"),
                      "--input", "scale=0.125", "--interpret", "--output-dir", tmp_path / "next")
    assert rc == 0, err
    assert np.load(tmp_path / "next" / "0.npy").shape == (1, 2, 2, 5)  # S=4 came from the arrays


def test_run_prints_given_inputs_without_an_output_dir(capsys, tmp_path):
    from conftest import kv_inputs
    inputs = _npy_inputs(tmp_path, kv_inputs(1, 2, 2, 3))
    rc, out, _ = main(capsys, "run", STATIC, *inputs, "--interpret")
    want = kina.interpret(STATIC.read_text()).kv_step(*kv_inputs(1, 2, 2, 3))
    got = _parse_run(out)
    assert [h for h, _ in got] == ["result 0: float32 [1, 2, 2, 4]", "result 1: float32 [1, 2, 4, 2]",
                                   "result 2: float32 [1, 2, 1, 2]"]
    for (_, g), w in zip(got, want):
        np.testing.assert_allclose(g, w.ravel(), atol=1e-6)  # printed to 6 decimals


def test_run_numbers_fill_symbolic_shapes_from_the_arrays_or_from_dim(capsys, tmp_path):
    from conftest import kv_inputs
    q, k_past, _, v_past, _, _ = kv_inputs(2, 3, 4, 5)
    inputs = _npy_inputs(tmp_path, [q, k_past, v_past], names=("q_new", "k_past", "v_past"))
    out = tmp_path / "out"
    rc, _, err = main(capsys, "run", DYN, *inputs, "--input", "k_new=0", "--input", "v_new=1.5",
                      "--input", "scale=0.5", "--interpret", "--output-dir", out)
    assert rc == 0, err
    k_next, v_next = np.load(out / "0.npy"), np.load(out / "1.npy")
    assert k_next.shape == (2, 3, 4, 6) and v_next.shape == (2, 3, 6, 4)
    np.testing.assert_array_equal(k_next[..., 5], 0)
    np.testing.assert_array_equal(v_next[:, :, 5], 1.5)
    # only numbers: --dim gives every size
    rc, _, err = main(capsys, "run", DYN, *[f"--input={p}=1" for p in PARAMS], "--interpret",
                      "--dim", "B=1", "--dim", "H=2", "--dim", "Dh=3", "--dim", "S=4", "--output-dir", out)
    assert rc == 0, err
    np.testing.assert_array_equal(np.load(out / "2.npy"), np.ones((1, 2, 1, 3), np.float32))
    # a --dim that the arrays contradict is refused, not ignored
    rc, _, err = main(capsys, "run", DYN, *inputs, "--input", "k_new=0", "--input", "v_new=1", "--input",
                      "scale=1", "--interpret", "--dim", "S=4")
    assert rc == 1 and "--dim S=4, but the inputs have S=5" in err


def test_run_integer_numbers(capsys, tmp_path):
    src = tmp_path / "add.kina"
    src.write_text("let add = fn(a: tensor<I32, [2, 3], @host>, b: tensor<I32, [2, 3], @host>)"
                   " -> (tensor<I32, [2, 3], @host>) {\n  (a + b)\n}\n")
    b = np.arange(6, dtype=np.int32).reshape(2, 3)
    inputs = _npy_inputs(tmp_path, [b], names=("b",))
    rc, _, err = main(capsys, "run", src, "--input", "a=-7", *inputs, "--output-dir", tmp_path / "out")
    assert rc == 0, err
    got = np.load(tmp_path / "out" / "0.npy")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, b - 7)
    for value, fragment in [("2.5", "parameter 'a' expects @FILE.npy or an integer for int32 (I32), got '2.5'"),
                            ("2147483648", "parameter 'a' expects int32 (I32), got 2147483648, which int32 "
                                           "cannot represent")]:
        rc, _, err = main(capsys, "run", src, "--input", f"a={value}", *inputs)
        assert rc == 1 and fragment in err, err


def _kv_error(*arrays):
    """The message the Python API raises for this call."""
    with pytest.raises((TypeError, ValueError)) as info:
        kina.interpret(STATIC.read_text()).kv_step(*arrays)
    return str(info.value)


@pytest.mark.parametrize("damage", ["float64", "shape", "rank"])
def test_run_wrong_inputs_get_the_python_api_message(capsys, tmp_path, damage):
    from conftest import kv_inputs
    arrays = list(kv_inputs(1, 2, 2, 3))
    arrays[1] = {"float64": arrays[1].astype(np.float64), "shape": arrays[1][..., :2],
                 "rank": arrays[1][0]}[damage]
    message = _kv_error(*arrays)
    assert "'k_past'" in message
    rc, out, err = main(capsys, "run", STATIC, *_npy_inputs(tmp_path, arrays))
    assert rc == 1 and out == ""
    assert err == f"kinac: error: {message}\n"


def test_run_bad_inputs_are_named(capsys, tmp_path):
    from conftest import kv_inputs
    inputs = _npy_inputs(tmp_path, kv_inputs(1, 2, 2, 3))
    folder = str(tmp_path)
    (tmp_path / "text.npy").write_text("not an array")
    np.savez(tmp_path / "both.npz", a=np.zeros(2))
    cases = [
        (inputs[:6], "kv_step() takes 6 arguments (q_new, k_past, k_new, v_past, v_new, scale), got 3: "
                     "no --input for v_past, v_new, scale"),
        (inputs + ["--input", "bias=1"], "kv_step() has no parameter 'bias' (its parameters are: q_new, k_past,"),
        (inputs + ["--input", "scale=2"], f"kv_step(): parameter 'scale' is given twice (--input "
                                          f"scale=@{folder}/scale.npy and --input scale=2)"),
        (inputs[:-1] + ["scale"], "--input expects NAME=@FILE.npy or NAME=NUMBER, got 'scale'"),
        (inputs[:-1] + ["scale=x"], "parameter 'scale' expects @FILE.npy or a number for float32 (F32), got 'x'"),
        (inputs[:-1] + ["scale=1e39"], "parameter 'scale' expects float32 (F32), got 1e39, which float32 cannot"),
        (inputs[:-1] + [f"scale=@{folder}/none.npy"], f"--input scale: {folder}/none.npy: no such file"),
        (inputs[:-1] + [f"scale=@{folder}/text.npy"], f"--input scale: {folder}/text.npy: is not a .npy array file"),
        (inputs[:-1] + [f"scale=@{folder}/both.npz"], f"--input scale: {folder}/both.npz: is an .npz archive, not a "
                                                      f".npy array file (give each array as its own .npy file)"),
        (inputs[:-1] + [f"scale=@{folder}"], f"--input scale: {folder}: is a directory"),
        (inputs[:-1] + ["scale=@"], "--input scale=@ names no file: write the .npy file's path after the @"),
    ]
    for args, fragment in cases:
        rc, out, err = main(capsys, "run", STATIC, *args)
        assert rc == 1 and fragment in err and err.count("\n") == 1 and out == "", (args, err)


def test_run_compare_reports_the_largest_differences(capsys, tmp_path):
    from conftest import kv_inputs
    rc, out, err = main(capsys, "run", STATIC, *_npy_inputs(tmp_path, kv_inputs(1, 2, 2, 3)), "--compare")
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 3
    pattern = r"result (\d): float32 \[[\d, ]+\]  largest difference: (\S+) absolute, (\S+) relative"
    found = [re.fullmatch(pattern, ln) for ln in lines]
    assert all(found), out
    assert [float(m[2]) for m in found[:2]] == [0.0, 0.0]  # the new caches are exact copies
    assert 0 <= float(found[2][2]) < 1e-5 and 0 <= float(found[2][3]) < 1e-4  # the context is rounded


def test_compare_differences():
    from kina.driver.commands import _differences
    nan, inf = np.nan, np.inf
    f = lambda *v: np.array(v, np.float32)
    assert _differences(f(1, 2, nan, inf), f(1, 2, nan, inf)) == (0.0, 0.0)
    assert _differences(f(1, 2.5), f(1, 2)) == (0.5, 0.25)
    assert _differences(f(1e-9), f(0)) == (pytest.approx(1e-9), inf)
    absolute, relative = _differences(f(nan, 1), f(1, 1))
    assert np.isnan(absolute) and np.isnan(relative)
    assert _differences(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)) == (0.0, 0.0)
    assert _differences(np.array(3, np.int32), np.array(1, np.int32)) == (2.0, 2.0)


def test_run_and_bench_take_the_same_inputs(capsys, tmp_path):
    from conftest import kv_inputs
    inputs = _npy_inputs(tmp_path, kv_inputs(1, 2, 2, 3))
    rc, out, err = main(capsys, "bench", STATIC, *inputs, "--repeats", "2")
    assert rc == 0 and "results agree" in out, err
    rc, out, err = main(capsys, "bench", STATIC, *inputs[:2])
    assert rc == 1 and "no --input for k_past" in err


def test_run_input_error_in_a_real_process(tmp_path):
    from conftest import kv_inputs
    arrays = list(kv_inputs(1, 2, 2, 3))
    arrays[0] = arrays[0].astype(np.float64)
    proc = kinac("run", STATIC, *_npy_inputs(tmp_path, arrays))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "kinac: error: kv_step(): parameter 'q_new' expects dtype float32 (F32), got float64\n"


def test_a_started_tool_that_fails_names_a_file_that_reruns_it(example, monkeypatch, tmp_path):
    """opt and llc start before their input exists and read it from stdin; when one
    fails, the ToolError's command names the input file it was also given (kept)."""
    fake = tmp_path / "fake-llc"
    fake.write_text("#!/bin/sh\ncat > /dev/null\necho 'fake-llc: no' >&2\nexit 1\n")
    fake.chmod(0o755)
    toolchain.host(), toolchain.llvm_version()  # cached from the real llc, which they ask
    real = toolchain.find
    monkeypatch.setattr(toolchain, "find", lambda tool: str(fake) if tool == "llc" else real(tool))
    with pytest.raises(ToolError) as e:
        pipeline.run_stages(example.read_text(), str(example), "so")
    assert "fake-llc: no" in str(e.value) and "-relocation-model=pic" in str(e.value)
    ll = re.search(r"(\S+/opt\.ll)", str(e.value)).group(1)
    assert Path(ll).read_bytes().startswith(b"; ModuleID")


def test_started_tools_are_stopped_when_a_build_ends_early(monkeypatch):
    """opt and llc start once the program type-checks (a user's error starts nothing) and
    are killed when a later stage fails; `--emit` before llvm starts nothing."""
    from kina.ir import lower
    started = []
    real = toolchain.Started

    def recording(*a):
        started.append(real(*a))
        return started[-1]
    monkeypatch.setattr(toolchain, "Started", recording)
    with pytest.raises(KinaError):
        pipeline.run_stages("let f = fn(", "bad.kina", "so")
    assert started == []
    source = (EXAMPLES / "storylm0_kv_step.kina").read_text()
    pipeline.run_stages(source, "kv.kina", "mlir")
    assert started == []

    def broken(program):
        raise RuntimeError("lowering broke")
    monkeypatch.setattr(lower, "lower", broken)
    with pytest.raises(RuntimeError, match="lowering broke"):
        pipeline.run_stages(source, "kv.kina", "so")
    assert [s.tool for s in started] == ["opt", "llc"]
    assert all(s._proc.poll() is not None for s in started)


def test_usage_text_names_every_option():
    """cli's docstring (the usage a reader sees first) names every option each command takes."""
    from kina.driver import commands
    entries: list[str] = []  # one per command: its line and the more indented lines that continue it
    for line in cli.__doc__.split("\n\n")[1].splitlines():
        if line.startswith("    kinac"):
            entries.append(line.strip())
        elif entries:
            entries[-1] += " " + line.strip()
    subcommands = ("kinac run ", "kinac bench ", "kinac opt ")
    parsers = {"kinac": cli._compile_parser(), "kinac run": commands._parser(bench=False),
               "kinac bench": commands._parser(bench=True)}
    for command, parser in parsers.items():
        if command == "kinac":  # the compiler's entries: `kinac FILE.kina ...`, `kinac --list-passes`
            entry = " ".join(e for e in entries if not e.startswith(subcommands))
        else:
            (entry,) = [e for e in entries if e.startswith(command + " ")]
        for action in parser._actions:
            flags = [f for f in action.option_strings if f not in ("-h", "--help", "--version")]
            if flags:  # one spelling is enough (-o or --output)
                assert any(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", entry) for f in flags), \
                    f"{command}: {'/'.join(flags)} is not in the usage"


def test_damaged_files_are_one_line_naming_the_file(tmp_path):
    """Every file kinac reads, truncated, garbage, huge or a directory: one line naming the
    file and what it was for, exit 1, through the real program (kina.files)."""
    import struct
    good = tmp_path / "q.npy"
    np.save(good, np.ones((1, 2, 1, 2), np.float32))
    cut = tmp_path / "cut.npy"
    cut.write_bytes(good.read_bytes()[:-3])
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    huge = tmp_path / "huge.npy"
    huge.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 64)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 4)
    (tmp_path / "dir.kina").mkdir()
    example = str(STATIC)
    inputs = ["--input", "k_past=0", "--input", "k_new=0", "--input", "v_past=0", "--input", "v_new=0",
              "--input", "scale=0"]
    cases = [
        (["run", example, "--input", f"q_new=@{cut}", *inputs], f"--input q_new: {cut}: is truncated"),
        (["run", example, "--input", f"q_new=@{huge}", *inputs], f"--input q_new: {huge}: is truncated: its header "
                                                                 "declares [100000, 100000] float32"),
        (["run", example, "--input", f"q_new=@{garbage}", *inputs], f"--input q_new: {garbage}: is not a .npy"),
        (["opt", str(garbage), "--passes", "abi"], f"the input IR: {garbage}: is not UTF-8 text"),
        (["opt", str(tmp_path), "--passes", "abi"], f"the input IR: {tmp_path}: is a directory"),
        ([str(tmp_path / "dir.kina")], f"the source: {tmp_path / 'dir.kina'}: is a directory"),
        ([str(garbage)], f"{garbage}:2:118: error: source is not valid UTF-8 (byte 0x80 at offset 128)"),
    ]
    for argv, words in cases:
        proc = subprocess.run([sys.executable, "-m", "kina", *argv], capture_output=True, text=True)
        assert proc.returncode == 1, (argv, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr)
        assert proc.stderr.count("\n") == 1 or ": error: " in proc.stderr.splitlines()[0], (argv, proc.stderr)


QUANTIZED = ("let f = fn(x: tensor<F32, [2, 64], @host>, w: tensor<Q4_0, [64, 32], @host>) "
             "-> (tensor<F32, [2, 32], @host>) {\n  (x @ w)\n}\n")


def test_run_a_block_quantized_parameter(capsys, tmp_path):
    """kinac run gives a block-quantized parameter random blocks (finite scales), or reads the
    uint8 bytes of its GGUF rows from an .npy file; the build agrees with the interpreter."""
    from kina.runtime.quant import random_blocks
    src = tmp_path / "q.kina"
    src.write_text(QUANTIZED)
    rc, out, err = main(capsys, "run", src, "--compare")
    assert rc == 0 and re.match(r"result 0: float32 \[2, 32\]  largest difference: \S+ absolute", out), err
    w = random_blocks("Q4_0", (64, 32), np.random.default_rng(3))
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    np.save(tmp_path / "w.npy", w.data)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "wf.npy", w.dequantize())
    rc, out, err = main(capsys, "run", src, "--input", f"x=@{tmp_path}/x.npy", "--input", f"w=@{tmp_path}/w.npy",
                        "--output-dir", tmp_path / "out")
    assert rc == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "out" / "0.npy"), x @ w.dequantize(), rtol=1e-5, atol=1e-5)
    for args, fragment in [
        ([f"x=@{tmp_path}/x.npy", f"w=@{tmp_path}/wf.npy"],
         "a Q4_0 parameter takes the uint8 bytes of its GGUF rows, [..., N, K / 32 * 18], got float32 [64, 32]"),
        (["x=1", "w=2"], "f(): parameter 'w' is Q4_0: give it as @FILE.npy (the uint8 bytes of its GGUF rows)"),
    ]:
        rc, out, err = main(capsys, "run", src, *[a for v in args for a in ("--input", v)])
        assert rc == 1 and fragment in err and err.count("\n") == 1, err
