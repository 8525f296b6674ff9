"""Parser tests: source text in, the expected AST written literally, compared with `==`.

AST nodes compare by value, locations included, so each expected tree below also
pins down where every node starts and ends (1-based, end exclusive). Expressions
are parsed inside a fixed wrapper that puts them on line 2 from column 9.
"""
import pytest

from kina.frontend import ast
from kina.frontend import syntax
from kina.frontend.diagnostics import KinaError, Loc
from kina.frontend.types import Dim

F = "t.kina"
PREFIX = "let x = "  # the expression starts at line 2, column len(PREFIX) + 1 = 9


def L(line, col, end_col, end_line=None):
    return Loc(F, line, col, end_line or line, end_col)


def E(col, end_col):
    """A span on the expression's line (2)."""
    return L(2, col, end_col)


def N(name, col, line=2):
    return ast.Name(L(line, col, col + len(name)), name)


def parse_expr(text: str) -> ast.Expr:
    program = syntax.parse(f"let f = fn() -> () {{\n{PREFIX}{text};\n(x)\n}}\n", F)
    (let,) = program.functions[0].body
    assert let == ast.Let("x", let.value, L(2, 5, 6))
    return let.value


def S(*terms, const=0):
    """A symbolic dim: S("S", const=1) is S+1."""
    return Dim(const, tuple(sorted((t, 1) for t in terms)))


# -- expressions: precedence, associativity, every form ----------------------------------

def test_name():
    assert parse_expr("abc_1") == N("abc_1", 9)


def test_mul_and_matmul_share_a_level_and_associate_left():
    # a * b @ c  ==  (a * b) @ c
    assert parse_expr("a * b @ c") == ast.MatMul(E(9, 18), ast.Mul(E(9, 14), N("a", 9), N("b", 13)), N("c", 17))
    # a @ b * c  ==  (a @ b) * c
    assert parse_expr("a @ b * c") == ast.Mul(E(9, 18), ast.MatMul(E(9, 14), N("a", 9), N("b", 13)), N("c", 17))
    # a @ b @ c  ==  (a @ b) @ c
    assert parse_expr("a @ b @ c") == ast.MatMul(E(9, 18), ast.MatMul(E(9, 14), N("a", 9), N("b", 13)), N("c", 17))
    # a * b * c  ==  (a * b) * c
    assert parse_expr("a * b * c") == ast.Mul(E(9, 18), ast.Mul(E(9, 14), N("a", 9), N("b", 13)), N("c", 17))


def test_plus_binds_looser_than_mul_and_matmul():
    # a + b * c  ==  a + (b * c)
    assert parse_expr("a + b * c") == ast.Add(E(9, 18), N("a", 9), ast.Mul(E(13, 18), N("b", 13), N("c", 17)))
    # a @ b + c  ==  (a @ b) + c
    assert parse_expr("a @ b + c") == ast.Add(E(9, 18), ast.MatMul(E(9, 14), N("a", 9), N("b", 13)), N("c", 17))
    # a + b @ c + d  ==  (a + (b @ c)) + d
    assert parse_expr("a + b @ c + d") == ast.Add(
        E(9, 22), ast.Add(E(9, 18), N("a", 9), ast.MatMul(E(13, 18), N("b", 13), N("c", 17))), N("d", 21))


def test_plus_associates_left():
    assert parse_expr("a + b + c") == ast.Add(E(9, 18), ast.Add(E(9, 14), N("a", 9), N("b", 13)), N("c", 17))


def test_parentheses_override_precedence():
    # a * (b + c): the inner span excludes the parentheses
    assert parse_expr("a * (b + c)") == ast.Mul(E(9, 20), N("a", 9), ast.Add(E(14, 19), N("b", 14), N("c", 18)))
    # a @ (b @ c) is right-nested only when written so
    assert parse_expr("a @ (b @ c)") == ast.MatMul(E(9, 20), N("a", 9), ast.MatMul(E(14, 19), N("b", 14), N("c", 18)))
    assert parse_expr("((a))") == N("a", 11)


def test_concat():
    assert parse_expr("concat[axis=3] k v") == ast.Concat(E(9, 27), 3, N("k", 24), N("v", 26))


def test_concat_operands_are_atoms():
    # concat[axis=0] a b * c  ==  (concat a b) * c
    assert parse_expr("concat[axis=0] a b * c") == ast.Mul(
        E(9, 31), ast.Concat(E(9, 27), 0, N("a", 24), N("b", 26)), N("c", 30))
    assert parse_expr("concat[axis=1] (a @ b) c") == ast.Concat(
        E(9, 33), 1, ast.MatMul(E(25, 30), N("a", 25), N("b", 29)), N("c", 32))


def test_broadcast_and_softmax():
    assert parse_expr("s * broadcast(c)") == ast.Mul(E(9, 25), N("s", 9), ast.Broadcast(E(13, 25), N("c", 23)))
    assert parse_expr("softmax(s, axis=3)") == ast.Softmax(E(9, 27), N("s", 17), 3)
    assert parse_expr("softmax(a @ b, axis=12)") == ast.Softmax(
        E(9, 32), ast.MatMul(E(17, 22), N("a", 17), N("b", 21)), 12)


def test_minus_and_divide_share_the_levels_of_plus_and_times():
    # a - b * c  ==  a - (b * c);  a / b @ c  ==  (a / b) @ c;  a - b + c  ==  (a - b) + c
    assert parse_expr("a - b * c") == ast.Sub(E(9, 18), N("a", 9), ast.Mul(E(13, 18), N("b", 13), N("c", 17)))
    assert parse_expr("a / b @ c") == ast.MatMul(E(9, 18), ast.Div(E(9, 14), N("a", 9), N("b", 13)), N("c", 17))
    assert parse_expr("a - b + c") == ast.Add(E(9, 18), ast.Sub(E(9, 14), N("a", 9), N("b", 13)), N("c", 17))
    assert parse_expr("a * b / c") == ast.Div(E(9, 18), ast.Mul(E(9, 14), N("a", 9), N("b", 13)), N("c", 17))


def test_unary_minus_binds_tighter_than_times():
    # -a * b  ==  (-a) * b;  a - -b  ==  a - (-b);  - -a is two negations
    assert parse_expr("-a * b") == ast.Mul(E(9, 15), ast.Neg(E(9, 11), N("a", 10)), N("b", 14))
    assert parse_expr("a - -b") == ast.Sub(E(9, 15), N("a", 9), ast.Neg(E(13, 15), N("b", 14)))
    assert parse_expr("- -a") == ast.Neg(E(9, 13), ast.Neg(E(11, 13), N("a", 12)))
    assert parse_expr("-(a @ b)") == ast.Neg(E(9, 17), ast.MatMul(E(11, 16), N("a", 11), N("b", 15)))


@pytest.mark.parametrize("text,value", [("2", 2), ("0.5", 0.5), ("1e-6", 1e-6), ("2.5E+3", 2500.0), ("007", 7),
                                        ("-2", -2), ("- 0.25", -0.25), ("-(3)", -3)])
def test_numbers_and_their_sign(text, value):
    # a '-' written before a number is its sign: one Number, spanning both
    got = parse_expr(text)
    assert got == ast.Number(E(9, 9 + len(text)), value) and type(got.value) is type(value)


def test_numbers_as_operands():
    assert parse_expr("x * 2") == ast.Mul(E(9, 14), N("x", 9), ast.Number(E(13, 14), 2))
    assert parse_expr("1 / x") == ast.Div(E(9, 14), ast.Number(E(9, 10), 1), N("x", 13))
    assert parse_expr("x * -0.5") == ast.Mul(E(9, 17), N("x", 9), ast.Number(E(13, 17), -0.5))


def test_unary_functions():
    for name, kind in [("exp", ast.Exp), ("sqrt", ast.Sqrt), ("rsqrt", ast.Rsqrt), ("sigmoid", ast.Sigmoid)]:
        n = len(name)
        assert parse_expr(f"{name}(a + b)") == kind(E(9, 16 + n), ast.Add(E(10 + n, 15 + n), N("a", 10 + n), N("b", 14 + n)))


def test_reductions():
    assert parse_expr("sum(x, axis=2)") == ast.Sum(E(9, 23), N("x", 13), 2)
    assert parse_expr("max(x, axis=0)") == ast.Max(E(9, 23), N("x", 13), 0)
    assert parse_expr("mean(x * x, axis=3)") == ast.Mean(E(9, 28), ast.Mul(E(14, 19), N("x", 14), N("x", 18)), 3)


def test_transpose_reshape_and_slice():
    assert parse_expr("transpose[perm=[0, 2, 1, 3]] x") == ast.Transpose(E(9, 39), (0, 2, 1, 3), N("x", 38))
    got = parse_expr("reshape[dims=[B, 1, S+1, 64]] x")
    assert got == ast.Reshape(E(9, 40), (S("B"), Dim(1), S("S", const=1), Dim(64)), N("x", 39))
    assert got.dim_locs == (E(23, 24), E(26, 27), E(29, 32), E(34, 36))
    assert parse_expr("reshape[dims=[]] x") == ast.Reshape(E(9, 27), (), N("x", 26))
    assert parse_expr("slice[axis=3, start=0, size=32] x") == ast.Slice(E(9, 42), 3, 0, 32, N("x", 41))
    # their operand is an atom, as concat's: transpose[...] a @ b  ==  (transpose[...] a) @ b
    assert parse_expr("transpose[perm=[1, 0]] a @ b") == ast.MatMul(
        E(9, 37), ast.Transpose(E(9, 33), (1, 0), N("a", 32)), N("b", 36))


def test_locations_are_compared():
    """The same tree at another column is a different tree: locations are part of `==`."""
    assert parse_expr("a * b") != parse_expr(" a * b")
    assert parse_expr("a * b") != ast.Mul(E(9, 14), N("a", 9), N("c", 13))


def test_type_is_not_compared():
    from kina.frontend.types import TensorType
    typed = ast.Name(E(9, 10), "a", type=TensorType("F32", (Dim(2),)))
    assert parse_expr("a") == typed


# -- functions, types, comments -----------------------------------------------------------

def test_whole_function():
    src = ("// leading comment\n"
           "let f = fn(a: tensor<F32, [2, 3], @host>) -> (tensor<F32, [2, 3], @host>) {  // trailing\n"
           "  let b = a * a; // a comment after a binding\n"
           "  // a whole-line comment inside the body\n"
           "  (b)\n"
           "}\n")
    want = ast.Program((ast.Function(
        name="f",
        params=(ast.Param("a", ast.TypeAnn("F32", (Dim(2), Dim(3)), "host", L(2, 15, 41)), L(2, 12, 13)),),
        result_types=(ast.TypeAnn("F32", (Dim(2), Dim(3)), "host", L(2, 47, 73)),),
        body=(ast.Let("b", ast.Mul(L(3, 11, 16), N("a", 11, 3), N("a", 15, 3)), L(3, 7, 8)),),
        results=(N("b", 4, 5),),
        loc=L(2, 5, 6)),))
    got = syntax.parse(src, F)
    assert got == want
    assert got.filename == F and got.source == src


def test_single_and_multiple_results():
    one = syntax.parse("let f = fn() -> () {\n(a)\n}", F).functions[0]
    assert one.results == (N("a", 2, 2),)
    three = syntax.parse("let f = fn() -> () {\n(a, b @ c, d)\n}", F).functions[0]
    assert three.results == (N("a", 2, 2), ast.MatMul(L(2, 5, 10), N("b", 5), N("c", 9)), N("d", 12))


def test_multiple_functions():
    src = ("let f = fn(a: tensor<F32, [1], @host>) -> (tensor<F32, [1], @host>) {\n(a)\n}\n"
           "let g = fn() -> () {\nlet y = p;\n(y)\n}\n")
    f, g = syntax.parse(src, F).functions
    assert (f.name, f.loc, len(f.params), f.results) == ("f", L(1, 5, 6), 1, (N("a", 2, 2),))
    assert g == ast.Function("g", (), (), (ast.Let("y", N("p", 9, 5), L(5, 5, 6)),), (N("y", 2, 6),), L(4, 5, 6))


def test_empty_file_is_an_empty_program():
    assert syntax.parse("// nothing but a comment\n", F) == ast.Program(())


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32", "F64", "I32", "I64"])
@pytest.mark.parametrize("placement", ["host", "device"])
def test_every_dtype_and_placement_parses(dtype, placement):
    src = f"let f = fn(a: tensor<{dtype}, [4], @{placement}>) -> () {{\n(a)\n}}"
    (param,) = syntax.parse(src, F).functions[0].params
    assert param.type == ast.TypeAnn(dtype, (Dim(4),), placement, param.type.loc)
    assert (param.type.dtype, param.type.placement) == (dtype, placement)


@pytest.mark.parametrize("written,dims", [
    ("", ()),
    ("0", (Dim(0),)),
    ("7, 4096", (Dim(7), Dim(4096))),
    ("B, S", (S("B"), S("S"))),
    ("S+1", (S("S", const=1),)),
    ("S + N", (S("S", "N"),)),
    ("1+S", (S("S", const=1),)),
    ("S+S+2", (Dim(2, (("S", 2),)),)),
    ("2+3", (Dim(5),)),
    ("B, H, Dh, S+1", (S("B"), S("H"), S("Dh"), S("S", const=1))),
])
def test_dims_are_ints_names_and_sums(written, dims):
    src = f"let f = fn(a: tensor<F32, [{written}], @host>) -> () {{\n(a)\n}}"
    (param,) = syntax.parse(src, F).functions[0].params
    assert param.type.dims == dims
    assert len(param.type.dim_locs) == len(dims)


def test_dim_locations_cover_each_dim():
    src = "let f = fn(a: tensor<F32, [B, S+1], @host>) -> () {\n(a)\n}"
    (param,) = syntax.parse(src, F).functions[0].params
    assert param.type.dim_locs == (L(1, 28, 29), L(1, 31, 34))
    assert param.type.dtype_loc == L(1, 22, 25) and param.type.placement_loc == L(1, 38, 42)


def test_bytes_source_is_utf8():
    got = syntax.parse(b"let f = fn() -> () {\nlet x = a;\n(x)\n}", F)
    assert got.functions[0].body[0].value == N("a", 9)


# -- calls, tuple lets and uses ------------------------------------------------------------

def call(col, end_col, name, *args):
    """A call on the expression's line; its callee's own location is compared apart (compare=False)."""
    return ast.Call(E(col, end_col), name, args, callee_loc=E(col, col + len(name)))


def test_call():
    got = parse_expr("f(a, b)")
    assert got == call(9, 16, "f", N("a", 11), N("b", 14))
    assert got.callee_loc == E(9, 10)
    assert parse_expr("f()") == call(9, 12, "f")
    assert parse_expr("rms_norm(x + y, g)") == call(9, 27, "rms_norm", ast.Add(E(18, 23), N("x", 18), N("y", 22)),
                                                    N("g", 25))


def test_a_call_is_an_atom_and_calls_nest():
    # x + f(y) * z  ==  x + (f(y) * z);  -f(g(x)) negates the call of f on the call of g
    assert parse_expr("x + f(y) * z") == ast.Add(E(9, 21), N("x", 9),
                                                 ast.Mul(E(13, 21), call(13, 17, "f", N("y", 15)), N("z", 20)))
    assert parse_expr("-f(g(x))") == ast.Neg(E(9, 17), call(10, 17, "f", call(12, 16, "g", N("x", 14))))
    assert parse_expr("softmax(f(x), axis=1)") == ast.Softmax(E(9, 30), call(17, 21, "f", N("x", 19)), 1)


def test_the_operand_of_concat_and_transpose_is_not_a_call():
    # concat[axis=0] a (b) is still a and (b); a call there is written in parentheses
    assert parse_expr("concat[axis=0] a (b)") == ast.Concat(E(9, 29), 0, N("a", 24), N("b", 27))
    assert parse_expr("transpose[perm=[1, 0]] (f(x))") == ast.Transpose(E(9, 38), (1, 0), call(33, 37, "f", N("x", 35)))
    assert parse_expr("concat[axis=0] (f(a)) (g(b))") == ast.Concat(
        E(9, 37), 0, call(25, 29, "f", N("a", 27)), call(32, 36, "g", N("b", 34)))


def test_tuple_let():
    program = syntax.parse("let f = fn() -> () {\nlet (k, v) = g(a);\n(k)\n}\n", F)
    (let,) = program.functions[0].body
    assert let == ast.TupleLet(("k", "v"), ast.Call(L(2, 14, 18), "g", (N("a", 16),)), L(2, 6, 10))
    assert let.name_locs == (L(2, 6, 7), L(2, 9, 10))
    (one,) = syntax.parse("let f = fn() -> () {\nlet (k) = g(a);\n(k)\n}\n", F).functions[0].body
    assert one == ast.TupleLet(("k",), ast.Call(L(2, 11, 15), "g", (N("a", 13),)), L(2, 6, 7))
    # the grammar takes any expression there; check.py refuses what is not a call
    (other,) = syntax.parse("let f = fn() -> () {\nlet (k, v) = a;\n(k)\n}\n", F).functions[0].body
    assert other == ast.TupleLet(("k", "v"), N("a", 14), L(2, 6, 10))


def test_uses_come_before_the_functions():
    program = syntax.parse('use "a.kina";\n// a comment\nuse "lib/b.kina";\nlet f = fn() -> () {\n(x)\n}\n', F)
    assert program.uses == (ast.Use("a.kina", L(1, 5, 13)), ast.Use("lib/b.kina", L(3, 5, 17)))
    assert [fn.name for fn in program.functions] == ["f"]
    assert syntax.parse("let f = fn() -> () {\n(x)\n}\n", F).uses == ()


def lalr_conflicts(grammar: str) -> list[str]:
    """The shift/reduce conflicts Lark meets building `grammar`; it resolves each as a shift, silently."""
    import logging
    from lark import Lark, logger
    records, handler, level = [], logging.Handler(), logger.level
    handler.emit = records.append
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        Lark(grammar, parser="lalr", debug=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return [r.getMessage() for r in records if "conflict" in r.getMessage().lower()]


def test_the_grammar_has_no_conflict():
    # Were concat's operands atoms, which a call is, `concat[axis=0] a (b)` would silently become
    # a call of a: the conflict on '(' that the finder sees in that variant
    from pathlib import Path
    grammar = (Path(syntax.__file__).parent / "grammar.lark").read_text()
    assert lalr_conflicts(grammar) == []
    variant = grammar.replace("operand operand  -> concat", "atom atom -> concat")
    assert variant != grammar and any("LPAR" in c for c in lalr_conflicts(variant))


def test_words_are_the_grammar_literals_that_are_names():
    assert {"let", "fn", "use", "tensor", "exp", "sum", "concat", "axis", "dtype"} <= syntax.words()
    assert not any(w[0] in "@(-" for w in syntax.words())


@pytest.mark.parametrize("body,line,col,message", [
    ("let y = f(a b);", 2, 13, "expected ',' or ')' in the arguments of f, found 'b'"),
    ("let y = f(a, g(b c));", 2, 18, "expected ',' or ')' in the arguments of g, found 'c'"),
    ("let y = f(a, b;", 2, 15, "expected ',' or ')' in the arguments of f, found ';'"),
    ("let (a b) = f(x);", 2, 8, "expected ',' or ')' in the names of 'let (...) =', found 'b'"),
    ("let (a, b) f(x);", 2, 12, "expected '=', found 'f'"),
    ("let y = concat(a, b);", 2, 15, "concat is an operation of the language, written concat[axis=N] x y; "
                                     "it cannot be called as a function"),
    ("let y = reshape(a);", 2, 16, "reshape is an operation of the language, written reshape[dims=[...]] x; "
                                   "it cannot be called as a function"),
    ("let y = slice[axis=0, start=0, size=1] f(a);", 2, 41,
     "a call cannot be the operand of concat, transpose, reshape, slice or convert as it stands: "
     "write it in parentheses, (f(...))"),
])
def test_syntax_errors_of_calls(body, line, col, message):
    with pytest.raises(KinaError) as info:
        syntax.parse(f"let f = fn() -> () {{\n{body}\n(y)\n}}\n", F)
    assert (info.value.loc.line, info.value.loc.col, info.value.message) == (line, col, message)


@pytest.mark.parametrize("text,line,col,message", [
    ('use "a.kina"\nlet f = fn() -> () {\n(x)\n}', 1, 13, "expected ';' after the use, found 'let'"),
    ("use a.kina;", 1, 5, 'expected a file name in double quotes ("blocks.kina"), found \'a\''),
    ('let f = fn() -> () {\n(x)\n}\nuse "a.kina";', 4, 1, "a use must come before the functions of the file"),
])
def test_syntax_errors_of_uses(text, line, col, message):
    with pytest.raises(KinaError) as info:
        syntax.parse(text, F)
    assert (info.value.loc.line, info.value.loc.col, info.value.message) == (line, col, message)


# -- syntax errors are KinaErrors with a location (the full corpus is tests/errors/) -------

@pytest.mark.parametrize("text,line,col", [
    ("let f = fn() -> () {\nlet x = a @ @ b;\n(x)\n}", 2, 13),
    ("let f = fn() -> () {\nlet x = a\n(x)\n}", 2, 10),
    ("let f = fn() -> () {\nlet x = a $ b;\n(x)\n}", 2, 11),
    ("let f = fn() -> () {\n(x)\n", 2, 4),  # end of file: just after the last line
])
def test_syntax_errors_are_located(text, line, col):
    with pytest.raises(KinaError) as info:
        syntax.parse(text, F)
    assert (info.value.loc.file, info.value.loc.line, info.value.loc.col) == (F, line, col)
    assert info.value.render().startswith(f"{F}:{line}:{col}: error: ")
