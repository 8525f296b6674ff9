"""A NumPy reference interpreter for checked Kina programs: the tests' oracle.

In:  Kina source (or a checked `ast.Program`), a function name and arrays (whatever
     the compiled runtime accepts: see `runtime.bind`).
Out: a tuple of NumPy arrays, computed op by op with NumPy.

Guarantees: it runs the same argument checks as the compiled runtime (so the
two fail alike on bad calls), and it defines each operation the way the
language reference does: concat is `np.concatenate`, `@` is `np.matmul`, `*`
and `+` broadcast, softmax subtracts the max first; F16 and BF16 matmuls and
softmaxes run in F32 and round once, in the compiled code's order. It needs no MLIR.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import ast
from .check import check
from .runtime import bind, numpy_dtype, result_shapes
from .syntax import parse


# The dtypes whose sums (matmul, softmax) run in F32 and are rounded once, as in the
# compiled code (lower.WIDE); `*` and `+` round per operation, as NumPy and ml_dtypes do.
WIDE = (numpy_dtype("F16"), numpy_dtype("BF16"))


def matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`x @ y`. For F16 and BF16, the sum over k runs in F32, k ascending, rounded to the
    dtype once: the compiled code's order (and NumPy's own F16 matmul's), so the two agree
    bit for bit. (ml_dtypes' bfloat16 matmul returns float32, summed in BLAS's order.)"""
    if x.dtype not in WIDE:
        return np.matmul(x, y)
    a, b = x.astype(np.float32), y.astype(np.float32)
    acc = np.zeros((*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]), np.float32)
    for k in range(a.shape[-1]):  # multiply, then add: the compiled code's operations, in its order
        acc += a[..., :, k, None] * b[..., None, k, :]
    return acc.astype(x.dtype)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    if x.dtype in WIDE:  # computed in F32 and rounded once, as the compiled code does
        return _softmax(x.astype(np.float32), axis).astype(x.dtype)
    return _softmax(x, axis)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True)) if x.shape[axis] else x.copy()
    return e / np.sum(e, axis=axis, keepdims=True) if x.shape[axis] else e


def _eval(e: ast.Expr, env: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(e, ast.Name):
        return env[e.id]
    if isinstance(e, ast.Broadcast):  # NumPy's own broadcasting in * and + does the stretching
        return _eval(e.operand, env)
    if isinstance(e, ast.Concat):
        return np.concatenate([_eval(e.lhs, env), _eval(e.rhs, env)], axis=e.axis)
    if isinstance(e, ast.MatMul):
        return matmul(_eval(e.lhs, env), _eval(e.rhs, env))
    if isinstance(e, ast.Mul):
        return np.multiply(_eval(e.lhs, env), _eval(e.rhs, env))
    if isinstance(e, ast.Add):
        return np.add(_eval(e.lhs, env), _eval(e.rhs, env))
    if isinstance(e, ast.Softmax):
        return softmax(_eval(e.operand, env), e.axis)
    raise AssertionError(f"cannot interpret {e!r}")


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
            values = dict(zip((p.name for p in fn.params), arrays))
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

