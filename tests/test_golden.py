"""Golden tests of the reference IR, and of the path that builds the .so against mlir-opt.

Each example's `kinac --emit mlir --locs` is compared with tests/golden/<example>.mlir;
after an intended change to the lowering, `pytest --update-golden` rewrites the
files (review the diff). Independently of the golden text:
  * the reference IR is upstream MLIR on tensors: `func.func @kv_step` with the
    Kina parameters and three tensor results, concat as tensor.empty + insert_slice,
    no memref, no bufferization op, no C-interface attribute;
  * every op carries a location inside the .kina file;
  * the pinned `mlir-opt` parses, verifies and round-trips the golden file unchanged;
  * each upstream segment of the real build (bufferize, deallocate, to-llvm) gives
    the same IR through the `mlir-opt` binary as in-process, on the IR that enters it.
"""
import difflib
import re
import subprocess

import pytest

from kina import knobs
from kina.driver import cli
from kina.ir import passes
from kina.driver import pipeline
from kina.driver import toolchain
from kina.driver import translate
from kina.frontend.diagnostics import ToolError

from conftest import ROOT

GOLDEN = ROOT / "tests" / "golden"
EXAMPLES = ["storylm0_kv_step", "storylm0_kv_step_dyn"]
LOC = re.compile(r'loc\((?:"\w+"\()?"([^"]+)":(\d+):(\d+)\)?\)')


def _emit(name: str, *flags: str) -> str:
    """What `kinac examples/NAME.kina --emit mlir FLAGS` prints, run from the repo root."""
    import contextlib
    import io
    import os
    out, cwd = io.StringIO(), os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            assert cli.main([f"examples/{name}.kina", "--emit", "mlir", *flags]) == 0
    finally:
        os.chdir(cwd)
    return out.getvalue()


@pytest.fixture(scope="module")
def emitted():
    return {name: _emit(name, "--locs") for name in EXAMPLES}


@pytest.mark.parametrize("name", EXAMPLES)
def test_golden(name, emitted, update_golden):
    path = GOLDEN / f"{name}.mlir"
    got = emitted[name]
    if update_golden:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
        return
    assert path.exists(), f"{path} is missing: run `pytest --update-golden` and review it"
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"golden/{name}.mlir", "kinac --emit mlir --locs", n=2))
        pytest.fail(f"emitted MLIR differs from the golden file (if intended: pytest --update-golden)\n{diff[:6000]}")


@pytest.mark.parametrize("name", EXAMPLES)
def test_reference_ir_is_upstream_mlir_on_tensors(name):
    text = _emit(name)
    shape = {"storylm0_kv_step": ["1x2x2x4", "1x2x4x2", "1x2x1x2"],
             "storylm0_kv_step_dyn": ["?x?x?x?", "?x?x?x?", "?x?x1x?"]}[name]
    results = ", ".join(f"tensor<{s}xf32>" for s in shape)
    assert re.search(r"func\.func @kv_step\(%q_new: tensor<[^>]*>\s*, %k_past: .*\) -> \(" + re.escape(results) + r"\)",
                     text), text[:2000]
    assert "return %k_next, %v_next, %context :" in text
    ops = set(re.findall(r"\b([a-z_]+)\.[a-z_]+\b(?= |\()", text))
    assert ops <= {"func", "tensor", "linalg", "arith", "math"}, ops
    for banned in ("memref", "bufferization", "llvm.emit_c_interface", "tensor.concat", "kina_"):
        assert banned not in text, banned
    # each concat: one tensor.empty, then one insert_slice of each operand, the parameters themselves
    assert re.search(r"tensor\.insert_slice %k_past into %\w+\[0, 0, 0, 0\]", text)
    assert re.search(r"%k_next = tensor\.insert_slice %k_new into", text)
    assert re.search(r"tensor\.insert_slice %v_past into %\w+\[0, 0, 0, 0\]", text)
    assert re.search(r"%v_next = tensor\.insert_slice %v_new into", text)
    assert "math.exp" in text and "arith.maximumf" in text and "arith.divf" in text


def test_symbolic_example_uses_dynamic_dims(emitted):
    text = emitted["storylm0_kv_step_dyn"]
    assert re.search(r"%S = tensor\.dim %k_past", text)
    assert re.search(r"tensor<\?x\?x\?x\?xf32>", text)
    static = emitted["storylm0_kv_step"]
    assert "?x" not in static and "tensor.dim" not in static


def _op_locations(text: str):
    """(op name, location string) for every operation in `text`, parsed with the MLIR bindings."""
    from mlir import ir
    found = []
    with ir.Context():
        module = ir.Module.parse(text)

        def visit(op):
            found.append((op.name, str(op.location)))
            # A named linalg op's body (linalg.fill's yield) is implicit: never printed, rebuilt
            # by the parser without a location, so only the named op's own location counts.
            named = op.name.startswith("linalg.") and op.name != "linalg.generic"
            return ir.WalkResult.SKIP if named else ir.WalkResult.ADVANCE
        module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_op_has_a_location_in_the_kina_file(name, emitted):
    source = (ROOT / "examples" / f"{name}.kina").read_text().splitlines()
    ops = _op_locations(emitted[name])
    assert len(ops) > 20
    used = set()
    for op, loc in ops:
        if op == "builtin.module":
            continue
        m = LOC.fullmatch(loc)
        assert m, f"{op} has location {loc}, not a file:line:col in the .kina file"
        file, line, col = m.group(1), int(m.group(2)), int(m.group(3))
        assert file == f"examples/{name}.kina", (op, loc)
        assert 1 <= line <= len(source) and 1 <= col <= len(source[line - 1]), (op, loc)
        used.add((line, col))
    # Every let's expression maps back to its line and column: ops exist at each one.
    lets = [(i + 1, m.start(1) + 1) for i, text in enumerate(source)
            if (m := re.match(r"\s*let \w+ = (.*);", text))]
    assert len(lets) == 6
    for line, col in lets:
        assert (line, col) in used, f"no op is located at the let expression at {line}:{col}"


@pytest.fixture(scope="module")
def mlir_opt():
    try:
        return toolchain.find("mlir-opt")
    except ToolError as e:
        pytest.skip(f"mlir-opt not available: {e}")


@pytest.mark.parametrize("name", EXAMPLES)
def test_mlir_opt_round_trips_the_golden_unchanged(name, mlir_opt):
    path = GOLDEN / f"{name}.mlir"
    proc = subprocess.run([mlir_opt, str(path), "--verify-each", "--mlir-print-debuginfo",
                           "--mlir-use-nameloc-as-prefix"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == path.read_text().rstrip("\n"), "mlir-opt prints the golden IR differently"


def _canonical(text: str) -> str:
    """`text` parsed and printed by the bindings, without locations: the form both sides are compared in."""
    from mlir import ir
    with ir.Context():
        return ir.Module.parse(text).operation.get_asm(enable_debug_info=False)


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("level", [0, 3])
def test_upstream_segments_match_the_mlir_opt_binary(name, level, mlir_opt, tmp_path):
    """The real build's IR entering each upstream pass, run through mlir-opt with that
    pass's pipeline, gives what the in-process run gave: what mlir-opt checks is the
    path that builds the .so."""
    pipeline.run_stages((ROOT / "examples" / f"{name}.kina").read_text(), f"{name}.kina", "to-llvm",
                        pipeline.Options(opt_level=level), dump_dir=tmp_path)
    dumps = sorted(tmp_path.glob("*.mlir"))
    checked = 0
    for before, after in zip(dumps, dumps[1:]):
        p = passes.BY_NAME.get(after.stem.split("-", 1)[1])
        if p is None or p.kind != "upstream":
            continue
        if p.only_for and p.only_for not in before.read_text():  # skipped: the module has no such type
            assert _canonical(before.read_text()) == _canonical(after.read_text()), p.name
            continue
        proc = subprocess.run([mlir_opt, str(before), f"--pass-pipeline=builtin.module({p.pipeline})"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, f"{p.name}: {proc.stderr}"
        assert _canonical(proc.stdout) == _canonical(after.read_text()), f"{p.name} differs from mlir-opt"
        checked += 1
    assert checked == 3
    final = dumps[-1].read_text()
    assert "llvm.func @kina_kv_step" in final and "llvm.func @_mlir_ciface_kina_kv_step" in final
    leftover = re.findall(r"\b(?:tensor|linalg|bufferization|memref|scf)\.\w+ ", final)
    assert not leftover, f"not lowered to the LLVM dialect: {sorted(set(leftover))}"


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("level", [0, 3])
def test_in_process_translation_is_what_mlir_translate_prints(name, level, tmp_path):
    """The llvm stage translates in process; its LLVM IR is byte for byte the binary's."""
    b = pipeline.run_stages((ROOT / "examples" / f"{name}.kina").read_text(), f"{name}.kina", "to-llvm",
                            pipeline.Options(opt_level=level))
    ours = translate.to_llvm_ir(b.module, tmp_path / "unused.mlir")
    assert not (tmp_path / "unused.mlir").exists()  # the binary did not run
    (tmp_path / "m.mlir").write_text(b.module.operation.get_asm())
    theirs = toolchain.run("mlir-translate", ["--mlir-to-llvmir", str(tmp_path / "m.mlir")])
    assert ours == theirs and b"define void @_mlir_ciface_kina_kv_step" in ours


def test_translation_of_a_module_not_in_the_llvm_dialect_goes_to_the_binary(tmp_path):
    """A module with any op the C function would not translate is given to mlir-translate,
    whose error is a ToolError naming the file (the C function reports no failure)."""
    from mlir import ir
    with ir.Context(), ir.Location.unknown():
        m = ir.Module.parse("func.func @f() { return }")
        with pytest.raises(ToolError) as e:
            translate.to_llvm_ir(m, tmp_path / "m.mlir")
    assert "m.mlir" in str(e.value) and (tmp_path / "m.mlir").exists()


def test_kina_translate_binary_uses_the_binary(tmp_path, monkeypatch):
    b = pipeline.run_stages((ROOT / "examples" / "storylm0_kv_step.kina").read_text(), "kv.kina", "to-llvm")
    ours = translate.to_llvm_ir(b.module, tmp_path / "unused.mlir")
    with knobs.scoped(KINA_TRANSLATE="binary"):
        assert translate.to_llvm_ir(b.module, tmp_path / "m.mlir") == ours
    assert (tmp_path / "m.mlir").exists() and not (tmp_path / "unused.mlir").exists()
