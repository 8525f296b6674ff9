"""The op table is whole: every `ast.Expr` class is an operation of `ops.OPS`, and every stage has its part.

For each operation class (every `ast.Expr` subclass but the leaves, `Name` and `Number`,
and the family bases): an entry; a grammar rule `-> name`, written with its word when it
is not an operator, with the rules in the table's order (the parser's messages list the
words in that order); a checker rule, a lowering and an axes rule for its family; MLIR
bodies that build and verify; a NumPy expression that names only what the interpreter
gives it. `broadcast` is only ever an operand: the elementwise op lowers it, and alone the
checker refuses it. A `Call` is not an operation either: `check` inlines it, so no stage
after the checker meets one (tested below, explicitly, rather than left out of the walk).
"""
from __future__ import annotations

import ast as pyast
import re
from pathlib import Path

import pytest
from mlir import ir
from mlir.dialects import func

from kina import KinaError
from kina import interpreter
from kina.frontend import ast, axes, check, ops, syntax
from kina.ir import lower
from kina.ir.irbuild import element_type

GRAMMAR = (Path(ops.__file__).parent / "grammar.lark").read_text()
LEAVES = {ast.Name, ast.Number}  # not operations: every stage reads them itself
CALL = ast.Call  # not an operation: check.py inlines it (inline.py), and nothing after check sees one


def operation_classes(cls=ast.Expr) -> list[type]:
    """The classes without subclasses under `cls`: the nodes the parser builds."""
    subs = cls.__subclasses__()
    return [c for s in subs for c in operation_classes(s)] if subs else [cls]


OPERATIONS = [c for c in operation_classes() if c not in LEAVES and c is not CALL]


def test_the_walk_finds_the_operations():
    assert ast.Add in OPERATIONS and ast.Slice in OPERATIONS and ast.Binary not in OPERATIONS
    assert len(OPERATIONS) == len(ops.OPS) and len(ops.BY_NAME) == len(ops.OPS)
    assert set(operation_classes()) == {*OPERATIONS, *LEAVES, CALL}  # the one class set aside is the call


def test_a_call_has_no_entry_a_grammar_rule_and_no_stage_after_check_sees_one():
    assert CALL not in ops.BY_NODE and "call" not in ops.BY_NAME and "call" not in ops.FAMILIES
    assert re.search(r'NAME "\(" \[expr \("," expr\)\*\] "\)"\s*->\s*call\b', GRAMMAR)
    source = """
let double = fn(x: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) { (x + x) }
let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {
  let b = double(a) * double(double(a));
  (double(b))
}
"""
    parsed = syntax.parse(source)
    calls = [e for let in parsed.functions[1].body for e in _walk(let.value) if isinstance(e, CALL)]
    assert len(calls) == 3
    checked = check.check(parsed)
    exprs = [e for fn in checked.functions for let in fn.body for e in _walk(let.value)]
    exprs += [e for fn in checked.functions for r in fn.results for e in _walk(r)]
    assert exprs and not any(isinstance(e, CALL) for e in exprs)
    assert all(type(e) in LEAVES or type(e) in ops.BY_NODE for e in exprs)  # each an op every stage knows
    assert all(isinstance(let, ast.Let) for fn in checked.functions for let in fn.body)


def _walk(e):
    yield e
    for c in ast.children(e):
        yield from _walk(c)


@pytest.mark.parametrize("kind", OPERATIONS, ids=lambda k: k.__name__)
def test_every_operation_has_an_entry_and_each_stage_its_part(kind):
    op = ops.BY_NODE.get(kind)
    assert op is not None, f"{kind.__name__} has no entry in ops.OPS"
    assert op.family in ops.FAMILIES, f"{op.name}: unknown family {op.family!r}"
    assert re.search(rf"->\s*{op.name}\b", GRAMMAR), f"{op.name}: no grammar rule '-> {op.name}'"
    if not op.symbol:  # a word: the parser's messages name it as the word that starts its rule
        assert re.search(rf'\|\s*"{op.name}".*->\s*{op.name}\b', GRAMMAR), f"{op.name}: rule does not start with it"
    assert op.family in check.RULES, f"{op.name}: no checker rule for {op.family}"
    assert op.family in axes.KEEPS, f"{op.name}: no axes rule for {op.family}"
    if op.family == "broadcast":
        with pytest.raises(KinaError, match="may only appear as an operand"):
            check.check(syntax.parse("let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) "
                                     "{ (broadcast(a)) }"))
    else:
        assert op.family in lower.LOWERINGS, f"{op.name}: no lowering for {op.family}"
    assert op.numpy, f"{op.name}: no NumPy expression for the interpreter"


@pytest.mark.parametrize("op", ops.OPS, ids=lambda op: op.name)
def test_numpy_expressions_name_only_what_the_interpreter_gives(op):
    tree = pyast.parse(op.numpy, mode="eval")
    names = {n.id for n in pyast.walk(tree) if isinstance(n, pyast.Name)}
    given = {"x", "y", "e", *interpreter._NAMES, *(f for f in op.node.__dataclass_fields__ if f != "type")}
    assert names <= given, f"{op.name}: {op.numpy!r} names {names - given}"


@pytest.mark.parametrize("op", [op for op in ops.OPS if any(op.mlir)], ids=lambda op: op.name)
def test_mlir_bodies_build_and_verify(op):
    """The float body (and the integer one unless the op is floating) on f32 (i32) elements."""
    assert op.family in ("elementwise", "unary", "reduce")
    float_body, int_body = op.mlir
    assert float_body and bool(int_body) != op.floating
    operands = {"elementwise": ("x", "y"), "unary": ("x",), "reduce": ("x", "acc")}[op.family]
    for dtype, body in (("F32", float_body), ("I32", int_body)):
        if not body:
            continue
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.create()
            t = element_type(dtype)
            with ir.InsertionPoint(module.body):
                f = func.FuncOp("f", ir.FunctionType.get([t] * len(operands), [t]))
                block = f.add_entry_block()
                with ir.InsertionPoint(block):
                    func.ReturnOp([lower.element(body, **dict(zip(operands, block.arguments)))])
            assert module.operation.verify(), f"{op.name} on {dtype}: {body}"


def test_element_makes_each_number_once_before_the_ops():
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.create()
        f32 = ir.F32Type.get()
        with ir.InsertionPoint(module.body):
            f = func.FuncOp("f", ir.FunctionType.get([f32], [f32]))
            block = f.add_entry_block()
            with ir.InsertionPoint(block):
                func.ReturnOp([lower.element(ops.BY_NAME["sigmoid"].mlir[0], x=block.arguments[0])])
        names = [o.name for o in block.operations]
    assert names == ["arith.constant", "arith.negf", "math.exp", "arith.addf", "arith.divf", "func.return"]
