"""A NumPy reference interpreter for checked Kina programs: the tests' oracle.

In:  Kina source (or a checked `ast.Program`), a function name and arrays (whatever
     the compiled runtime accepts: see `runtime.bind`).
Out: a tuple of NumPy arrays, computed op by op with NumPy.

Guarantees: it runs the same argument checks as the compiled runtime (so the
two fail alike on bad calls), and it defines each operation the way the
language reference does, one entry of `OPS` each: concat is `np.concatenate`,
`@` is `np.matmul` (batch dims broadcast), `+ - * /` broadcast (a number is a
0-d array of the other operand's dtype), softmax subtracts the max first,
reductions keep the rank; F16 and BF16 matmuls, softmaxes, sums, means and
exp/sqrt/rsqrt/sigmoid run in F32 and round once, as the compiled code does.
It needs no MLIR.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .frontend import ast
from .frontend.check import check
from .frontend.syntax import parse
from .frontend.types import nearest
from .runtime import bind, numpy_dtype, result_shapes


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


def _in_f32(fn):
    """`fn` computed in F32 and rounded once for F16 and BF16 (as the compiled code does), else as is."""
    return lambda x: fn(x.astype(np.float32)).astype(x.dtype) if x.dtype in WIDE else fn(x)


def _sum(x: np.ndarray, axis: int) -> np.ndarray:
    """Integers wrap, as the compiled code's do; F16 and BF16 sum in F32 and round once."""
    if x.dtype in WIDE:
        return np.sum(x.astype(np.float32), axis=axis, keepdims=True).astype(x.dtype)
    return np.sum(x, axis=axis, keepdims=True, dtype=x.dtype)


def _mean(x: np.ndarray, axis: int) -> np.ndarray:
    """The sum divided by the dim's size (0 / 0 is NaN), in F32 for F16 and BF16, rounded once."""
    wide = x.astype(np.float32) if x.dtype in WIDE else x
    return (np.sum(wide, axis=axis, keepdims=True) / wide.dtype.type(x.shape[axis])).astype(x.dtype)


def _max(x: np.ndarray, axis: int) -> np.ndarray:
    """Over an empty axis: -inf, or the smallest integer (max's identity), as in the compiled code."""
    start = -np.inf if x.dtype.kind != "i" else np.iinfo(x.dtype).min
    return np.max(x, axis=axis, keepdims=True, initial=start)


def _reshape(e: ast.Reshape, x: np.ndarray) -> np.ndarray:
    """The result's symbolic dims are the operand's, in order: they take the operand's sizes."""
    sizes = iter(n for n, d in zip(x.shape, e.operand.type.dims) if not d.is_static)
    return x.reshape([d.const if d.is_static else next(sizes) for d in e.type.dims])


def _slice(e: ast.Slice, x: np.ndarray) -> np.ndarray:
    index = [slice(None)] * x.ndim
    index[e.axis] = slice(e.start, e.start + e.size)
    return x[tuple(index)]


# Each operation on its operands' values (in `ast.children` order); `e` gives its attributes.
OPS = {
    ast.Concat: lambda e, x, y: np.concatenate([x, y], axis=e.axis),
    ast.MatMul: lambda e, x, y: matmul(x, y),
    ast.Mul: lambda e, x, y: np.multiply(x, y),
    ast.Add: lambda e, x, y: np.add(x, y),
    ast.Sub: lambda e, x, y: np.subtract(x, y),
    ast.Div: lambda e, x, y: np.divide(x, y),
    ast.Softmax: lambda e, x: softmax(x, e.axis),
    ast.Neg: lambda e, x: np.negative(x),
    ast.Exp: lambda e, x: _in_f32(np.exp)(x),
    ast.Sqrt: lambda e, x: _in_f32(np.sqrt)(x),
    ast.Rsqrt: lambda e, x: _in_f32(lambda v: 1 / np.sqrt(v))(x),
    ast.Sigmoid: lambda e, x: _in_f32(lambda v: 1 / (1 + np.exp(-v)))(x),
    ast.Sum: lambda e, x: _sum(x, e.axis),
    ast.Max: lambda e, x: _max(x, e.axis),
    ast.Mean: lambda e, x: _mean(x, e.axis),
    ast.Transpose: lambda e, x: np.transpose(x, e.perm),
    ast.Reshape: _reshape,
    ast.Slice: _slice,
}


def _eval(e: ast.Expr, env: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(e, ast.Name):
        return env[e.id]
    if isinstance(e, ast.Number):  # a 0-d array of the other operand's dtype: NumPy stretches it
        return np.asarray(nearest(e.type.dtype, e.value), numpy_dtype(e.type.dtype))
    if isinstance(e, ast.Broadcast):  # NumPy's own broadcasting in + - * / does the stretching
        return _eval(e.operand, env)
    return OPS[type(e)](e, *(_eval(c, env) for c in ast.children(e)))


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

