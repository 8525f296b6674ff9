"""abi: give each Kina function the C boundary the runtime calls.

In:  `func.func @f(tensors) -> (tensors)`, the reference IR.
Out: `func.func @kina_f(memrefs..., out-memrefs...)` with `llvm.emit_c_interface`,
     in destination-passing style, its body still on tensors:

    func.func @f(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
      %e = tensor.empty() : tensor<2x3xf32>
      %y = linalg.generic ... ins(%x ...) outs(%e ...)
      return %y : tensor<2x3xf32>
    }
becomes
    func.func @kina_f(%x: memref<2x3xf32, strided<[?, 1], offset: ?>>,
                      %out0: memref<2x3xf32, strided<[?, 1], offset: ?>>) attributes {llvm.emit_c_interface} {
      %0 = bufferization.to_tensor %x restrict : ... to tensor<2x3xf32>
      %1 = bufferization.to_tensor %out0 restrict writable : ... to tensor<2x3xf32>
      %y = linalg.generic ... ins(%0 ...) outs(%1 ...)
      bufferization.materialize_in_destination %y in restrict writable %out0 : ...
      return
    }

Guarantees: every buffer is a memref with any outer strides and offset and a unit
innermost stride, so the caller passes NumPy views without a copy while inner
loops still see unit stride. The caller owns every result buffer, and nothing
computed here escapes or leaks. A result is computed straight into its buffer:
the `tensor.empty` it is built on (followed back through insert_slice
destinations and linalg inits) becomes that buffer, a refinement of "undefined
contents", so the final copy is onto itself and disappears. Exported names get the
`kina_` prefix (the `prefix` option; kina.runtime looks for kina_), so that a Kina function called `exp` or `free` cannot replace the
libm/libc function the generated code calls.

Preconditions (else a diagnostic at the function or call, `Unsupported`): every
function not yet converted takes and returns ranked tensors only, has one block
ending in its return, is not called by another, and its new name is free.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import bufferization, func, tensor

from ...abi import PREFIX
from ._pass import KinaPass, Unsupported, option
from ._util import functions

DYN_STRIDE = ir.ShapedType.get_dynamic_stride_or_offset()


def _symbol_prefix(text: str) -> bool:
    return text.replace("_", "a").isalnum() and not text[:1].isdigit()


@dataclass(frozen=True)
class Abi(KinaPass):
    name = "abi"
    summary = ("the C boundary: memref parameters (any outer strides, unit innermost stride), one out-buffer "
               "per result that the result is computed in, the kina_ prefix, llvm.emit_c_interface")
    prefix: str = option(PREFIX, f"the prefix of every exported name (kina.runtime looks for {PREFIX})",
                         check=_symbol_prefix, expected="letters, digits and '_', not starting with a digit")

    def run(self, module_op) -> None:
        todo = [fn for fn in functions(module_op) if "llvm.emit_c_interface" not in fn.attributes]
        names = {fn.sym_name.value for fn in functions(module_op)}
        called = _callees(module_op)
        for fn in todo:
            _check(fn, self.prefix, names, called)
        for fn in todo:
            _convert(fn, self.prefix)


def _callees(module_op) -> dict:
    """The functions that a `func.call` names: name -> the first call."""
    calls = {}

    def visit(op):
        if isinstance(op.opview, func.CallOp):
            calls.setdefault(op.attributes["callee"].value, op)
        return ir.WalkResult.ADVANCE
    module_op.walk(visit)
    return calls


def _check(fn, prefix: str, names: set, called: dict) -> None:
    """Raise `Unsupported` unless `fn` is what this pass takes: one block ending in its
    return, ranked tensors in and out, not called, its new name free."""
    name = fn.sym_name.value
    ftype = fn.type
    for t in [*ftype.inputs, *ftype.results]:
        if not isinstance(t, ir.RankedTensorType):
            kind = "scalars" if not isinstance(t, ir.ShapedType) else "values"
            raise Unsupported(fn, f"cannot take a function over '{t}' {kind}: '{name}' must take and return "
                                  "ranked tensors only (each becomes a memref at the C boundary)")
    blocks = len(fn.regions[0].blocks)
    if blocks != 1:
        what = "a function declaration" if blocks == 0 else f"a function of {blocks} blocks"
        raise Unsupported(fn, f"cannot take {what}: '{name}' must have a body of one block ending in its return")
    if name in called:
        raise Unsupported(called[name], f"cannot take a call of '{name}': its signature changes at the C boundary")
    if prefix + name in names:
        raise Unsupported(fn, f"cannot rename '{name}' to '{prefix + name}': that name is taken")


def memref_type(t: ir.RankedTensorType) -> ir.MemRefType:
    """The boundary type of tensor type `t`: any outer strides and offset, unit innermost stride."""
    strides = [DYN_STRIDE] * (t.rank - 1) + [1] if t.rank else []
    return ir.MemRefType.get(t.shape, t.element_type, ir.StridedLayoutAttr.get(DYN_STRIDE, strides))


def _convert(fn, prefix: str) -> None:
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    name = ir.StringAttr(fn.attributes["sym_name"]).value
    old = fn.regions[0].blocks[0]
    with fn.location, ir.InsertionPoint(fn):
        new = func.FuncOp(prefix + name,
                          ir.FunctionType.get([memref_type(t) for t in [*ftype.inputs, *ftype.results]], []))
        new.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        outs = [ir.Location.name(f"out{i}", childLoc=fn.location) for i in range(len(ftype.results))]
        block = new.add_entry_block(arg_locs=[a.location for a in old.arguments] + outs)
    results = list(old.operations)[-1].operands
    with ir.InsertionPoint(block):
        for arg, buffer in zip(old.arguments, block.arguments):
            with arg.location:
                arg.replace_all_uses_with(bufferization.ToTensorOp(arg.type, buffer, restrict=True).result)
        for value, buffer in zip(results, block.arguments[len(ftype.inputs):]):
            empty = _base_empty(value)
            if empty is not None:
                with buffer.location:
                    dest = bufferization.ToTensorOp(empty.results[0].type, buffer, restrict=True, writable=True)
                empty.results[0].replace_all_uses_with(dest.result)
                empty.erase()
        with fn.location:
            end = func.ReturnOp([])
    # (ops are moved, then built around with InsertionPoint(end): a moved op's Python
    # object may still point at its old block)
    ret = list(old.operations)[-1]
    for op in list(old.operations):
        op.move_before(end)
    with ir.InsertionPoint(end), ret.location:
        for value, buffer in zip(ret.operands, block.arguments[len(ftype.inputs):]):
            bufferization.MaterializeInDestinationOp(None, value, buffer, restrict=True, writable=True)
    ret.erase()
    fn.operation.erase()


def _base_empty(value: ir.Value):
    """The tensor.empty whose storage `value` is built in: followed back through
    insert_slice destinations and the inits of linalg ops; None if there is none."""
    while isinstance(value, ir.OpResult):
        op = value.owner
        if isinstance(op, tensor.EmptyOp):
            return op
        if isinstance(op, tensor.InsertSliceOp):
            value = op.dest
        elif op.name.startswith("linalg.") and hasattr(op, "outputs"):  # any linalg op with inits
            value = list(op.outputs)[value.result_number]
        else:
            return None
    return None
