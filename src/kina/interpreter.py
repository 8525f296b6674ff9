"""A NumPy reference interpreter for checked Kina programs: the tests' oracle.

In:  Kina source (or a checked `ast.Program`), a function name and arrays (whatever
     the compiled runtime accepts: see `runtime.bind`).
Out: a tuple of NumPy arrays, computed op by op with NumPy.

Guarantees: it runs the same argument checks as the compiled runtime (so the
two fail alike on bad calls), and it defines each operation the way the
language reference does, by the NumPy expression of its entry in `ops.OPS`
(`Op.numpy`): concat is `np.concatenate`, `@` is `np.matmul` (batch dims
broadcast), `+ - * /` broadcast (a number is a 0-d array of the other operand's
dtype), softmax subtracts the max first, reductions keep the rank. The ops marked
`wide` run F16 and BF16 in F32 and round once, as the compiled code does; the
others round per operation, as NumPy and ml_dtypes do. It needs no MLIR.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import numpy as np

from .frontend import ast, ops
from .frontend.check import check
from .frontend.ops import WIDE
from .frontend.syntax import parse
from .frontend.types import nearest
from .runtime import QuantizedArray, bind, numpy_dtype, result_shapes


def matmul_k_ascending(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`x @ y` summed over k in ascending order: the compiled code's order (and NumPy's own F16
    matmul's), so that F16 and BF16 matmuls, computed in F32 and rounded once, agree bit for
    bit. (ml_dtypes' bfloat16 matmul returns float32, summed in BLAS's order.)"""
    acc = np.zeros((*np.broadcast_shapes(x.shape[:-2], y.shape[:-2]), x.shape[-2], y.shape[-1]), x.dtype)
    for k in range(x.shape[-1]):  # multiply, then add: the compiled code's operations, in its order
        acc += x[..., :, k, None] * y[..., None, k, :]
    return acc


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """The max subtracted first; over an empty axis, the (empty) operand."""
    e = np.exp(x - np.max(x, axis=axis, keepdims=True)) if x.shape[axis] else x.copy()
    return e / np.sum(e, axis=axis, keepdims=True) if x.shape[axis] else e


def lowest(dtype: np.dtype):
    """max's identity, its value over an empty axis (as in the compiled code): -inf, or the smallest integer."""
    return -np.inf if dtype.kind != "i" else np.iinfo(dtype).min


def reshape(e: ast.Reshape, x: np.ndarray) -> np.ndarray:
    """The result's symbolic dims are the operand's, in order: they take the operand's sizes."""
    sizes = iter(n for n, d in zip(x.shape, e.operand.type.dims) if not d.is_static)
    return x.reshape([d.const if d.is_static else next(sizes) for d in e.type.dims])


# What an `Op.numpy` expression may name besides its operands, attributes and `e`.
_NAMES = {"np": np, "WIDE": WIDE, "matmul_k_ascending": matmul_k_ascending, "softmax": softmax,
          "lowest": lowest, "reshape": reshape, "numpy_dtype": numpy_dtype}


@lru_cache(maxsize=None)
def _compiled(expression: str):
    return compile(expression, expression, "eval")


def _eval(e: ast.Expr, env: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(e, ast.Name):
        return env[e.id]
    if isinstance(e, ast.Number):  # a 0-d array of the other operand's dtype: NumPy stretches it
        return np.asarray(nearest(e.type.dtype, e.value), numpy_dtype(e.type.dtype))
    op = ops.of(e)
    operands = [_eval(c, env) for c in ast.children(e)]
    wide = op.wide and e.type.dtype in WIDE
    if op.wide:  # F16 and BF16 computed in F32 (and rounded once), as the compiled code does
        compute = numpy_dtype(WIDE.get(e.type.dtype, e.type.dtype))  # a mixed matmul's F16 operand too
        operands = [v if v.dtype == compute else v.astype(compute) for v in operands]
    names = {**dict(zip("xy", operands)), **ast.attributes(e), "e": e}
    value = eval(_compiled(op.numpy), _NAMES, names)
    return value.astype(numpy_dtype(e.type.dtype)) if wide else value


class Interpreted:
    """A checked program whose functions run in NumPy; mirrors `runtime.Module`."""

    def __init__(self, program: ast.Program):
        self.program = program
        self.functions = {fn.name: fn for fn in program.functions}

    def __repr__(self) -> str:
        return f"<kina interpreted program {self.program.filename}: {', '.join(self.functions)}>"

    def __getattr__(self, name: str):
        functions = self.__dict__.get("functions", {})
        if name not in functions:
            raise AttributeError(f"program has no function {name!r} (it has: {', '.join(functions)})")
        fn = functions[name]

        def call(*args):
            arrays, env = bind(fn.sig, args)
            # a block-quantized argument is its values (F32), as the compiled code's dequantization gives them
            values = {p.name: a.dequantize() if isinstance(a, QuantizedArray) else b
                      for p, a, b in zip(fn.params, args, arrays)}
            with np.errstate(all="ignore"):  # NaN and Inf are values here, as in compiled code: no warnings
                for let in fn.body:
                    values[let.name] = _eval(let.value, values)
                return tuple(np.array(_eval(r, values), dtype=numpy_dtype(t.dtype)).reshape(shape)
                             for r, t, shape in zip(fn.results, fn.sig.results, result_shapes(fn.sig, env)))
        call.__name__ = name
        return call


def interpret(source: str | bytes | ast.Program, filename: str = "<string>", *,
              dtypes: Mapping[str, str] | None = None, dims: Mapping[str, int] | None = None) -> Interpreted:
    """Parse and check `source` (unless it is already a checked program) for NumPy execution,
    specialised with `dtypes` and `dims` as `kina.compile_source` is."""
    program = source if isinstance(source, ast.Program) else check(parse(source, filename), dtypes, dims)
    return Interpreted(program)

