"""`kinac run` and `kinac bench`: call one Kina function from the command line.

    kinac run FILE.kina [--fn NAME] [--input NAME=@FILE.npy | --input NAME=NUMBER ...]
                        [--dim NAME=N ...] [--seed N] [--interpret | --compare] [--output-dir DIR]
    kinac bench FILE.kina [--fn NAME] [--input ...] [--dim NAME=N ...] [--seed N] [--repeats N]

In:  a .kina file and the inputs of one of its functions, given as IREE's
     `iree-run-module --input` gives them: `NAME=@FILE.npy` reads an array,
     `NAME=0.125` fills the parameter's shape with one number. With no --input at
     all, every parameter gets a seeded random array instead (`--seed`), and
     `--dim S=5` sizes the symbolic dims; with .npy inputs the arrays give them.
Out: `run` calls the compiled function (or the NumPy reference, `--interpret`) and
     writes result i to `DIR/i.npy` (`--output-dir`) or prints it. `--compare`
     runs both and prints each result's largest absolute and relative difference.
     `bench` times the compiled function against the reference on the same inputs.

Guarantees: the inputs go through `runtime.bind` before anything runs, so a
wrongly shaped or typed input gets the message a Python call gets; nothing is
converted (an .npy of another dtype is refused, not cast). A missing, unknown or
repeated parameter, or an unreadable file, is named too. Each such mistake is one
`kinac: error: ...` line and exit status 1, never a traceback.
"""
from __future__ import annotations

import argparse
import io
import math
import sys
import time
from pathlib import Path

import numpy as np

from ..frontend.types import Signature, TensorType
from ..files import FileError, read_bytes, read_npy
from ..interpreter import interpret
from ..runtime import bind, empty, numpy_dtype
from .interrupts import write_outputs


class CommandError(Exception):
    """A user's mistake on the command line: printed as `kinac: error: ...`, exit status 1."""


def run_command(argv: list[str], bench: bool = False) -> int:
    """`kinac run ARGV...` (print or write one function's results) or `kinac bench ARGV...`
    (time it against the NumPy reference); returns the exit status."""
    args = _parser(bench).parse_args(argv)
    try:
        return _bench_command(args) if bench else _run_command(args)
    except CommandError as e:
        print(f"kinac: error: {e}", file=sys.stderr)
        return 1


def _parser(bench: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kinac bench" if bench else "kinac run",
        description="Time a compiled Kina function against the NumPy reference interpreter, on the same inputs."
        if bench else "Run one Kina function on the inputs you give, or on seeded random ones.")
    p.add_argument("file", help="the .kina source file")
    p.add_argument("--fn", help="the function to run (default: the first)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=@FILE.npy|NAME=NUMBER",
                   help="a parameter's value: an array read from a .npy file, or one number filling the "
                        "parameter's shape. Give every parameter, or none for seeded random inputs")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="the size of a symbolic dim, for random inputs and numbers (.npy inputs give their own)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the random inputs (default 0)")
    if bench:
        p.add_argument("--repeats", type=_positive, default=20, help="timed calls of each (default 20)")
        return p
    how = p.add_mutually_exclusive_group()
    how.add_argument("--interpret", action="store_true", help="run with the NumPy reference interpreter")
    how.add_argument("--compare", action="store_true",
                     help="run compiled and interpreted, and print per result the largest absolute difference "
                          "|compiled - reference| and the largest relative one |compiled - reference| / |reference| "
                          "(inf where the reference is 0 and they differ; NaN against NaN counts as equal). "
                          "Exit status 0 means both ran, not that they agree")
    p.add_argument("--output-dir", metavar="DIR",
                   help="write result i to DIR/i.npy (the compiled results, with --compare) instead of printing")
    return p


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _run_command(args) -> int:
    source, reference, sig = _load(args)
    inputs = _inputs(sig, args)
    interpreted = getattr(reference, sig.name)
    results = interpreted(*inputs) if args.interpret else _compiled(source, args.file, sig.name)(*inputs)
    if args.compare:
        for i, (got, want) in enumerate(zip(results, interpreted(*inputs))):
            absolute, relative = _differences(got, want)
            print(f"result {i}: {got.dtype} {list(got.shape)}  largest difference: "
                  f"{absolute:.3g} absolute, {relative:.3g} relative")
    elif not args.output_dir:
        with np.printoptions(precision=6, suppress=True, threshold=64):
            for i, r in enumerate(results):
                print(f"result {i}: {r.dtype} {list(r.shape)}\n{r}")
    if args.output_dir:
        _write(results, Path(args.output_dir))
    return 0


def _bench_command(args) -> int:
    source, reference, sig = _load(args)
    inputs = _inputs(sig, args)
    return _bench(_compiled(source, args.file, sig.name), getattr(reference, sig.name), inputs, args.repeats)


def _load(args):
    """(source, its interpreted program, the chosen function's signature). A bad
    program raises its KinaError, which kinac renders."""
    try:
        source = read_bytes(args.file, "the source")
    except FileError as e:
        raise CommandError(f"cannot read {e}") from None
    reference = interpret(source, args.file)
    sigs = {fn.name: fn.sig for fn in reference.program.functions}
    name = args.fn or next(iter(sigs))
    if name not in sigs:
        raise CommandError(f"{args.file} has no function '{name}' (it has: {', '.join(sigs)})")
    return source, reference, sigs[name]


def _compiled(source: bytes, filename: str, name: str):
    from .api import compile_source  # only now: --interpret needs no MLIR
    return getattr(compile_source(source, filename), name)


# -- inputs ------------------------------------------------------------------------------

def _inputs(sig: Signature, args) -> list[np.ndarray]:
    """The function's arguments from --input, --dim and --seed, checked by `bind`."""
    dims = _dims(sig, args.dim)
    given = _given(sig, args.input)
    if given:
        arrays = {n: _read_npy(n, given[n][1:], t) for n, t in sig.params if given[n].startswith("@")}
        env = dict(dims)  # numbers fill shapes at the dims the .npy arrays give, else at --dim
        for n, t in sig.params:
            a = arrays.get(n)
            if a is not None and a.ndim == t.rank:  # else bind says what is wrong
                env.update((d.symbol, size) for d, size in zip(t.dims, a.shape) if d.symbol)
        inputs = [arrays[n] if n in arrays else _filled(sig.name, n, given[n], t, env) for n, t in sig.params]
    else:
        inputs = random_inputs(sig, dims, args.seed)
    try:
        _, env = bind(sig, tuple(inputs))
    except (TypeError, ValueError) as e:  # the message a Python call gets
        raise CommandError(str(e)) from None
    contradicted = [f"--dim {n}={v}, but the inputs have {n}={env[n]}" for n, v in dims.items() if env.get(n, v) != v]
    if contradicted:
        raise CommandError("; ".join(contradicted))
    return inputs


def _dims(sig: Signature, items: list[str]) -> dict[str, int]:
    known = sorted({n for _, t in sig.params for d in t.dims for n in d.names})
    dims: dict[str, int] = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name.isidentifier() or not (value.isascii() and value.isdigit()):
            raise CommandError(f"--dim expects NAME=N with N a non-negative integer, got {item!r}")
        if name in dims:
            raise CommandError(f"--dim {name} is given twice ({dims[name]} and {value})")
        dims[name] = int(value)
    unknown = sorted(set(dims) - set(known))
    if unknown:
        raise CommandError(f"--dim {', '.join(unknown)}: {sig.name} has no such dim "
                           f"(its dims are: {', '.join(known) or 'none'})")
    return dims


def _given(sig: Signature, items: list[str]) -> dict[str, str]:
    """{parameter: '@FILE.npy' or 'NUMBER'}, for every parameter or for none."""
    params = [n for n, _ in sig.params]
    given: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier() or not value.strip():
            raise CommandError(f"--input expects NAME=@FILE.npy or NAME=NUMBER, got {item!r}")
        if value.strip() == "@":
            raise CommandError(f"--input {name}=@ names no file: write the .npy file's path after the @ "
                               f"(--input {name}=@FILE.npy)")
        if name not in params:
            raise CommandError(f"{sig.name}() has no parameter '{name}' (its parameters are: {', '.join(params)})")
        if name in given:
            raise CommandError(f"{sig.name}(): parameter '{name}' is given twice (--input {name}={given[name]} "
                               f"and --input {item})")
        given[name] = value
    missing = [n for n in params if n not in given]
    if given and missing:
        raise CommandError(f"{sig.name}() takes {len(params)} arguments ({', '.join(params)}), got {len(given)}: "
                           f"no --input for {', '.join(missing)} (give every parameter, or none for random inputs)")
    return given


def _read_npy(name: str, path: str, t: TensorType):
    try:
        a = read_npy(path, f"--input {name}")
    except FileError as e:
        raise CommandError(str(e)) from None
    if t.is_blocked:  # the bytes of GGUF's rows, [..., N, K / block * size]
        from .. import dtypes
        from ..runtime.quant import QuantizedArray
        fmt = dtypes.by_name(t.dtype)
        if a.dtype != np.uint8 or a.ndim != t.rank or a.shape[-1] % fmt.size:
            raise CommandError(f"--input {name}: {path}: a {t.dtype} parameter takes the uint8 bytes of its GGUF "
                               f"rows, [..., N, K / {fmt.block} * {fmt.size}], got {a.dtype} {list(a.shape)}")
        return QuantizedArray(t.dtype, (*a.shape[:-2], a.shape[-1] // fmt.size * fmt.block, a.shape[-2]), a)
    want = numpy_dtype(t.dtype)
    if a.dtype == np.dtype("V2") and str(want) == "bfloat16":  # NumPy saves bfloat16 as raw 2-byte values
        a = a.view(want)
    return a


def _filled(fn: str, name: str, text: str, t: TensorType, env: dict[str, int]) -> np.ndarray:
    """Parameter `name` of type `t` filled with the number `text`."""
    where = f"{fn}(): parameter '{name}'"
    if t.is_blocked:
        raise CommandError(f"{where} is {t.dtype}: give it as @FILE.npy (the uint8 bytes of its GGUF rows), "
                           f"not a number")
    want = numpy_dtype(t.dtype)
    integer = want.kind in "iu"
    try:
        number = int(text) if integer else float(text)
    except ValueError:
        raise CommandError(f"{where} expects @FILE.npy or {'an integer' if integer else 'a number'} "
                           f"for {want} ({t.dtype}), got {text!r}") from None
    with np.errstate(over="ignore"):
        fits = np.iinfo(want).min <= number <= np.iinfo(want).max if integer else \
            math.isinf(number) or not np.isinf(want.type(number))
    if not fits:
        raise CommandError(f"{where} expects {want} ({t.dtype}), got {text}, which {want} cannot represent")
    unknown = sorted({n for d in t.dims for n in d.names} - env.keys())
    if unknown:
        raise CommandError(f"{where} has symbolic dims {', '.join(unknown)}: give them with --dim NAME=N "
                           f"(or give an .npy input that has them) for a number to fill its shape")
    return np.full(tuple(d.evaluate(env) for d in t.dims), number, want)


def random_inputs(sig: Signature, dims: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """Seeded arguments for `sig` at `dims`: standard normal floats, integers in [-8, 8)."""
    rng = np.random.default_rng(seed)
    out = []
    for pname, t in sig.params:
        missing = sorted({n for d in t.dims for n in d.names} - dims.keys())
        if missing:
            raise CommandError(f"parameter '{pname}' has symbolic dims {', '.join(missing)}: "
                               f"give them with --dim NAME=N")
        shape = tuple(d.evaluate(dims) for d in t.dims)
        if t.is_blocked:  # random blocks, their scales finite
            from ..runtime.quant import random_blocks
            out.append(random_blocks(t.dtype, shape, rng))
            continue
        dtype = numpy_dtype(t.dtype)
        if dtype.kind in "iu":
            out.append(rng.integers(-8, 8, shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


# -- results -----------------------------------------------------------------------------

def _write(results, folder: Path) -> None:
    paths = [folder / f"{i}.npy" for i in range(len(results))]
    files = {}
    for path, r in zip(paths, results):
        buffer = io.BytesIO()
        np.save(buffer, r)
        files[path] = buffer.getvalue()
    try:
        write_outputs(files)  # all of them or none
    except OSError as e:
        raise CommandError(f"--output-dir {folder}: {e.strerror or e}") from None
    print(f"wrote {', '.join(map(str, paths))}", file=sys.stderr)


def _differences(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """The largest |got - want| and |got - want| / |want| over the elements, in float64.
    Equal elements differ by 0 (NaN and NaN, inf and inf too); where want is 0 and got
    is not, the relative difference is inf; a NaN against a number makes both NaN."""
    g, w = np.atleast_1d(got.astype(np.float64)), np.atleast_1d(want.astype(np.float64))
    if not g.size:
        return 0.0, 0.0
    with np.errstate(all="ignore"):
        diff = np.abs(g - w)
        diff[(g == w) | (np.isnan(g) & np.isnan(w))] = 0.0
        relative = np.where(diff == 0, 0.0, diff / np.abs(w))
    return float(diff.max()), float(relative.max())


def _bench(compiled, reference, inputs: list[np.ndarray], repeats: int) -> int:
    """Interleaved timing of the compiled function and the NumPy interpreter on the same inputs.
    "kina" allocates its results on every call, as the interpreter does; "kina into" writes
    into results allocated once (`call_into`), which is what a loop that reuses them pays."""
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
