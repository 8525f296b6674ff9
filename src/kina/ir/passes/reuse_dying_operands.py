"""reuse-dying-operands: an elementwise op writes over an operand that dies there.

    %s = linalg.generic {matmul} ...                     // read once, below
    %e = tensor.empty() : tensor<1x2x1x4xf32>
    %scaled = linalg.generic {parallel} ins(%s, %scale ...) outs(%e ...)
becomes
    %scaled = linalg.generic {parallel} ins(%s, %scale ...) outs(%s ...)

so that one-shot bufferization updates %s's buffer in place instead of allocating
another. A softmax's chain (scale, exp, divide) then runs in one buffer.

Guarantees: only an all-parallel `linalg.generic` with one result, whose init is a
`tensor.empty` its body does not read, is changed; the operand it takes over has
the result's type and an identity map, is computed by an op (never a parameter),
and has no use after this op in the block. A result that goes straight to an
out-buffer (or is returned) keeps its init, so that it is still written there.
The values computed are unchanged; only where they are stored. The op is rebuilt
(a new generic with the same inputs, maps, attributes and body), never mutated in
place, so a pattern driver sees one op replaced by another.

In:  any module; before bufferization. Out: the same module, with those inits.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import bufferization, func, linalg, tensor

from ._pass import KinaPass
from ._util import NO_MATCH, apply_patterns, iterators_of, maps_of

_SINKS = (bufferization.MaterializeInDestinationOp, func.ReturnOp)  # a result read by one keeps its init


@dataclass(frozen=True)
class ReuseDyingOperands(KinaPass):
    name = "reuse-dying-operands"
    summary = ("an elementwise op writes over an operand that dies there, so bufferization "
               "updates that buffer in place")
    optimisation = True

    def run(self, module_op) -> None:
        apply_patterns(module_op, {linalg.GenericOp: _reuse})


def _op(user):
    return getattr(user, "operation", user)


def _reuse(op, rewriter):
    """The pattern: `op` rebuilt with a dying operand as its init, if it has one."""
    value = _dying_operand(op)
    if value is None:
        return NO_MATCH
    empty = op.outputs[0].owner
    with rewriter.ip, op.location:
        new = linalg.GenericOp([r.type for r in op.results], list(op.inputs), [value],
                               op.attributes["indexing_maps"], op.attributes["iterator_types"])
        for name in op.attributes:  # any others (doc, library_call) come along
            if name not in new.attributes and name != "operandSegmentSizes":
                new.attributes[name] = op.attributes[name]
        op.regions[0].blocks[0].append_to(new.regions[0])  # the body moves over as it is
    rewriter.replace_op(op, new)
    if not list(empty.results[0].uses):
        rewriter.erase_op(empty.operation)


def _dying_operand(op) -> ir.Value | None:
    """The input that `op` can write its result over: `op` is an all-parallel generic on
    tensors with one result, whose init is a `tensor.empty` its body does not read and
    whose result is not written straight to an out-buffer or returned; the input has
    the result's type and an identity map, and dies at `op`. None if there is none."""
    ins, outs = list(op.inputs), list(op.outputs)
    if len(outs) != 1 or len(op.results) != 1 or set(iterators_of(op)) != {"parallel"}:
        return None
    init, result = outs[0], op.results[0]
    if not isinstance(init, ir.OpResult) or not isinstance(init.owner, tensor.EmptyOp):
        return None
    if list(op.regions[0].blocks[0].arguments[len(ins)].uses):  # the body reads the init's elements
        return None
    if any(isinstance(_op(u.owner).opview, _SINKS) for u in result.uses):
        return None
    identity = ir.AffineMap.get_identity(result.type.rank)
    for value, m in zip(ins, maps_of(op)):
        if m == identity and value.type == result.type and _dies_at(value, op.operation):
            return value
    return None


def _dies_at(value: ir.Value, op) -> bool:
    """Is `value` computed by an op (not a block argument, not a parameter's
    to_tensor) and read by nothing after `op` in its block?"""
    if not isinstance(value, ir.OpResult) or isinstance(value.owner, bufferization.ToTensorOp):
        return False
    for use in value.uses:
        user = _op(use.owner)
        if user == op:
            continue
        if user.block != op.block or not user.is_before_in_block(op):
            return False
    return True
