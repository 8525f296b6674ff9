"""Generic programs: type parameters (`fn[T]`) and fixed dims, specialised by `check`.

`check.check(program, dtypes={"T": "F16"}, dims={"S": 128})` replaces each type
parameter and each fixed dim name in the written types, then checks the result
as if it had been written so. These tests parse, check and specialise (every
type and `Function.sig` becomes concrete), and reach every error: bad arguments
are ValueErrors naming the argument, mistakes in the program are located
KinaErrors, and an error in a specialisation says where each value came from.
"""
import re

import numpy as np
import pytest

from kina.frontend import ast
from kina.frontend import check
from kina.frontend import syntax
from kina.frontend.diagnostics import KinaError, Loc
from kina.frontend.types import Dim, Signature, TensorType

from conftest import EXAMPLES

F = "g.kina"

ATTEND = """\
let attend = fn[T](q: tensor<T, [B, H, 1, Dh], @host>, k: tensor<T, [B, H, Dh, S], @host>,
                   k_new: tensor<T, [B, H, Dh, 1], @host>, v: tensor<T, [B, H, S+1, Dh], @host>)
    -> (tensor<T, [B, H, Dh, S+1], @host>, tensor<T, [B, H, 1, Dh], @host>) {
  let k_next = concat[axis=3] k k_new;
  let probs = softmax(q @ k_next, axis=3);
  (k_next, probs @ v)
}
"""
T_AT = (1, 17)  # where ATTEND declares T


def parse(src: str) -> ast.Program:
    return syntax.parse(src, F)


def checked(src: str, dtypes=None, dims=None) -> ast.Program:
    return check.check(parse(src), dtypes, dims)


def located(src: str, dtypes=None, dims=None) -> KinaError:
    with pytest.raises(KinaError) as info:
        checked(src, dtypes, dims)
    assert info.value.render().startswith(f"{F}:{info.value.loc.line}:{info.value.loc.col}: error: ")
    return info.value


def at(e: KinaError) -> tuple[int, int]:
    return (e.loc.line, e.loc.col)


def notes(e: KinaError) -> list[tuple[int, int, str]]:
    return [(loc.line, loc.col, msg) for loc, msg in e.notes]


def ty(dims: str, dtype: str) -> TensorType:
    return TensorType(dtype, tuple(Dim.parse(d) for d in dims.split(",")))


def all_types(fn: ast.Function) -> list[TensorType]:
    """The type of every expression, and every type in the signature."""
    out, stack = [], [let.value for let in fn.body] + list(fn.results)
    while stack:
        e = stack.pop()
        out.append(e.type)
        stack.extend(ast.children(e))
    return out + [t for _, t in fn.sig.params] + list(fn.sig.results) + list(fn.sig.temporaries)


def one_fn(type_params: str, params: str, results: str, body: str = "(a)") -> str:
    return f"let f = fn{type_params}({params}) -> ({results}) {{\n  {body}\n}}\n"


# -- parsing -------------------------------------------------------------------------------

def test_type_parameters_parse_with_their_locations():
    fn = parse("let f = fn[T, Uu](a: tensor<T, [2], @host>) -> (tensor<Uu, [2], @host>) {\n(a)\n}\n").functions[0]
    assert fn.type_params == (ast.TypeParam("T", Loc(F, 1, 12, 1, 13)), ast.TypeParam("Uu", Loc(F, 1, 15, 1, 17)))
    assert fn.params[0].type.dtype == "T" and fn.result_types[0].dtype == "Uu"
    assert all(t.value is None for t in fn.type_params)
    assert parse("let f = fn(a: tensor<F32, [2], @host>) -> () {\n(a)\n}\n").functions[0].type_params == ()


@pytest.mark.parametrize("head,col,message", [
    ("fn[]", 12, "expected a name, found ']'"),
    ("fn[T,]", 14, "expected a name, found ']'"),
    ("fn[T U]", 14, "expected ',' or ']', found 'U'"),
    ("fn[2]", 12, "expected a name, found '2'"),
    ("fn T", 12, "expected '(' or '[', found 'T'"),
])
def test_type_parameter_syntax_errors(head, col, message):
    with pytest.raises(KinaError) as info:
        parse(f"let f = {head}(a: tensor<F32, [2], @host>) -> () {{\n(a)\n}}\n")
    assert (at(info.value), info.value.message) == ((1, col), message)


def test_dump_shows_the_parameters_then_their_values_and_the_concrete_types():
    parsed = ast.dump(parse(ATTEND)).splitlines()
    assert parsed[0] == "Function attend[T]  @1:5"
    assert parsed[1] == "  Param q: tensor<T, [B, H, 1, Dh], @host>"
    typed = ast.dump(checked(ATTEND, {"T": "F16"}, {"S": 128})).splitlines()
    assert typed[0] == "Function attend[T=F16]  @1:5"
    assert typed[2] == "  Param k: tensor<F16, [B, H, Dh, 128], @host>"
    assert "  Result tensor<F16, [B, H, Dh, 129], @host>" in typed
    assert "    Concat axis=3 : tensor<F16, [B, H, Dh, 129], @host>  @4:16" in typed
    assert not any(re.search(r"<T,|\bS\b", line) for line in typed)


# -- specialising ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32", "F64"])
def test_a_type_parameter_becomes_its_dtype_everywhere(dtype):
    program = checked(ATTEND, {"T": dtype})
    (fn,) = program.functions
    assert fn.type_params == (ast.TypeParam("T", Loc(F, *T_AT, 1, 18), value=dtype),)
    assert {t.dtype for t in all_types(fn)} == {dtype}
    assert {p.type.dtype for p in fn.params} | {t.dtype for t in fn.result_types} == {dtype}
    assert fn.sig.results == (ty("B, H, Dh, S+1", dtype), ty("B, H, 1, Dh", dtype))


def test_fixed_dims_make_a_static_specialisation():
    fn = checked(ATTEND, {"T": "F32"}, {"B": 1, "H": 2, "Dh": 4, "S": 128}).functions[0]
    assert all(t.is_static for t in all_types(fn))
    assert all(d.is_static for p in fn.params for d in p.type.dims)
    assert fn.sig == Signature("attend", (
        ("q", ty("1, 2, 1, 4", "F32")), ("k", ty("1, 2, 4, 128", "F32")), ("k_new", ty("1, 2, 4, 1", "F32")),
        ("v", ty("1, 2, 129, 4", "F32"))),
        (ty("1, 2, 4, 129", "F32"), ty("1, 2, 1, 4", "F32")),
        (ty("1, 2, 4, 129", "F32"), ty("1, 2, 1, 129", "F32"), ty("1, 2, 1, 129", "F32"), ty("1, 2, 1, 4", "F32")))
    partly = checked(ATTEND, {"T": "F32"}, {"S": 0}).functions[0]  # the others stay symbolic
    assert partly.sig.results == (ty("B, H, Dh, 1", "F32"), ty("B, H, 1, Dh", "F32"))


def test_the_symbolic_example_specialises_to_the_static_one():
    dyn = syntax.parse((EXAMPLES / "storylm0_kv_step_dyn.kina").read_text(), "dyn.kina")
    static = check.check(syntax.parse((EXAMPLES / "storylm0_kv_step.kina").read_text(), "static.kina"))
    fixed = check.check(dyn, dims={"B": 1, "H": 2, "Dh": 2, "S": 3})
    assert fixed.functions[0].sig == static.functions[0].sig
    assert all_types(fixed.functions[0]) == all_types(static.functions[0])  # every expression's type too
    assert [p.type.dims for p in fixed.functions[0].params] == [p.type.dims for p in static.functions[0].params]
    assert check.check(dyn, dtypes={}, dims={}).functions[0].sig == check.check(dyn).functions[0].sig


def test_several_parameters_and_several_functions():
    src = ("let f = fn[T, U](a: tensor<T, [2], @host>, i: tensor<U, [2], @host>) -> (tensor<T, [4], @host>) {\n"
           "  (concat[axis=0] a a)\n}\n"
           "let g = fn[T](a: tensor<T, [N], @host>) -> (tensor<T, [N], @host>) {\n  (softmax(a, axis=0))\n}\n"
           "let h = fn(a: tensor<F64, [N], @host>) -> (tensor<F64, [N], @host>) {\n  (a)\n}\n")
    f, g, h = checked(src, {"T": "F16", "U": "I64"}, {"N": 8}).functions
    assert f.sig.params == (("a", ty("2", "F16")), ("i", ty("2", "I64")))
    assert [t.value for t in f.type_params] == ["F16", "I64"]
    assert g.sig.params == (("a", ty("8", "F16")),) and h.sig.results == (ty("8", "F64"),)  # each function's N


def test_a_specialisation_is_checked_as_written():
    # A symbolic program that holds only for one value of S is accepted for that value.
    src = one_fn("", "a: tensor<F32, [S], @host>, b: tensor<F32, [4], @host>", "tensor<F32, [4], @host>", "(a + b)")
    assert "shapes differ: lhs [S], rhs [4]" in located(src).message
    assert checked(src, dims={"S": 4}).functions[0].sig.results == (ty("4", "F32"),)
    # and T may meet a written dtype: T=F32 equals F32
    mixed = one_fn("[T]", "a: tensor<T, [2], @host>, b: tensor<F32, [2], @host>", "tensor<F32, [2], @host>",
                   "(a * b)")
    assert checked(mixed, {"T": "F32"}).functions[0].sig.results == (ty("2", "F32"),)
    assert "'*': dtypes differ: lhs is F16, rhs is F32" in located(mixed, {"T": "F16"}).message


def test_convert_takes_a_type_parameter_as_its_dtype():
    src = one_fn("[T]", "a: tensor<T, [2], @host>", "tensor<T, [2], @host>",
                 "(convert[dtype=T] (convert[dtype=F32] a * convert[dtype=F32] a))")
    assert checked(src, {"T": "F16"}).functions[0].sig.results == (ty("2", "F16"),)
    bad = located(src.replace("dtype=T", "dtype=U"), {"T": "F16"})
    assert bad.message == ("convert: unknown dtype 'U': expected one of F16, BF16, F32, F64, I32, I64 "
                           "or a type parameter of f (T)")
    assert bad.loc.col == src.splitlines()[-2].index("dtype=T") + len("dtype=") + 1


# -- errors in the arguments: ValueErrors that name the argument -----------------------------------

def test_unknown_names_are_value_errors_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"^dtypes: 'X' is not a type parameter of any function in g\.kina; "
                                         r"its type parameters are T$"):
        checked(ATTEND, {"T": "F16", "X": "F32"})
    with pytest.raises(ValueError, match=r"dtypes: 'T' is not a type parameter .* it declares none"):
        check.check(syntax.parse((EXAMPLES / "storylm0_kv_step.kina").read_text(), F), {"T": "F16"})
    with pytest.raises(ValueError, match=r"^dims: 'N' is not a dim name of any function in g\.kina; "
                                         r"its dim names are B, H, Dh, S$"):
        checked(ATTEND, {"T": "F16"}, {"N": 3})
    with pytest.raises(ValueError, match=r"dims: 'T' is not a dim name .*"):  # a type parameter is no dim
        checked(ATTEND, {"T": "F16"}, {"T": 3})
    result_only = one_fn("", "a: tensor<F32, [2], @host>", "tensor<F32, [N], @host>")
    with pytest.raises(ValueError, match=r"dims: 'N' is not a dim name .* its parameters have none"):
        checked(result_only, dims={"N": 2})


@pytest.mark.parametrize("value", ["F17", "f16", "T", 16, None])
def test_a_dtype_value_must_be_a_dtype(value):
    with pytest.raises(ValueError, match=r"^dtypes\['T'\] must be a dtype, one of F16, BF16, F32, F64, I32, I64, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K; "
                                         f"got {re.escape(repr(value))}$"):
        checked(ATTEND, {"T": value})


@pytest.mark.parametrize("value", [-1, 1.5, "4", True, None])
def test_a_dim_value_must_be_a_non_negative_int(value):
    with pytest.raises(ValueError, match=rf"^dims\['S'\] must be a non-negative int; got {re.escape(repr(value))}$"):
        checked(ATTEND, {"T": "F32"}, {"S": value})


def test_dtypes_and_dims_must_be_mappings():
    with pytest.raises(TypeError, match="dtypes must be a mapping from names to values, got list"):
        checked(ATTEND, [("T", "F16")])
    with pytest.raises(TypeError, match="dims must be a mapping from names to values, got str"):
        checked(ATTEND, {"T": "F16"}, "S=3")


# -- errors in the program: located -----------------------------------------------------------------

def test_a_type_parameter_without_a_value_is_an_error_at_its_declaration():
    e = located(ATTEND)
    assert at(e) == T_AT
    assert e.message == ("type parameter 'T' of attend has no value: "
                         "give it with dtypes={'T': ...} or kinac --dtype T=...")
    assert e.render().splitlines()[2] == " " * 16 + "^"


@pytest.mark.parametrize("type_params,params,col,message,note", [
    ("[F32]", "a: tensor<F32, [2], @host>", 12,
     "type parameter 'F32' of f has the name of a dtype: call it something else (T, U, ...)", None),
    ("[S]", "a: tensor<S, [2, S], @host>", 12,
     "type parameter 'S' of f has the name of a dim: rename one of them", (1, 32, "dim 'S' used here")),
    ("[T, U, T]", "a: tensor<T, [2], @host>, b: tensor<U, [2], @host>", 18,
     "type parameter 'T' of f is declared twice", (1, 12, "'T' first declared here")),
    ("[T, U]", "a: tensor<T, [2], @host>", 15,
     "type parameter 'U' of f is not used: no parameter or result type of f is tensor<U, ...>", None),
])
def test_bad_type_parameters_are_located(type_params, params, col, message, note):
    src = one_fn(type_params, params, "tensor<F32, [2], @host>")
    e = located(src, {t.name: "F32" for t in parse(src).functions[0].type_params})  # a value for each
    assert (at(e), e.message) == ((1, col), message)
    assert notes(e) == ([note] if note else [])


def test_a_type_parameter_belongs_to_its_own_function():
    src = ("let f = fn[T](a: tensor<T, [2], @host>) -> (tensor<T, [2], @host>) {\n  (a)\n}\n"
           "let g = fn(a: tensor<T, [2], @host>) -> (tensor<F32, [2], @host>) {\n  (a)\n}\n")
    e = located(src, {"T": "F32"})
    assert (at(e), e.message.split(":")[0]) == ((4, 22), "unknown dtype 'T'")


SOFTMAX = one_fn("[T]", "a: tensor<T, [2, 3], @host>", "tensor<T, [2, 3], @host>", "(softmax(a, axis=1))")


@pytest.mark.parametrize("src,dtype,where,decl,message", [
    (ATTEND, "I32", (5, 23), T_AT, "matmul: needs a floating dtype (F16, BF16, F32, F64), got I32"),
    (SOFTMAX, "I64", (2, 4), (1, 12), "softmax: needs a floating dtype (F16, BF16, F32, F64), got I64"),
])
def test_a_dtype_that_breaks_a_rule_is_the_ordinary_error_with_a_note(src, dtype, where, decl, message):
    e = located(src, {"T": dtype})
    assert (at(e), e.message) == (where, message)
    assert notes(e)[-1] == (*decl, f"T is {dtype} (from dtypes)")
    rendered = e.render().splitlines()
    assert rendered[-3] == f"{F}:{decl[0]}:{decl[1]}: note: T is {dtype} (from dtypes)"
    assert rendered[-1] == " " * (decl[1] - 1) + "^"


def test_a_dim_value_that_contradicts_a_static_dim_is_the_ordinary_shape_error():
    src = one_fn("", "a: tensor<F32, [B, S+1], @host>, b: tensor<F32, [B, 4], @host>",
                 "tensor<F32, [B, 4], @host>", "(a * b)")
    assert checked(src, dims={"S": 3}).functions[0].sig.results == (ty("B, 4", "F32"),)
    e = located(src, dims={"S": 4, "B": 2})
    assert at(e) == (2, 4)
    assert e.message == ("'*': shapes differ: lhs [2, 5], rhs [2, 4] (dim 1: 5 vs 4); "
                         "wrap an operand in broadcast(...) to stretch its dims of size 1")
    # S is bound by no parameter alone, so its note points at the dim that uses it
    assert notes(e)[2:] == [(1, 31, "S is 4 (from dims)"), (1, 28, "B is 2 (from dims)")]


def test_a_dim_value_too_large_for_memory_is_located_at_the_type():
    e = located(ATTEND, {"T": "F64"}, {"S": 1 << 40})
    assert at(e) == (1, 59) and "is too large for memory" in e.message
    assert notes(e) == [(*T_AT, "T is F64 (from dtypes)"), (1, 80, f"S is {1 << 40} (from dims)")]


def test_no_notes_without_a_specialisation():
    e = located(one_fn("", "a: tensor<F32, [2], @host>", "tensor<F32, [3], @host>"))
    assert [msg for _, msg in e.notes] == ["declared here"]


def test_a_generic_device_program_is_refused_once_specialised():
    src = one_fn("[T]", "a: tensor<T, [2], @device>", "tensor<T, [2], @device>")
    e = located(src, {"T": "F16"})
    assert (at(e), e.message) == ((1, 34), "parameter 'a' is @device: only @host tensors can be compiled")


# -- through the driver: kina.compile_file(dtypes=, dims=) and kinac --dtype/--dim ---------------

GENERIC = """let attend = fn[T](q: tensor<T, [B, 1, Dh], @host>, k: tensor<T, [B, Dh, S], @host>)
  -> (tensor<T, [B, 1, S], @host>) {
  (softmax(q @ k, axis=2))
}
"""


@pytest.fixture
def generic_file(tmp_path):
    path = tmp_path / "attend.kina"
    path.write_text(GENERIC)
    return path


@pytest.mark.parametrize("dtype, np_dtype", [("F16", np.float16), ("F32", np.float32), ("F64", np.float64)])
def test_compile_file_specialises_the_element_type(generic_file, dtype, np_dtype):
    import kina
    mod = kina.compile_file(generic_file, dtypes={"T": dtype})
    r = np.random.default_rng(0)
    q, k = r.standard_normal((2, 1, 8)).astype(np_dtype), r.standard_normal((2, 8, 5)).astype(np_dtype)
    (got,) = mod.attend(q, k)
    (want,) = kina.interpret(GENERIC, dtypes={"T": dtype}).attend(q, k)
    assert got.dtype == np_dtype
    np.testing.assert_allclose(got, want, rtol={"F16": 2e-3, "F32": 1e-5, "F64": 1e-12}[dtype])
    with pytest.raises(TypeError, match=r"attend\(\): parameter 'q' expects dtype"):
        mod.attend(q.astype(np.float32 if dtype != "F32" else np.float64), k)


def test_compile_file_fixes_dims_into_a_static_specialisation(generic_file):
    import kina
    mod = kina.compile_file(generic_file, dtypes={"T": "F32"}, dims={"S": 4})
    assert str(mod.attend.signature.params[1][1]) == "tensor<F32, [B, Dh, 4], @host>"
    q, k = np.ones((1, 1, 3), np.float32), np.ones((1, 3, 4), np.float32)
    np.testing.assert_allclose(mod.attend(q, k)[0], 0.25)
    with pytest.raises(ValueError, match=r"parameter 'k' expects shape \[B, Dh, 4\], got \[1, 3, 5\]"):
        mod.attend(q, np.ones((1, 3, 5), np.float32))


def test_the_compile_cache_keys_on_dtypes_and_dims(generic_file):
    from kina.driver import api, cache, pipeline
    source = generic_file.read_bytes()
    keys = {cache.cache_key(source, str(generic_file), api.specialized(pipeline.Options(), dt, dm))
            for dt, dm in [({"T": "F32"}, None), ({"T": "F16"}, None), ({"T": "F32"}, {"S": 4}),
                           ({"T": "F32"}, {"S": 5})]}
    assert len(keys) == 4


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dtypes": {"X": "F32"}}, ValueError, r"dtypes: 'X' is not a type parameter of any function in .*attend\.kina"),
    ({"dtypes": {"T": "F32"}, "dims": {"Q": 3}}, ValueError, r"dims: 'Q'"),
    ({"dtypes": {"T": "F17"}}, ValueError, r"dtypes\['T'\] must be a dtype"),
    ({"dtypes": ["T"]}, TypeError, r"dtypes: expected a mapping"),
])
def test_bad_specialisations_are_clear_errors(generic_file, kwargs, error, match):
    import kina
    with pytest.raises(error, match=match):
        kina.compile_file(generic_file, **kwargs)


def test_a_non_floating_dtype_where_matmul_needs_one_points_at_the_real_file(generic_file):
    import kina
    with pytest.raises(kina.KinaError) as e:
        kina.compile_file(generic_file, dtypes={"T": "I32"})
    text = e.value.render()
    assert text.startswith(f"{generic_file}:3:12: error: matmul: needs a floating dtype"), text
    assert "note: T is I32 (from dtypes)" in text


@pytest.mark.parametrize("flags, message", [
    (["--dtype", "T=F16", "--dtype", "T=F32"], "kinac: error: --dtype T is given twice (F16 and F32)"),
    (["--dtype", "T=F32", "--dim", "S=4", "--dim", "S=5"], "kinac: error: --dim S is given twice (4 and 5)"),
    (["--dtype", "X=F16"], "kinac: error: dtypes: 'X' is not a type parameter"),
    (["--dtype", "T=F32", "--dim", "S=four"], "kinac: error: --dim 'S=four': 'four' is not an integer"),
    (["--dtype", "T"], "kinac: error: --dtype 'T': expected NAME=VALUE"),
])
def test_kinac_dtype_and_dim_errors(generic_file, capsys, flags, message):
    from kina.driver import cli
    assert cli.main([str(generic_file), "--emit", "typed", *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message) and "Traceback" not in err, err


def test_kinac_dtype_and_dim_specialise(generic_file, capsys):
    from kina.driver import cli
    assert cli.main([str(generic_file), "--emit", "mlir", "--dtype", "T=F16", "--dim", "S=8"]) == 0
    out = capsys.readouterr().out
    assert "func.func @attend(%q: tensor<?x1x?xf16>, %k: tensor<?x?x8xf16>) -> tensor<?x1x8xf16>" in out
