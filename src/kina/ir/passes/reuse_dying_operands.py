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
The values computed are unchanged; only where they are stored.
"""
from __future__ import annotations

from mlir import ir

from ._util import functions, iterators_of, maps_of

_SINKS = ("bufferization.materialize_in_destination", "func.return")


def run(module_op) -> None:
    for fn in functions(module_op):
        for op in list(fn.regions[0].blocks[0].operations):
            if op.operation.name == "linalg.generic":
                _reuse(op.operation)


def _op(user):
    return getattr(user, "operation", user)


def _reuse(op) -> None:
    ins, outs = list(op.opview.inputs), list(op.opview.outputs)
    if len(outs) != 1 or set(iterators_of(op)) != {"parallel"}:
        return
    init, result = outs[0], op.results[0]
    if not isinstance(init, ir.OpResult) or init.owner.name != "tensor.empty":
        return
    if list(op.regions[0].blocks[0].arguments[len(ins)].uses):  # the body reads the init's elements
        return
    if any(_op(u.owner).name in _SINKS for u in result.uses):
        return
    maps = maps_of(op)
    identity = ir.AffineMap.get_identity(result.type.rank)
    for value, m in zip(ins, maps):
        if m == identity and value.type == result.type and _dies_at(value, op):
            empty = init.owner
            op.operands[len(ins)] = value
            if not list(empty.results[0].uses):
                empty.erase()
            return


def _dies_at(value: ir.Value, op) -> bool:
    """Is `value` computed by an op (not a block argument, not a parameter's
    to_tensor) and read by nothing after `op` in its block?"""
    if not isinstance(value, ir.OpResult) or value.owner.name == "bufferization.to_tensor":
        return False
    for use in value.uses:
        user = _op(use.owner)
        if user == op:
            continue
        if user.block != op.block or not user.is_before_in_block(op):
            return False
    return True
