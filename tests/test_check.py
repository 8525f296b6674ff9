"""Checker tests: each typing rule, positive and negative, and symbolic dim arithmetic.

The positive tests read the inferred type off the checked AST (`Expr.type`); the
negative ones check that a `KinaError` is raised, at the offending expression,
with the part of the message that names the rule. The full corpus of error
messages lives in tests/errors/; here the point is the checker's API and types.
"""
import pytest

from kina.frontend import ast
from kina.frontend import check
from kina.driver import pipeline
from kina.frontend import syntax
from kina.frontend.diagnostics import KinaError
from kina.frontend.types import Dim, Signature, TensorType

from conftest import EXAMPLES

EXPR_LINE, EXPR_COL = 2, 11  # where `expr` starts in the program `typeof` builds


def T(dims: str, dtype: str = "F32", placement: str = "host") -> str:
    return f"tensor<{dtype}, [{dims}], @{placement}>"


def ty(dims: str, dtype: str = "F32", placement: str = "host") -> TensorType:
    return TensorType(dtype, tuple(Dim.parse(d) for d in dims.split(",")) if dims.strip() else (), placement)


def checked(src: str) -> ast.Program:
    return check.check(syntax.parse(src, "c.kina"))


def program_of(expr: str, params: dict[str, str]) -> str:
    """A function with `params` whose one let is `expr`; it returns its first parameter."""
    first = next(iter(params))
    ps = ", ".join(f"{n}: {t}" for n, t in params.items())
    return f"let f = fn({ps}) -> ({params[first]}) {{\n  let r = {expr};\n  ({first})\n}}\n"


def typeof(expr: str, **params: str) -> TensorType:
    fn = checked(program_of(expr, params)).functions[0]
    return fn.body[0].value.type


def error(expr: str, **params: str) -> KinaError:
    """The error for `expr`, asserted to be located where `expr` starts."""
    with pytest.raises(KinaError) as info:
        typeof(expr, **params)
    assert (info.value.loc.line, info.value.loc.col) == (EXPR_LINE, EXPR_COL), info.value.render()
    return info.value


def fn_error(src: str) -> KinaError:
    with pytest.raises(KinaError) as info:
        checked(src)
    return info.value


# -- concat ------------------------------------------------------------------------------

def test_concat_adds_the_axis_dim():
    assert typeof("concat[axis=3] a b", a=T("1, 2, 2, 3"), b=T("1, 2, 2, 1")) == ty("1, 2, 2, 4")
    assert typeof("concat[axis=0] a b", a=T("5, 2", "I64"), b=T("0, 2", "I64")) == ty("5, 2", "I64")


def test_concat_symbolic_dims_add():
    t = typeof("concat[axis=3] k n", k=T("B, H, Dh, S"), n=T("B, H, Dh, 1"))
    assert t == TensorType("F32", (Dim.of("B"), Dim.of("H"), Dim.of("Dh"), Dim(1, (("S", 1),))))
    assert str(t.dims[3]) == "S+1"
    t = typeof("concat[axis=1] a b", a=T("B, S"), b=T("B, N"))
    assert str(t.dims[1]) == "N+S" and t.dims[1] == Dim.parse("S+N")
    t = typeof("concat[axis=0] (concat[axis=0] a a) a", a=T("S+1"), s=T("S"))
    assert t.dims == (Dim(3, (("S", 3),)),)


@pytest.mark.parametrize("expr,params,fragment", [
    ("concat[axis=0] a b", dict(a=T("2, 3"), b=T("2")), "concat: ranks differ"),
    ("concat[axis=0] a b", dict(a=T("2"), b=T("2", "F64")), "concat: dtypes differ: lhs is F32, rhs is F64"),
    ("concat[axis=0] a b", dict(a=T("2"), b=T("2", placement="device")), "concat: placements differ"),
    ("concat[axis=2] a b", dict(a=T("2, 3"), b=T("2, 3")), "concat: axis 2 is out of range for rank 2"),
    ("concat[axis=1] a b", dict(a=T("2, 3"), b=T("4, 3")), "concat: dim 0 differs: lhs [2, 3] has 2, rhs [4, 3] has 4"),
    ("concat[axis=0] a b", dict(a=T("S, B"), b=T("1, S")), "concat: dim 1 differs: lhs [S, B] has B, rhs [1, S] has S"),
])
def test_concat_errors(expr, params, fragment):
    assert fragment in error(expr, **params).message


# -- matmul ------------------------------------------------------------------------------

def test_matmul_types():
    assert typeof("a @ b", a=T("1, 2, 1, 2"), b=T("1, 2, 2, 4")) == ty("1, 2, 1, 4")
    assert typeof("a @ b", a=T("3, 5"), b=T("5, 7"), ) == ty("3, 7")
    assert typeof("a @ b", a=T("3, 5", "F64"), b=T("5, 7", "F64")) == ty("3, 7", "F64")
    assert typeof("a @ b", a=T("B, H, 1, Dh"), b=T("B, H, Dh, S+1"), s=T("S")) == ty("B, H, 1, S+1")
    # mixed: F16 or BF16 against F32 (weights against activations) is F32, either way round
    assert typeof("a @ b", a=T("1, 5"), b=T("5, 7", "F16")) == ty("1, 7")
    assert typeof("a @ b", a=T("3, 5", "BF16"), b=T("2, 5, 7")) == ty("2, 3, 7")


@pytest.mark.parametrize("expr,params,fragment", [
    ("a @ b", dict(a=T("3"), b=T("3")), "matmul: operands must have rank >= 2: lhs [3] has rank 1"),
    ("a @ b", dict(a=T("2, 3"), b=T("3")), "matmul: operands must have rank >= 2: rhs [3] has rank 1"),
    ("a @ b", dict(a=T("2, 3", "I32"), b=T("3, 2", "I32")), "matmul: needs a floating dtype"),
    ("a @ b", dict(a=T("2, 3", "F16"), b=T("3, 2", "BF16")), "matmul: dtypes differ: lhs is F16, rhs is BF16 (expected "
     "one dtype, or F16 or BF16 against F32: that operand is widened)"),
    ("a @ b", dict(a=T("2, 3", "F64"), b=T("3, 2", "F16")), "matmul: dtypes differ: lhs is F64, rhs is F16"),
    ("a @ b", dict(a=T("2, 3", "F16"), b=T("3, 2", "F32", placement="device")), "matmul: placements differ"),
    ("a @ b", dict(a=T("2, 3"), b=T("3, 2", placement="device")), "matmul: placements differ"),
    ("a @ b", dict(a=T("2, 2, 3"), b=T("3, 3, 2")),
     "matmul: batch dims do not broadcast: lhs [2, 2, 3] has 2 at dim 0, rhs [3, 3, 2] has 3 at dim 0 "
     "(aligned from the right, each pair of batch dims must be equal or one of them 1)"),
    ("a @ b", dict(a=T("2, 4, 1, 3"), b=T("3, 3, 2")), "lhs [2, 4, 1, 3] has 4 at dim 1, rhs [3, 3, 2] has 3 at dim 0"),
    ("a @ b", dict(a=T("S, 1, 3"), b=T("T, 3, 2")), "lhs [S, 1, 3] has S at dim 0, rhs [T, 3, 2] has T at dim 0"),
    ("a @ b", dict(a=T("1, 2, 1, 3"), b=T("1, 2, 2, 4")),
     "matmul: contraction dims differ: lhs [1, 2, 1, 3] has K=3, rhs [1, 2, 2, 4] has K=2"),
])
def test_matmul_errors(expr, params, fragment):
    assert fragment in error(expr, **params).message


def test_symbolic_mismatch_shows_both_expressions():
    e = error("q @ k", q=T("B, 1, S+1"), k=T("B, S, 4"))
    assert "K=S+1" in e.message and "K=S" in e.message
    assert "lhs [B, 1, S+1]" in e.message and "rhs [B, S, 4]" in e.message
    e = error("a * b", a=T("S+1"), b=T("S"))
    assert "S+1 vs S" in e.message
    e = error("a @ b", a=T("B, 2, 3"), b=T("N, 3, 2"))
    assert "has B" in e.message and "has N" in e.message


def test_shape_errors_carry_notes_at_the_definitions():
    e = error("a @ b", a=T("2, 3"), b=T("2, 3"))
    assert [(loc.line, msg) for loc, msg in e.notes] == [(1, "lhs 'a' defined here"), (1, "rhs 'b' defined here")]


# -- broadcast, *, +, -, / ---------------------------------------------------------------

@pytest.mark.parametrize("op", ["*", "+", "-", "/"])
def test_elementwise_types(op):
    assert typeof(f"a {op} b", a=T("2, 3"), b=T("2, 3")) == ty("2, 3")
    if op != "/":
        assert typeof(f"a {op} b", a=T("2, 3", "I32"), b=T("2, 3", "I32")) == ty("2, 3", "I32")
    assert typeof(f"a {op} b", a=T("B, S+1"), b=T("B, S+1"), s=T("S")) == ty("B, S+1")
    assert typeof(f"a {op} broadcast(b)", a=T("B, H, 1, S"), b=T("1, 1, 1, 1")) == ty("B, H, 1, S")
    assert typeof(f"broadcast(b) {op} a", a=T("B, 4"), b=T("B, 1")) == ty("B, 4")
    assert typeof(f"broadcast(a) {op} broadcast(b)", a=T("1, S"), b=T("B, 1")) == ty("B, S")


def test_broadcast_node_gets_the_stretched_type():
    fn = checked(program_of("a * broadcast(b)", dict(a=T("2, 3"), b=T("1, 1")))).functions[0]
    mul = fn.body[0].value
    assert mul.rhs.type == ty("2, 3") and mul.rhs.operand.type == ty("1, 1")


@pytest.mark.parametrize("op,what", [("*", "'*'"), ("+", "'+'"), ("-", "'-'"), ("/", "'/'")])
@pytest.mark.parametrize("lhs,rhs,fragment", [
    ("a", "b", "shapes differ: lhs [2, 3], rhs [2, 1] (dim 1: 3 vs 1)"),
    ("a", "broadcast(c)", "cannot broadcast dim 1: lhs [2, 3] has 3, rhs [2, 2] has 2"),
    ("broadcast(c)", "a", "cannot broadcast dim 1: lhs [2, 2] has 2, rhs [2, 3] has 3"),
    ("a", "d", "ranks differ"),
    ("a", "i", "dtypes differ: lhs is F32, rhs is I32"),
    ("a", "h", "placements differ: lhs is @host, rhs is @device"),
])
def test_elementwise_errors(op, what, lhs, rhs, fragment):
    params = dict(a=T("2, 3"), b=T("2, 1"), c=T("2, 2"), d=T("2, 3, 1"), i=T("2, 3", "I32"),
                  h=T("2, 3", placement="device"))
    e = error(f"{lhs} {op} {rhs}", **params)
    assert e.message.startswith(f"{what}: ") and fragment in e.message


def test_broadcast_only_as_an_operand_of_an_elementwise_op():
    for expr in ("broadcast(a)", "broadcast(a) @ a", "softmax(broadcast(a), axis=0)", "-broadcast(a)",
                 "exp(broadcast(a))", "sum(broadcast(a), axis=0)", "transpose[perm=[1, 0]] broadcast(a)"):
        with pytest.raises(KinaError, match=r"broadcast\(\.\.\.\) may only appear as an operand of '\+', '-', "):
            typeof(expr, a=T("1, 1"))


def test_division_needs_a_floating_dtype():
    assert "'/': needs a floating dtype (F16, BF16, F32, F64), got I64" in \
        error("a / a", a=T("2", "I64")).message
    assert "'/': needs a floating dtype" in error("a / 2", a=T("2", "I32")).message


# -- numbers -------------------------------------------------------------------------------

def test_a_number_takes_the_other_operands_dtype_and_shape():
    for expr in ("a * 2", "2 * a", "a + 0.5", "1e-6 + a", "a - -1", "1 / a", "-0.5 * a", "a * -(2)"):
        fn = checked(program_of(expr, dict(a=T("B, S", "F16")))).functions[0]
        e = fn.body[0].value
        number = e.lhs if isinstance(e.lhs, ast.Number) else e.rhs
        assert e.type == number.type == ty("B, S", "F16"), expr
    assert typeof("a * 3 + 1", a=T("2", "I64")) == ty("2", "I64")
    assert typeof("a * 2.0", a=T("2", "I32")) == ty("2", "I32")  # an integer written as a float


def test_a_number_is_not_a_temporary():
    fn = checked(program_of("a * 2", dict(a=T("3")))).functions[0]
    assert fn.sig.temporaries == (ty("3"),)


@pytest.mark.parametrize("expr,dtype,col,fragment", [
    ("2 * 3", "F32", 11, "'*': both operands are numbers: one of them must be a tensor"),
    ("a * 0.5", "I32", 15, "'*': the number 0.5 is not an integer; a number takes the dtype of the other operand, I32"),
    ("a + 3000000000", "I32", 15, "'+': the number 3000000000 is out of the range "
     "of I32 (-2147483648 to 2147483647); a number takes the dtype of the other operand, I32"),
    ("a * 70000", "F16", 15, "'*': the number 70000 is too large for F16 (its "
     "largest finite value is 65504); a number takes the dtype of the other operand, F16"),
    ("a * 1e39", "F32", 15, "'*': the number 1e+39 is too large for F32 (its "
     "largest finite value is 3.40282e+38); a number takes the dtype of the other operand, F32"),
    ("a + 1e-8", "F16", 15, "'+': the number 1e-08 is too small for F16: it would round to 0"),
    ("broadcast(a) * 2", "F32", 11, "broadcast(...) has nothing to stretch to: the other operand of '*' is a number"),
])
def test_number_errors(expr, dtype, col, fragment):
    with pytest.raises(KinaError) as info:
        typeof(expr, a=T("2", dtype))
    assert (info.value.loc.line, info.value.loc.col, info.value.message) == (EXPR_LINE, col, fragment)


@pytest.mark.parametrize("expr", ["2", "-2", "exp(2)", "concat[axis=0] a 2", "a @ 2", "sum(1, axis=0)",
                                  "transpose[perm=[0]] 2"])
def test_a_number_is_only_an_operand_of_an_elementwise_op(expr):
    with pytest.raises(KinaError, match="a number may only appear as an operand of '\\+', '-', '\\*', '/' or maximum "
                                        "\\(it takes the other operand's dtype and shape\\)"):
        typeof(expr, a=T("2"))


# -- unary functions ---------------------------------------------------------------------------

@pytest.mark.parametrize("f", ["-{}", "exp({})", "sqrt({})", "rsqrt({})", "sigmoid({})"])
def test_unary_functions_keep_the_type(f):
    assert typeof(f.format("a"), a=T("B, S+1", "BF16"), s=T("S")) == ty("B, S+1", "BF16")


def test_unary_minus_takes_integers_and_the_others_need_floats():
    assert typeof("-a", a=T("2", "I32")) == ty("2", "I32")
    for name in ("exp", "sqrt", "rsqrt", "sigmoid"):
        e = error(f"{name}(a)", a=T("2", "I64"))
        assert e.message == f"{name}: needs a floating dtype (F16, BF16, F32, F64), got I64"
        assert [msg for _, msg in e.notes] == ["operand 'a' defined here"]


# -- reductions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sum", "max", "mean"])
def test_reductions_keep_the_rank(name):
    assert typeof(f"{name}(a, axis=3)", a=T("B, H, 1, S+1"), s=T("S")) == ty("B, H, 1, 1")
    assert typeof(f"{name}(a, axis=0)", a=T("S, 4", "F16")) == ty("1, 4", "F16")
    assert typeof(f"a - broadcast({name}(a, axis=1))", a=T("B, S")) == ty("B, S")
    if name != "mean":
        assert typeof(f"{name}(a, axis=0)", a=T("2", "I32")) == ty("1", "I32")


@pytest.mark.parametrize("expr,params,fragment", [
    ("sum(a, axis=2)", dict(a=T("2, 3")), "sum: axis 2 is out of range for rank 2 (expected 0 to 1)"),
    ("max(a, axis=0)", dict(a=T("")), "max: operand has rank 0, so there is no axis 0"),
    ("mean(a, axis=0)", dict(a=T("2", "I32")), "mean: needs a floating dtype (F16, BF16, F32, F64), got I32"),
])
def test_reduction_errors(expr, params, fragment):
    assert error(expr, **params).message == fragment


# -- transpose, reshape, slice -------------------------------------------------------------------

def test_transpose_types():
    assert typeof("transpose[perm=[0, 2, 1, 3]] a", a=T("B, 1, H, Dh")) == ty("B, H, 1, Dh")
    assert typeof("transpose[perm=[1, 2, 0]] a", a=T("2, S+1, 4", "I64"), s=T("S")) == ty("S+1, 4, 2", "I64")


@pytest.mark.parametrize("perm,fragment", [
    ("0, 1", "transpose: perm [0, 1] has 2 entries but the operand [2, 3, 4] has rank 3"),
    ("0, 1, 3", "transpose: perm [0, 1, 3] is not a permutation of 0 to 2: 3 is out of range"),
    ("0, 2, 2", "transpose: perm [0, 2, 2] is not a permutation of 0 to 2: 2 appears 2 times"),
])
def test_transpose_errors(perm, fragment):
    assert error(f"transpose[perm=[{perm}]] a", a=T("2, 3, 4")).message == fragment


@pytest.mark.parametrize("expr,params,want", [
    ("reshape[dims=[B, 1, 8, 64]] a", dict(a=T("B, 1, 512")), "B, 1, 8, 64"),
    ("reshape[dims=[B, 512]] a", dict(a=T("B, 8, 64")), "B, 512"),
    ("reshape[dims=[2, B, 12]] a", dict(a=T("B, 4, 6")), "2, B, 12"),  # symbolic dims in order, statics anywhere
    ("reshape[dims=[S+1, 1, 6]] a", dict(a=T("2, S+1, 3"), s=T("S")), "S+1, 1, 6"),
    ("reshape[dims=[]] a", dict(a=T("1, 1")), ""),
    ("reshape[dims=[0, 7]] a", dict(a=T("3, 0")), "0, 7"),
])
def test_reshape_types(expr, params, want):
    assert typeof(expr, **params) == ty(want)


@pytest.mark.parametrize("expr,params,fragment", [
    ("reshape[dims=[B, 1, 8, 32]] a", dict(a=T("B, 1, 512")),
     "reshape: element counts differ: the operand [B, 1, 512] has B*512, the result [B, 1, 8, 32] has B*256"),
    ("reshape[dims=[S, B, 4]] a", dict(a=T("B, S, 4")),
     "reshape: the symbolic dims must stay, in order: the operand [B, S, 4] has B, S, the result [S, B, 4] has S, B"),
    ("reshape[dims=[64]] a", dict(a=T("S, 64")),
     "reshape: the symbolic dims must stay, in order: the operand [S, 64] has S, the result [64] has none"),
    ("reshape[dims=[S, 2]] a", dict(a=T("S+1, 2"), s=T("S")),
     "reshape: the symbolic dims must stay, in order: the operand [S+1, 2] has S+1, the result [S, 2] has S"),
    ("reshape[dims=[5]] a", dict(a=T("2, 3")), "reshape: element counts differ: the operand [2, 3] has 6, the result [5] has 5"),
    ("reshape[dims=[6]] a", dict(a=T("S+1, 3"), s=T("S")),
     "reshape: the symbolic dims must stay, in order: the operand [S+1, 3] has S+1, the result [6] has none"),
])
def test_reshape_errors(expr, params, fragment):
    assert error(expr, **params).message == fragment


def test_reshape_dim_names_are_bound_and_specialised():
    e = fn_error(program_of("reshape[dims=[N, 4]] a", dict(a=T("S, 4"))))
    assert (e.loc.line, e.loc.col, e.message) == (2, 25, "reshape: dim name 'N' is not bound by any parameter")
    fn = check.check(syntax.parse(program_of("reshape[dims=[S, 2, 2]] a", dict(a=T("S, 4")))), dims={"S": 3}).functions[0]
    assert fn.body[0].value.type == ty("3, 2, 2") and fn.body[0].value.dims == (Dim(3), Dim(2), Dim(2))


@pytest.mark.parametrize("expr,params,want", [
    ("slice[axis=3, start=0, size=32] a", dict(a=T("B, H, 1, 64")), "B, H, 1, 32"),
    ("slice[axis=0, start=1, size=2] a", dict(a=T("S+3, 4"), s=T("S")), "2, 4"),
    ("slice[axis=1, start=5, size=0] a", dict(a=T("2, 5")), "2, 0"),
])
def test_slice_types(expr, params, want):
    assert typeof(expr, **params) == ty(want)


@pytest.mark.parametrize("expr,params,fragment", [
    ("slice[axis=1, start=2, size=3] a", dict(a=T("2, 4")),
     "slice: start 2 + size 3 = 5 is past the end: dim 1 of [2, 4] is 4"),
    ("slice[axis=0, start=0, size=1] a", dict(a=T("S, 4")),
     "slice: start 0 + size 1 = 1 is past the end: dim 0 of [S, 4] is S, which is only sure to be at least 0"),
    ("slice[axis=0, start=1, size=1] a", dict(a=T("S+1, 4"), s=T("S")),
     "slice: start 1 + size 1 = 2 is past the end: dim 0 of [S+1, 4] is S+1, which is only sure to be at least 1"),
    ("slice[axis=2, start=0, size=1] a", dict(a=T("2, 4")), "slice: axis 2 is out of range for rank 2 (expected 0 to 1)"),
])
def test_slice_errors(expr, params, fragment):
    assert error(expr, **params).message == fragment


# -- softmax -----------------------------------------------------------------------------

def test_softmax_types():
    assert typeof("softmax(a, axis=3)", a=T("B, H, 1, S+1"), s=T("S")) == ty("B, H, 1, S+1")
    assert typeof("softmax(a, axis=0)", a=T("4", "F16")) == ty("4", "F16")


@pytest.mark.parametrize("params,axis,fragment", [
    (dict(a=T("2, 3", "I64")), 1, "softmax: needs a floating dtype (F16, BF16, F32, F64), got I64"),
    (dict(a=T("2, 3")), 2, "softmax: axis 2 is out of range for rank 2 (expected 0 to 1)"),
])
def test_softmax_errors(params, axis, fragment):
    assert fragment in error(f"softmax(a, axis={axis})", **params).message


# -- names -------------------------------------------------------------------------------

A = T("2")


def test_names_are_defined_once_and_before_use():
    ok = f"let f = fn(a: {A}) -> ({A}) {{\n  let b = a * a;\n  let c = b + a;\n  (c)\n}}\n"
    assert checked(ok).functions[0].results[0].type == ty("2")
    cases = [
        (f"let f = fn(a: {A}, a: {A}) -> ({A}) {{\n  (a)\n}}\n", "parameter 'a' is already defined", (1, 40)),
        (f"let f = fn(a: {A}) -> ({A}) {{\n  let a = a * a;\n  (a)\n}}\n", "'a' is already defined", (2, 7)),
        (f"let f = fn(a: {A}) -> ({A}) {{\n  let b = a;\n  let b = a;\n  (b)\n}}\n", "'b' is already defined", (3, 7)),
        (f"let f = fn(a: {A}) -> ({A}) {{\n  let b = c * a;\n  let c = a;\n  (b)\n}}\n", "undefined name 'c'", (2, 11)),
        (f"let f = fn(a: {A}) -> ({A}) {{\n  (zz)\n}}\n", "undefined name 'zz'", (2, 4)),
        (f"let f = fn(a: {A}) -> ({A}) {{\n  (a)\n}}\nlet f = fn(a: {A}) -> ({A}) {{\n  (a)\n}}\n",
         "function 'f' is already defined", (4, 5)),
    ]
    for src, fragment, (line, col) in cases:
        e = fn_error(src)
        assert fragment in e.message, (src, e.message)
        assert (e.loc.line, e.loc.col) == (line, col), (src, e.render())


def test_names_do_not_leak_between_functions():
    src = (f"let f = fn(a: {A}) -> ({A}) {{\n  let b = a;\n  (b)\n}}\n"
           f"let g = fn(c: {A}) -> ({A}) {{\n  (b)\n}}\n")
    assert "undefined name 'b'" in fn_error(src).message


def test_empty_program_is_an_error():
    assert "no function defined" in fn_error("// nothing\n").message


# -- declared results ----------------------------------------------------------------------

def test_declared_results_must_match():
    e = fn_error(f"let f = fn(a: {T('2, 3')}) -> ({T('3, 2')}) {{\n  (a)\n}}\n")
    assert "result 0 has type tensor<F32, [2, 3], @host> but the function declares tensor<F32, [3, 2], @host>" in e.message
    assert (e.loc.line, e.loc.col) == (2, 4)
    e = fn_error(f"let f = fn(a: {A}) -> ({T('2', 'F64')}) {{\n  (a)\n}}\n")
    assert "declares tensor<F64, [2], @host>" in e.message
    e = fn_error(f"let f = fn(a: {T('S')}) -> ({T('S+1')}) {{\n  (a)\n}}\n")
    assert "has type tensor<F32, [S], @host> but the function declares tensor<F32, [S+1], @host>" in e.message


def test_declared_result_arity():
    e = fn_error(f"let f = fn(a: {A}) -> ({A}, {A}) {{\n  (a)\n}}\n")
    assert "declares 2 result(s) but returns 1" in e.message
    e = fn_error(f"let f = fn(a: {A}) -> ({A}) {{\n  (a, a)\n}}\n")
    assert "declares 1 result(s) but returns 2" in e.message


# -- dim names ----------------------------------------------------------------------------

def test_dim_names_are_bound_by_parameters():
    fn = checked(f"let f = fn(a: {T('S')}, b: {T('S+1')}) -> ({T('S+S+1')}) {{\n"
                 f"  let c = concat[axis=0] a b;\n  (c)\n}}\n").functions[0]
    assert fn.sig.results == (TensorType("F32", (Dim(1, (("S", 2),)),)),)
    e = fn_error(f"let f = fn(b: {T('S+1')}) -> ({T('S+1')}) {{\n  (b)\n}}\n")
    assert "dim name 'S' is not bound" in e.message and (e.loc.line, e.loc.col) == (1, 28)


def test_name_used_only_in_results_is_an_error():
    fn_error(f"let f = fn(a: {T('S')}) -> ({T('N')}) {{\n  (a)\n}}\n")
    fn_error(f"let f = fn(a: {T('S')}) -> ({T('S+N')}) {{\n  let c = concat[axis=0] a a;\n  (c)\n}}\n")


def test_name_used_only_in_results_is_reported_as_unbound():
    e = fn_error(f"let f = fn(a: {T('S')}) -> ({T('N')}) {{\n  (a)\n}}\n")
    assert "dim name 'N' in a result type is not bound" in e.message


# -- dtypes and placements ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32", "F64", "I32", "I64"])
def test_every_dtype_checks(dtype):
    t = T("2, 2", dtype)
    fn = checked(f"let f = fn(a: {t}) -> ({t}) {{\n  let b = a * a;\n  (b)\n}}\n").functions[0]
    assert fn.results[0].type == TensorType(dtype, (Dim(2), Dim(2)), "host")


def test_unknown_dtype_and_placement():
    e = fn_error(f"let f = fn(a: tensor<F8, [2], @host>) -> ({A}) {{\n  (a)\n}}\n")
    assert "unknown dtype 'F8'" in e.message and (e.loc.line, e.loc.col) == (1, 22)
    e = fn_error(f"let f = fn(a: tensor<F32, [2], @gpu>) -> ({A}) {{\n  (a)\n}}\n")
    assert "unknown placement '@gpu'" in e.message


def test_device_programs_are_refused_by_the_checker():
    # @device parses, and its type rules still run first ("placements differ" is the more
    # precise error for a mixed program); then check refuses it, so --emit typed does too.
    t = T("2", placement="device")
    src = f"let f = fn(a: {t}) -> ({t}) {{\n  let b = a * a;\n  (b)\n}}\n"
    assert syntax.parse(src, "d.kina").functions[0].params[0].type.placement == "device"
    for run in (lambda: checked(src), lambda: pipeline.run_stages(src, "d.kina", until="typed")):
        with pytest.raises(KinaError, match=r"parameter 'a' is @device: only @host tensors can be compiled") as info:
            run()
        assert (info.value.loc.line, info.value.loc.col) == (1, 33)  # at "device"
        assert info.value.render().splitlines()[2] == " " * 32 + "^~~~~~"
    second = f"let g = fn(a: {A}, b: {t}) -> ({A}) {{\n  (a)\n}}\n"
    assert "parameter 'b' is @device" in fn_error(second).message
    mixed = f"let f = fn(a: {A}, b: {t}) -> ({A}) {{\n  (a + b)\n}}\n"
    assert "placements differ: lhs is @host, rhs is @device" in fn_error(mixed).message
    # a later function's type error comes before an earlier function's placement
    both = src + f"let g = fn(a: {A}) -> ({A}) {{\n  (zz)\n}}\n"
    assert "undefined name 'zz'" in fn_error(both).message


# -- the checker's API: types on every expression, Function.sig ---------------------------------

def _all_exprs(fn: ast.Function):
    stack = [let.value for let in fn.body] + list(fn.results)
    while stack:
        e = stack.pop()
        yield e
        stack.extend(ast.children(e))


@pytest.mark.parametrize("example", ["storylm0_kv_step.kina", "storylm0_kv_step_dyn.kina"])
def test_every_expression_is_typed_after_check(example):
    parsed = syntax.parse((EXAMPLES / example).read_text(), example)
    assert all(e.type is None for fn in parsed.functions for e in _all_exprs(fn))
    typed = check.check(parsed)
    assert typed == parsed  # types are left out of ==; the tree is otherwise unchanged
    exprs = [e for fn in typed.functions for e in _all_exprs(fn)]
    assert len(exprs) == 6 + 3 + 12  # 6 lets, 3 results, 12 operands (names and broadcast)
    assert all(isinstance(e.type, TensorType) for e in exprs)
    assert parsed.functions[0].sig is None


def test_example_types_and_signature():
    fn = check.check(syntax.parse((EXAMPLES / "storylm0_kv_step_dyn.kina").read_text())).functions[0]
    lets = {let.name: let.value.type for let in fn.body}
    assert {k: v.shape_str() for k, v in lets.items()} == {
        "k_next": "[B, H, Dh, S+1]", "v_next": "[B, H, S+1, Dh]", "scores": "[B, H, 1, S+1]",
        "scaled": "[B, H, 1, S+1]", "probs": "[B, H, 1, S+1]", "context": "[B, H, 1, Dh]"}
    assert fn.sig == Signature("kv_step", (
        ("q_new", ty("B, H, 1, Dh")), ("k_past", ty("B, H, Dh, S")), ("k_new", ty("B, H, Dh, 1")),
        ("v_past", ty("B, H, S, Dh")), ("v_new", ty("B, H, 1, Dh")), ("scale", ty("1, 1, 1, 1"))),
        (ty("B, H, Dh, S+1"), ty("B, H, S+1, Dh"), ty("B, H, 1, Dh")),
        # every intermediate, in the order checked, for the runtime's memory check
        (ty("B, H, Dh, S+1"), ty("B, H, S+1, Dh"), ty("B, H, 1, S+1"), ty("B, H, 1, S+1"), ty("B, H, 1, S+1"),
         ty("B, H, 1, Dh")))
    assert Signature.from_json(fn.sig.to_json()) == fn.sig


def test_static_example_signature():
    fn = check.check(syntax.parse((EXAMPLES / "storylm0_kv_step.kina").read_text())).functions[0]
    assert fn.sig.results == (ty("1, 2, 2, 4"), ty("1, 2, 4, 2"), ty("1, 2, 1, 2"))
    assert all(t.is_static for _, t in fn.sig.params)


def test_check_errors_carry_the_source():
    src = program_of("a @ b", dict(a=T("2, 3"), b=T("2, 3")))
    with pytest.raises(KinaError) as info:
        checked(src)
    lines = info.value.render().splitlines()
    assert lines[0].startswith("c.kina:2:11: error: matmul: contraction dims differ")
    assert lines[1] == "  let r = a @ b;" and lines[2] == "          ^~~~~"
