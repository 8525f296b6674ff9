"""A NumPy reference interpreter for checked Kina programs: the tests' oracle.

In:  Kina source (or a checked `ast.Program`), a function name and NumPy arrays.
Out: a tuple of NumPy arrays, computed op by op with NumPy.

Guarantees: it runs the same argument checks as the compiled runtime (so the
two fail alike on bad calls), and it defines each operation the way the
language reference does: concat is `np.concatenate`, `@` is `np.matmul`, `*`
and `+` broadcast, softmax subtracts the max first. It needs no MLIR.

`kinac run FILE [--fn NAME] [--interpret] [--dim S=5 ...] [--seed N]` runs a
function on seeded random inputs, compiled or interpreted, and prints the results;
`kinac bench FILE [--fn NAME] [--dim ...] [--repeats N]` times the compiled
function against this interpreter on the same inputs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from . import ast
from .check import check
from .runtime import bind, empty, numpy_dtype, result_shapes
from .syntax import parse


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    if x.dtype == np.float16:  # computed in F32 and rounded once, as the compiled code does
        return _softmax(x.astype(np.float32), axis).astype(np.float16)
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
        return np.matmul(_eval(e.lhs, env), _eval(e.rhs, env))
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


def interpret(source: str | bytes | ast.Program, filename: str = "<string>") -> Interpreted:
    """Parse and check `source` (unless it is already a checked program) for NumPy execution."""
    program = source if isinstance(source, ast.Program) else check(parse(source, filename))
    return Interpreted(program)


def random_inputs(sig, dims: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for pname, t in sig.params:
        names = {n for d in t.dims for n in d.names}
        missing = sorted(names - dims.keys())
        if missing:
            raise ValueError(f"parameter '{pname}' has symbolic dims {', '.join(missing)}: give them with --dim NAME=N")
        shape = tuple(d.evaluate(dims) for d in t.dims)
        dtype = numpy_dtype(t.dtype)
        if dtype is None:
            raise ValueError(f"parameter '{pname}' is {t.dtype}, which NumPy cannot represent")
        if dtype.kind == "f":
            out.append(rng.standard_normal(shape).astype(dtype))
        else:
            out.append(rng.integers(-8, 8, shape).astype(dtype))
    return out


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def run_command(argv: list[str], bench: bool = False) -> int:
    """`kinac run` (print one function's results) and `kinac bench` (time it against NumPy)."""
    prog, what = ("kinac bench", "Time a compiled Kina function against the NumPy interpreter.") if bench else \
        ("kinac run", "Run a Kina function on seeded random inputs.")
    p = argparse.ArgumentParser(prog=prog, description=what)
    p.add_argument("file")
    p.add_argument("--fn", help="the function to run (default: the first)")
    if bench:
        p.add_argument("--repeats", type=_positive, default=20, help="timed calls of each (default 20)")
    else:
        p.add_argument("--interpret", action="store_true", help="run with the NumPy reference interpreter")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N", help="a value for a symbolic dim")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        source = Path(args.file).read_bytes()
    except OSError as e:
        print(f"kinac: error: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 1
    dims = {}
    for item in args.dim:
        name, _, value = item.partition("=")
        if not name.isidentifier() or not value.isdigit():
            print(f"kinac: error: --dim expects NAME=N with N a non-negative integer, got {item!r}", file=sys.stderr)
            return 1
        dims[name] = int(value)
    reference = interpret(source, args.file)
    sigs = {fn.name: fn.sig for fn in reference.program.functions}
    name = args.fn or next(iter(sigs))
    if name not in sigs:
        print(f"kinac: error: {args.file} has no function '{name}' (it has: {', '.join(sigs)})", file=sys.stderr)
        return 1
    known = {n for _, t in sigs[name].params for d in t.dims for n in d.names}
    unknown = sorted(set(dims) - known)
    if unknown:
        print(f"kinac: error: --dim {', '.join(unknown)}: {name} has no such dim "
              f"(its dims are: {', '.join(sorted(known)) or 'none'})", file=sys.stderr)
        return 1
    try:
        inputs = random_inputs(sigs[name], dims, args.seed)
    except ValueError as e:
        print(f"kinac: error: {e}", file=sys.stderr)
        return 1
    if not bench and args.interpret:
        results = getattr(reference, name)(*inputs)
    else:
        from .pipeline import compile_source
        compiled = getattr(compile_source(source, args.file), name)
        if bench:
            return _bench(compiled, getattr(reference, name), inputs, args.repeats)
        results = compiled(*inputs)
    np.set_printoptions(precision=6, suppress=True, threshold=64)
    for i, r in enumerate(results):
        print(f"result {i}: {r.dtype} {list(r.shape)}\n{r}")
    return 0


def _bench(compiled, reference, inputs: list[np.ndarray], repeats: int) -> int:
    """Interleaved timing of the compiled function and the NumPy interpreter on the same inputs.
    "kina" allocates its results on every call, as the interpreter does; "kina into" writes
    into results allocated once (`call_into`), which is what a loop that reuses them pays."""
    import time
    outs = [empty(r.shape, r.dtype) for r in compiled(*inputs)]
    runs = (("kina", lambda: compiled(*inputs)), ("kina into", lambda: compiled.call_into(inputs, outs)),
            ("numpy", lambda: reference(*inputs)))
    times: dict[str, list[float]] = {label: [] for label, _ in runs}
    for _ in range(max(1, repeats)):
        for label, run in runs:
            start = time.perf_counter()
            run()
            times[label].append(time.perf_counter() - start)
    worst = 0.0
    for got, want in zip(compiled(*inputs), reference(*inputs)):
        # F16 results are rounded to 11 bits (both sides sum in F32, in different orders)
        tol = 2e-2 if got.dtype == np.float16 else 1e-4
        if not np.allclose(got, want, rtol=tol, atol=tol / 10, equal_nan=True):
            print(f"kinac: error: compiled and interpreted results differ by up to "
                  f"{float(np.nanmax(np.abs(got.astype(np.float64) - want))):.3g}", file=sys.stderr)
            return 1
        if got.size:
            worst = max(worst, float(np.nanmax(np.abs(got.astype(np.float64) - want))))
    med = {k: float(np.median(v)) for k, v in times.items()}
    for label, v in times.items():
        print(f"{label:<9} median {med[label] * 1e3:9.3f} ms  (min {min(v) * 1e3:.3f}, max {max(v) * 1e3:.3f}, "
              f"{len(v)} calls)")
    print(f"kina / numpy: {med['kina'] / med['numpy']:.2f}  (results agree; largest difference {worst:.3g})")
    return 0
