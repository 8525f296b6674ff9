"""Calls and `use`: a program with calls is the program written out by hand.

tests/calls/step.kina calls the blocks of tests/calls/blocks.kina (through `use`) and a
function of its own: generic callees and not, one result and several, a call inside a
callee, one callee at two dtypes and shapes, symbolic dims passed through (`S+1`).
tests/calls/step_by_hand.kina is the same program with every call written out. The two
have the same reference IR, op for op, and compile (at -O0 and -O3) to the same bits;
the interpreter agrees. Then: what `check` leaves (no call; inlined names and
locations), `use` from every entry point (the API, the interpreter, kinac), and each
error of `use` and of calls that the one-file corpus (tests/errors/calls.kina) cannot
hold, with the diagnostic rendered from the right file.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import kina
from conftest import assert_same
from kina.driver import cache, cli, pipeline
from kina.driver.pipeline import Options
from kina.frontend import ast, check, syntax, uses

CALLS = Path(__file__).resolve().parent / "calls"
STEP, BY_HAND = CALLS / "step.kina", CALLS / "step_by_hand.kina"


def step_inputs(S: int, seed: int = 0):
    r = np.random.default_rng(seed)
    f32 = lambda *s: r.standard_normal(s).astype(np.float32)
    f16 = lambda *s: r.standard_normal(s).astype(np.float16)
    return f32(S, 4), f32(1, 4), f32(S, 4), f32(1, 4), f16(2, 3), f16(1, 3)


def reference_ir(path: Path) -> str:
    """The module after the `mlir` stage, in MLIR's own numbering and without locations:
    the ops, their order, types and attributes, but not the names of values."""
    build = pipeline.run_stages(path.read_text(), str(path), "mlir")
    return build.module.operation.get_asm()


# -- the same program, with calls and by hand ------------------------------------------------

def test_the_reference_ir_of_calls_is_that_of_the_program_written_out():
    with_calls, by_hand = reference_ir(STEP), reference_ir(BY_HAND)
    assert with_calls.count("linalg.generic") > 20  # the whole step, not an empty module
    assert with_calls == by_hand


def test_the_comparison_of_ir_sees_a_difference(tmp_path):
    # The test above can fail: one op changed in the hand-written program (2 -> 3) is seen.
    changed = tmp_path / "changed.kina"
    changed.write_text(BY_HAND.read_text().replace("let y_rms_norm_x = h * 2;", "let y_rms_norm_x = h * 3;"))
    assert reference_ir(changed) != reference_ir(STEP)


@pytest.mark.parametrize("level", [0, 3])
def test_calls_compile_to_the_bits_of_the_program_written_out(level):
    with_calls = kina.compile_file(STEP, Options(opt_level=level))
    by_hand = kina.compile_file(BY_HAND, Options(opt_level=level))
    for S in (1, 5):
        args = step_inputs(S, seed=S)
        got, want = with_calls.step(*args), by_hand.step(*args)
        assert [g.shape for g in got] == [(S + 1, 4), (1, 4), (S, 4), (2, 3)]
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, what=f"-O{level}, S={S}, result {i}")
    a = step_inputs(3)[0]
    assert_same(with_calls.gate(a, a)[0], by_hand.gate(a, a)[0])  # the main file's helper is an entry


def test_the_interpreter_runs_calls_as_written_out_and_agrees_with_the_compiled_code():
    interpreted = kina.interpret(STEP.read_text(), str(STEP))
    by_hand = kina.interpret(BY_HAND.read_text(), str(BY_HAND))
    compiled = kina.compile_file(STEP)
    args = step_inputs(4, seed=7)
    for i, (got, want, machine) in enumerate(zip(interpreted.step(*args), by_hand.step(*args), compiled.step(*args))):
        assert_same(got, want, what=f"interpreted, result {i}")
        assert_same(machine, got, rtol=1e-2 if got.dtype == np.float16 else 1e-5, atol=1e-3, what=f"compiled, result {i}")


def test_used_functions_are_not_entries():
    module = kina.compile_file(STEP)
    assert hasattr(module, "step") and hasattr(module, "gate")
    for name in ("rms_norm", "append", "attend"):
        assert not hasattr(module, name)
    assert set(kina.interpret(STEP.read_text(), str(STEP)).functions) == {"step", "gate"}


# -- what check leaves --------------------------------------------------------------------------

def test_a_dim_name_is_substituted_by_an_int_or_an_affine_dim():
    from kina.frontend.types import Dim
    S1 = Dim.parse("S+1")
    assert S1.substitute({"S": 128}) == Dim(129)
    assert S1.substitute({"S": Dim.parse("T+1")}) == Dim.parse("T+2")
    assert Dim.parse("S+S+N").substitute({"S": Dim.parse("T+1"), "N": Dim.parse("S")}) == Dim.parse("T+T+S+2")
    assert S1.substitute({"T": 3}) == S1 and Dim(4).substitute({"S": 1}) == Dim(4)


def walk(e: ast.Expr):
    yield e
    for c in ast.children(e):
        yield from walk(c)


def checked_step() -> ast.Function:
    program = check.check(syntax.parse(STEP.read_text(), str(STEP)))
    return {fn.name: fn for fn in program.functions}["step"]


def test_check_leaves_no_call_and_names_the_inlined_lets_after_their_call():
    step = checked_step()
    assert all(isinstance(let, ast.Let) for let in step.body)
    exprs = [e for let in step.body for e in walk(let.value)] + [e for r in step.results for e in walk(r)]
    assert not any(isinstance(e, ast.Call) for e in exprs)
    assert [let.name for let in step.body] == [
        "h.ms", "h",  # let h = rms_norm(x, gain)
        "k", "k_sum",  # let (k, k_sum) = append(k_past, k_new)
        "context.kn.ms", "context.kn", "context.p", "context",  # attend, which calls rms_norm
        "y.gate", "y.rms_norm.x", "y.rms_norm.ms", "y.rms_norm", "y",  # calls inside the value of y
        "rms_norm.ms", "rms_norm"]  # a call in the result tuple
    types = {let.name: let.value.type for let in step.body}
    assert str(types["context.kn"]) == "tensor<F32, [S+1, 4], @host>"  # N bound to S+1
    assert str(types["rms_norm"]) == "tensor<F16, [2, 3], @host>"  # the same callee at F16, [2, 3]


def test_inlined_lets_keep_the_callee_locations():
    step = checked_step()
    blocks = str(CALLS / "blocks.kina")
    lets = {let.name: let for let in step.body}
    assert (lets["h.ms"].loc.file, lets["h.ms"].loc.line) == (blocks, 6)  # `let ms = ...` in rms_norm
    assert (lets["h"].value.loc.file, lets["h"].value.loc.line) == (blocks, 7)  # rms_norm's result
    assert (lets["y.gate"].value.loc.file, lets["y.gate"].value.loc.line) == (str(STEP), 18)  # gate's result
    assert lets["y"].value.loc.file == str(STEP)  # the caller's own op stays the caller's
    ir = pipeline._render(pipeline.run_stages(STEP.read_text(), str(STEP), "mlir", Options(locations=True)), "mlir")
    assert f'"{blocks}":6:' in ir and '%h.ms = ' in ir and '%context.kn = ' in ir


def test_emit_ast_shows_the_call_and_emit_typed_the_inlined_lets(capsys):
    assert cli.main([str(STEP), "--emit", "ast"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('Use "blocks.kina"  @3:5\nFunction step  @5:5\n')
    assert "  Let h  @9:7\n    Call rms_norm  @9:11\n      Name x\n      Name gain\n" in out
    assert "  Let k, k_sum  @10:8\n    Call append  @10:20\n" in out
    assert "Function rms_norm" not in out  # a used file's functions are not the program's
    assert cli.main([str(STEP), "--emit", "typed"]) == 0
    out = capsys.readouterr().out
    assert "Call" not in out and f"  Let h.ms  @{CALLS / 'blocks.kina'}:6:7\n" in out


# -- use from every entry point ---------------------------------------------------------------

TWICE = "let twice = fn(a: tensor<F32, [N], @host>) -> (tensor<F32, [N], @host>) {\n  (a + a)\n}\n"
MAIN = 'use "lib.kina";\nlet f = fn(a: tensor<F32, [3], @host>) -> (tensor<F32, [3], @host>) {\n  (twice(a) * a)\n}\n'
A = np.array([1, 2, 3], np.float32)


def test_a_source_given_as_a_string_uses_files_in_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "lib.kina").write_text(TWICE)
    monkeypatch.chdir(tmp_path)
    assert_same(kina.compile_source(MAIN).f(A)[0], 2 * A * A)
    assert_same(kina.interpret(MAIN).f(A)[0], 2 * A * A)


def test_a_source_given_with_a_filename_uses_files_beside_it(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "lib.kina").write_text(TWICE)
    name = str(tmp_path / "sub" / "main.kina")  # need not exist: only its folder counts
    assert_same(kina.compile_source(MAIN, name).f(A)[0], 2 * A * A)
    assert_same(kina.interpret(MAIN, name).f(A)[0], 2 * A * A)


def test_kinac_compiles_runs_and_emits_a_program_with_uses(tmp_path, capsys):
    (tmp_path / "lib" ).mkdir()
    (tmp_path / "lib" / "twice.kina").write_text('use "more/half.kina";\n' + TWICE)
    (tmp_path / "lib" / "more").mkdir()
    (tmp_path / "lib" / "more" / "half.kina").write_text(TWICE.replace("twice", "half").replace("a + a", "a * 0.5"))
    main = tmp_path / "main.kina"
    main.write_text(MAIN.replace("lib.kina", "lib/twice.kina").replace("twice(a) * a", "twice(a) + half(a)"))
    assert cli.main([str(main), "-o", str(tmp_path / "out.so")]) == 0
    assert_same(kina.load(tmp_path / "out.so").f(A)[0], 2.5 * A)
    assert cli.main(["run", str(main), "--compare"]) == 0  # a used file's function called through another
    assert "largest difference: 0 absolute" in capsys.readouterr().out


# -- the errors the one-file corpus cannot hold ---------------------------------------------------

def error(main: Path, capsys) -> list[str]:
    """kinac's diagnostic for `main`, as lines; exit status 1 and no traceback."""
    assert cli.main([str(main), "--emit", "mlir", "-o", str(main.with_suffix(".mlir"))]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.rstrip("\n").split("\n")


def write(folder: Path, **files: str) -> Path:
    for name, text in files.items():
        (folder / f"{name}.kina").write_text(text)
    return folder / "main.kina"


def test_a_missing_used_file(tmp_path, capsys):
    main = write(tmp_path, main='use "nope.kina";\n' + TWICE)
    assert error(main, capsys) == [
        f'{main}:1:5: error: cannot use "nope.kina": {tmp_path / "nope.kina"}: no such file',
        'use "nope.kina";', "    ^~~~~~~~~~~"]


def test_a_used_folder_is_not_a_file(tmp_path, capsys):
    (tmp_path / "lib.kina").mkdir()
    main = write(tmp_path, main='use "lib.kina";\n' + TWICE)
    assert error(main, capsys)[0] == f'{main}:1:5: error: cannot use "lib.kina": {tmp_path / "lib.kina"}: ' \
                                     "is a directory, not a file"


def test_a_cycle_of_uses_names_every_use_in_it(tmp_path, capsys):
    main = write(tmp_path, main='use "a.kina";\n' + TWICE, a='use "b.kina";\n', b='// b\nuse "a.kina";\n')
    a, b = tmp_path / "a.kina", tmp_path / "b.kina"
    assert error(main, capsys) == [
        f"{b}:2:5: error: cycle of uses: {a} uses {b} uses {a}", 'use "a.kina";', "    ^~~~~~~~",
        f"{a}:1:5: note: {a} uses {b} here", 'use "b.kina";', "    ^~~~~~~~"]


def test_a_file_that_uses_itself(tmp_path, capsys):
    main = write(tmp_path, main='use "main.kina";\n' + TWICE)
    assert error(main, capsys)[0] == f"{main}:1:5: error: {main} uses itself"


def test_a_function_defined_in_two_files_notes_both(tmp_path, capsys):
    main = write(tmp_path, main='use "a.kina";\nuse "b.kina";\n' + MAIN.split("\n", 1)[1], a=TWICE, b="\n" + TWICE)
    a, b = tmp_path / "a.kina", tmp_path / "b.kina"
    assert error(main, capsys) == [
        f"{main}:2:5: error: function 'twice' is defined in both {a} and {b}", 'use "b.kina";', "    ^~~~~~~~",
        f"{a}:1:5: note: 'twice' defined here", TWICE.split("\n")[0], "    ^~~~~",
        f"{b}:2:5: note: 'twice' defined here", TWICE.split("\n")[0], "    ^~~~~"]


def test_the_main_file_may_not_define_a_name_it_uses_either(tmp_path, capsys):
    main = write(tmp_path, main='use "lib.kina";\n' + TWICE, lib=TWICE)
    assert error(main, capsys)[0] == f"{main}:1:5: error: function 'twice' is defined in both {main} and " \
                                     f"{tmp_path / 'lib.kina'}"


def test_a_syntax_error_in_a_used_file_is_shown_there_with_the_use(tmp_path, capsys):
    main = write(tmp_path, main=MAIN, lib=TWICE.replace("(a + a)", "(a + )"))
    lib = tmp_path / "lib.kina"
    lines = error(main, capsys)
    assert lines[:3] == [f"{lib}:2:8: error: expected an expression (a name, a number, '(...)', '-', concat, "
                         "transpose, reshape, slice, convert, broadcast, softmax, exp, sqrt, rsqrt, sigmoid, maximum, "
                         "sum, max or mean), found ')'", "  (a + )", "       ^"]
    assert lines[3:] == [f"{main}:1:5: note: in {lib}, used here", 'use "lib.kina";', "    ^~~~~~~~~~"]


def test_an_argument_of_the_wrong_type_points_at_it_with_a_note_at_the_parameter_in_the_used_file(tmp_path, capsys):
    add = "let add = fn(a: tensor<F32, [N], @host>, b: tensor<F32, [N], @host>) -> (tensor<F32, [N], @host>) {\n" \
          "  (a + b)\n}\n"
    main = write(tmp_path, main=MAIN.replace("(twice(a) * a)", "(add(concat[axis=0] a a, a))"), lib=add)
    lines = error(main, capsys)
    assert lines == [
        f"{main}:3:28: error: add: argument 'b' has type tensor<F32, [3], @host>, expected tensor<F32, [6], @host> "
        "(tensor<F32, [N], @host> with N=6 from 'a')",
        "  (add(concat[axis=0] a a, a))", "                           ^",
        f"{tmp_path / 'lib.kina'}:1:42: note: parameter 'b' of add declared here",
        add.split("\n")[0], " " * 41 + "^"]


def test_an_error_in_a_used_callee_is_shown_in_its_file_with_a_note_at_the_call(tmp_path, capsys):
    lib = "let mm = fn[T](a: tensor<T, [N, N], @host>) -> (tensor<T, [N, N], @host>) {\n  (a @ a)\n}\n"
    main = write(tmp_path, lib=lib,
                 main='use "lib.kina";\nlet f = fn(a: tensor<I32, [2, 2], @host>) -> (tensor<I32, [2, 2], @host>) {\n'
                      "  (mm(a))\n}\n")
    where = tmp_path / "lib.kina"
    lines = error(main, capsys)
    assert lines[0] == f"{where}:2:4: error: matmul: needs a floating dtype (F16, BF16, F32, F64), got I32"
    assert lines[1:3] == ["  (a @ a)", "   ^~~~~"]
    assert [ln for ln in lines if ": note: " in ln] == [
        f"{where}:1:16: note: lhs 'a' defined here", f"{where}:1:16: note: rhs 'a' defined here",
        f"{where}:1:13: note: T is I32 (from the arguments)", f"{where}:1:30: note: N is 2 (from the arguments)",
        f"{main}:3:4: note: in the call of mm here"]
    assert lines[-2:] == ["  (mm(a))", "   ^~~~~"]  # the caller's line, from the caller's file


def test_a_use_is_not_a_call_of_the_using_file(tmp_path, capsys):
    # a used file sees its own functions and those it uses, not its user's
    lib = "let g = fn(a: tensor<F32, [N], @host>) -> (tensor<F32, [N], @host>) {\n  (twice(a))\n}\n"
    main = write(tmp_path, lib=lib, main='use "lib.kina";\n' + TWICE +
                 "let f = fn(a: tensor<F32, [3], @host>) -> (tensor<F32, [3], @host>) {\n  (g(a))\n}\n")
    assert error(main, capsys)[0] == f"{tmp_path / 'lib.kina'}:2:4: error: unknown function 'twice'"


def test_a_generic_block_in_a_used_file_needs_no_dtypes_but_one_in_the_main_file_does(tmp_path, capsys):
    generic = TWICE.replace("fn(", "fn[T](").replace("F32", "T")
    assert_same(kina.compile_source(MAIN, str(write(tmp_path, lib=generic))).f(A)[0], 2 * A * A)
    main = write(tmp_path, main=generic + MAIN.split("\n", 1)[1])  # then twice is an entry of the .so
    assert "type parameter 'T' of twice has no value" in error(main, capsys)[0]


# -- the cache key and the scan of uses ---------------------------------------------------------

@pytest.mark.parametrize("text", [
    'use "a.kina";\nuse "b/c.kina";\nlet f = fn() -> () { (x) }',
    '// a comment\n  use"a.kina";use   "b.kina" ;\n\n// more\nlet f = fn() -> () { (x) }',
    'use // between\n "a.kina" // and\n ;',
    'let f = fn() -> () { (x) }\n',
    '',
])
def test_the_scan_of_uses_finds_what_the_parser_finds(text):
    assert uses.used_paths(text) == [u.path for u in syntax.parse(text).uses]


def test_the_scan_stops_where_the_uses_stop():
    assert uses.used_paths('use "a.kina";\nlet x = 1;\nuse "b.kina";') == ["a.kina"]
    assert uses.used_paths('use "a.kina"\nuse "b.kina";') == ["a.kina"]  # no ';': not a use the parser takes


def test_the_cache_key_changes_with_any_file_the_uses_reach(tmp_path):
    (tmp_path / "lib.kina").write_text('use "inner.kina";\n' + TWICE)
    (tmp_path / "inner.kina").write_text("// inner\n")
    main = str(tmp_path / "main.kina")
    key = lambda: cache.cache_key(MAIN, main, Options())
    first = key()
    (tmp_path / "inner.kina").write_text("// inner, edited\n")
    second = key()
    (tmp_path / "lib.kina").write_text('use "inner.kina";\n' + TWICE + "// edited\n")
    third = key()
    assert len({first, second, third}) == 3
    assert cache.cache_key(MAIN.replace('use "lib.kina";', "// no use"), main, Options()) not in {first, second}
    assert [os.path.basename(n) for n, _ in uses.used_files(MAIN, main)] == ["lib.kina", "inner.kina"]


# -- limits: errors, not a Python RecursionError ---------------------------------------------------

def test_calls_nested_too_deep_are_an_error():
    from kina.frontend.inline import MAX_CALL_DEPTH
    n = MAX_CALL_DEPTH + 5
    source = "".join(f"let f{i} = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {{\n"
                     f"  ({f'f{i + 1}(a)' if i + 1 < n else 'a'})\n}}\n" for i in range(n))
    with pytest.raises(kina.KinaError) as info:
        check.check(syntax.parse(source, "chain.kina"))
    assert info.value.message.startswith(f"calls nested more than {MAX_CALL_DEPTH} deep: f0 calls f1 calls f2 calls")
    shallow = source.replace(f"(f{MAX_CALL_DEPTH}(a))", "(a)")  # the deepest chain that is allowed
    assert len(check.check(syntax.parse(shallow, "chain.kina")).functions) == n


def test_a_deep_callee_deep_in_an_expression_is_an_error_that_says_what_to_do():
    depth = syntax.MAX_DEPTH - 10
    g = "let g = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n  let b = a" + " + a" * depth + \
        ";\n  (b)\n}\n"
    deep = "let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n  let b = g(a)" + " + a" * depth + \
           ";\n  (b)\n}\n"
    with pytest.raises(kina.KinaError) as info:
        check.check(syntax.parse(deep + g, "deep.kina"))
    assert (info.value.loc.line, info.value.loc.col) == (2, 11)
    assert info.value.message == "the call of g is nested too deeply in this expression for g's own: bind it " \
                                 "to a let of its own, let y = g(...);"
    bound = deep.replace("let b = g(a)", "let t = g(a);\n  let b = t")  # as it says
    a = np.arange(2, dtype=np.float32)
    assert_same(kina.interpret(bound + g, "deep.kina").f(a)[0], a * (2 * depth + 1))
