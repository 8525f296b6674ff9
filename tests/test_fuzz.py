"""Property-based tests (hypothesis): random programs and random damage to them.

1. Random well-typed programs over concat, @, *, +, broadcast and softmax, with
   random shapes (static, 0, and symbolic dims such as S, T, S+1) and dtypes (F32,
   F64; I32 and I64 where the op allows integers), pass the checker with the types
   the generator meant, and compiled code agrees with the NumPy interpreter:
   bit for bit for integers and concat-only float programs, within a tolerance
   where floating-point arithmetic may be reassociated.
2. Random mutations of valid programs (tokens deleted, swapped, duplicated or
   inserted; random bytes) end in either a KinaError or success through the first
   three stages (parse, check, lower to MLIR): never another exception, and never
   a hang (each example runs under an alarm).

The normal suite runs few examples (compiling one costs ~0.3 s). Set
KINA_FUZZ_EXAMPLES=N to scale up (`make fuzz` uses 5000): N front-end examples
per property and N/20 compiled ones.
"""
from __future__ import annotations

import os
import re
import signal
from contextlib import contextmanager

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import kina
from conftest import EXAMPLES, assert_same
from kina import KinaError, check, syntax
from kina.pipeline import run_stages
from kina.runtime import numpy_dtype
from kina.types import Dim

SCALE = int(os.environ.get("KINA_FUZZ_EXAMPLES", "0"))
FRONT_END = settings(max_examples=SCALE or 60, deadline=None, derandomize=not SCALE,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COMPILED = settings(max_examples=max(SCALE // 20, 6), deadline=None, derandomize=not SCALE,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

FLOATS, INTS = ("F32", "F64"), ("I32", "I64")
SYMBOLS = ("S", "T")
SUM, PRODUCT, ATOM = 0, 1, 2  # precedence of a generated expression, to parenthesise only when needed


# -- a generator of well-typed programs -----------------------------------------------------

class ProgramGen:
    """Builds one random function top-down from the result types it must produce.

    Every subexpression is generated for a target shape, so the program is well typed
    by construction; the test then checks that the checker agrees.
    """

    def __init__(self, draw, dtype: str):
        self.draw, self.dtype = draw, dtype
        self.params: list[tuple[str, tuple[Dim, ...]]] = []
        self.lets: list[tuple[str, str, tuple[Dim, ...]]] = []
        self.exact = True  # only concat and names so far: results must match bit for bit

    def dim(self, symbolic: bool = True) -> Dim:
        choices = [Dim(0), Dim(1), Dim(2), Dim(3)]
        if symbolic:
            choices += [Dim.of("S"), Dim.of("T"), Dim.of("S") + 1]
        return self.draw(st.sampled_from(choices))

    def shape(self, rank: int) -> tuple[Dim, ...]:
        return tuple(self.dim() for _ in range(rank))

    def leaf(self, dims: tuple[Dim, ...]) -> tuple[str, int]:
        same = [n for n, d in self.params if d == dims] + [n for n, _, d in self.lets if d == dims]
        if same and self.draw(st.booleans()):
            return self.draw(st.sampled_from(same)), ATOM
        name = f"p{len(self.params)}"
        self.params.append((name, dims))
        return name, ATOM

    def expr(self, dims: tuple[Dim, ...], depth: int) -> tuple[str, int]:
        ops = ["leaf"]
        if depth > 0:
            ops += ["mul", "add", "broadcast"]
            if any(d.is_static or (d.const > 0 and d.terms) for d in dims):
                ops.append("concat")
            if self.dtype in FLOATS:
                ops += ["softmax"] * (len(dims) >= 1) + ["matmul"] * (len(dims) >= 2)
        op = self.draw(st.sampled_from(ops))
        if op == "leaf":
            return self.leaf(dims)
        text, prec = getattr(self, op)(dims, depth - 1)
        if op != "concat":
            self.exact = False
        if self.draw(st.integers(0, 3)) == 0:  # sometimes name it with a let
            name = f"t{len(self.lets)}"
            self.lets.append((name, text, dims))
            return name, ATOM
        return text, prec

    def operand(self, dims, depth, at_least: int) -> str:
        text, prec = self.expr(dims, depth)
        return text if prec >= at_least else f"({text})"

    def concat(self, dims, depth):
        axes = [a for a, d in enumerate(dims) if d.is_static or (d.const > 0 and d.terms)]
        axis = self.draw(st.sampled_from(axes))
        d = dims[axis]
        if d.is_static:
            k = self.draw(st.integers(0, d.const))
            parts = [Dim(k), Dim(d.const - k)]
        else:  # S+1 -> S and 1, either way round
            parts = [Dim(0, d.terms), Dim(d.const)]
            if self.draw(st.booleans()):
                parts.reverse()
        lhs, rhs = (self.operand(dims[:axis] + (p,) + dims[axis + 1:], depth, ATOM) for p in parts)
        return f"concat[axis={axis}] {lhs} {rhs}", ATOM

    def matmul(self, dims, depth):
        k = self.dim()
        lhs = self.operand(dims[:-1] + (k,), depth, PRODUCT)
        rhs = self.operand(dims[:-2] + (k, dims[-1]), depth, ATOM)
        return f"{lhs} @ {rhs}", PRODUCT

    def mul(self, dims, depth):
        return f"{self.operand(dims, depth, PRODUCT)} * {self.operand(dims, depth, ATOM)}", PRODUCT

    def add(self, dims, depth):
        return f"{self.operand(dims, depth, SUM)} + {self.operand(dims, depth, PRODUCT)}", SUM

    def broadcast(self, dims, depth):
        small = tuple(Dim(1) if self.draw(st.booleans()) else d for d in dims)
        stretched = f"broadcast({self.expr(small, depth)[0]})"
        op = self.draw(st.sampled_from(["*", "+"]))
        prec = PRODUCT if op == "*" else SUM
        if self.draw(st.booleans()):  # the full-size operand on the left
            return f"{self.operand(dims, depth, prec)} {op} {stretched}", prec
        return f"{stretched} {op} {self.operand(dims, depth, prec + 1)}", prec

    def softmax(self, dims, depth):
        axis = self.draw(st.integers(0, len(dims) - 1))
        return f"softmax({self.expr(dims, depth)[0]}, axis={axis})", ATOM

    def source(self, results: list[tuple[str, tuple[Dim, ...]]]) -> str:
        # A dim name that only appears inside a sum (S+1) must still be bound: add a parameter for it.
        bound = {d.symbol for _, ds in self.params for d in ds if d.symbol}
        used = {n for _, ds in self.params for d in ds for n in d.names} | {n for _, ds in results for d in ds for n in d.names}
        for name in sorted(used - bound):
            self.params.append((f"dim_{name}", (Dim.of(name),)))
        ty = lambda ds: f"tensor<{self.dtype}, [{', '.join(map(str, ds))}], @host>"
        params = ",\n  ".join(f"{n}: {ty(ds)}" for n, ds in self.params)
        lets = "".join(f"  let {n} = {text};\n" for n, text, _ in self.lets)
        return (f"let f = fn(\n  {params}\n) -> ({', '.join(ty(ds) for _, ds in results)}) {{\n"
                f"{lets}  ({', '.join(text for text, _ in results)})\n}}\n")


@st.composite
def programs(draw, dtypes=FLOATS + INTS, max_depth=3):
    """(source, result shapes, exact, dtype, the generator) for one random well-typed function."""
    dtype = draw(st.sampled_from(dtypes))
    gen = ProgramGen(draw, dtype)
    results = []
    for _ in range(draw(st.integers(1, 2))):
        dims = gen.shape(draw(st.integers(0 if dtype in INTS else 1, 3)))
        results.append((gen.expr(dims, draw(st.integers(1, max_depth)))[0], dims))
    return gen.source(results), [d for _, d in results], gen.exact or dtype in INTS, dtype, gen


def random_args(program, sizes: dict[str, int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    args = []
    for _, t in program.functions[0].sig.params:
        shape = tuple(d.evaluate(sizes) for d in t.dims)
        values = rng.standard_normal(shape) if t.dtype in FLOATS else rng.integers(-8, 8, shape)
        args.append(values.astype(numpy_dtype(t.dtype)))
    return args



SIZES = st.fixed_dictionaries({s: st.integers(0, 3) for s in SYMBOLS})


@FRONT_END
@given(programs(), SIZES, st.integers(0, 2**32 - 1))
def test_random_programs_check_and_interpret(prog, sizes, seed):
    source, shapes, _, dtype, _ = prog
    program = check.check(syntax.parse(source, "<fuzz>"))
    sig = program.functions[0].sig
    assert [t.dims for t in sig.results] == shapes and all(t.dtype == dtype for t in sig.results)
    results = kina.interpret(program).f(*random_args(program, sizes, seed))
    assert [r.shape for r in results] == [tuple(d.evaluate(sizes) for d in s) for s in shapes]


@COMPILED
@given(programs(max_depth=2), SIZES, st.integers(0, 2**32 - 1))
def test_random_programs_compile_and_agree_with_the_interpreter(prog, sizes, seed):
    source, _, exact, dtype, _ = prog
    program = check.check(syntax.parse(source, "<fuzz>"))
    args = random_args(program, sizes, seed)
    want = kina.interpret(program).f(*args)
    got = kina.compile_source(source, "<fuzz>").f(*args)
    tol = {"F32": (1e-4, 1e-5), "F64": (1e-10, 1e-12)}.get(dtype, (0, 0))
    for i, (g, w) in enumerate(zip(got, want)):
        if exact:
            assert_same(g, w, what=f"result {i}\n{source}")
        else:
            assert_same(g, w, *tol, what=f"result {i}\n{source}")


def test_the_generator_covers_every_operation():
    # The properties above mean little if the generator never emits an operation.
    features = {"concat": "concat[", "matmul": " @ ", "mul": " * ", "add": " + ", "broadcast": "broadcast(",
                "softmax": "softmax(", "let": "  let ", "compound dim": "S+1", "zero dim": "[0,", "I32": "<I32",
                "F64": "<F64", "parentheses": "= ("}
    seen = set()

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(programs())
    def collect(prog):
        seen.update(name for name, text in features.items() if text in prog[0])
    collect()
    assert seen == set(features), set(features) - seen


# -- mutations of valid programs ---------------------------------------------------------------

TOKEN = re.compile(r"//[^\n]*|[A-Za-z_]\w*|\d+|->|\s+|.", re.S)
VOCAB = ["let", "fn", "tensor", "concat", "softmax", "broadcast", "axis", "F32", "I32", "BF16", "F8", "host",
         "device", "@", "(", ")", "[", "]", "{", "}", "<", ">", ",", ";", "=", "+", "*", "->", ":", "0", "1",
         "99999999999999999999", "S", "S+1", "x", "p0", "//", "\n", " ", "((((", "-"]


@st.composite
def mutants(draw):
    base = draw(st.one_of(st.sampled_from([(EXAMPLES / "storylm0_kv_step.kina").read_text(),
                                           (EXAMPLES / "storylm0_kv_step_dyn.kina").read_text()]),
                          programs().map(lambda p: p[0])))
    tokens = TOKEN.findall(base)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(tokens) - 1))
        kind = draw(st.sampled_from(["delete", "swap", "insert", "replace", "duplicate"]))
        if kind == "delete" and len(tokens) > 1:
            del tokens[i]
        elif kind == "swap":
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif kind == "insert":
            tokens.insert(i, draw(st.sampled_from(VOCAB)))
        elif kind == "replace":
            tokens[i] = draw(st.sampled_from(VOCAB))
        else:
            tokens.insert(i, tokens[i])
    data = "".join(tokens).encode()
    if draw(st.integers(0, 3)) == 0:  # and sometimes raw bytes
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.binary(min_size=1, max_size=4)) + data[i + draw(st.integers(0, 2)):]
    return data


@contextmanager
def alarm(seconds: int):
    def hang(*_):
        raise TimeoutError(f"no answer within {seconds} s: a hang")
    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@FRONT_END
@given(mutants())
def test_mutated_programs_give_a_diagnostic_or_success(data):
    with alarm(20):
        try:
            build = run_stages(data, "mutant.kina", until="mlir")
        except KinaError as e:
            text = e.render()
            assert text.startswith("mutant.kina:") and ": error: " in text.splitlines()[0]
        else:  # it lowered: one func.func per checked function, and MLIR that verifies and reparses
            from mlir import ir
            funcs = [op for op in build.module.body.operations if op.operation.name == "func.func"]
            names = [f.operation.attributes["sym_name"].value.removeprefix("kina_") for f in funcs]
            assert names == [fn.name for fn in build.program.functions]
            assert build.module.operation.verify()
            text = str(build.module)
            assert str(ir.Module.parse(text, context=build.module.context)) == text


@FRONT_END
@given(st.binary(max_size=200))
def test_random_bytes_give_a_diagnostic_or_success(data):
    with alarm(20):
        try:
            check.check(syntax.parse(data, "bytes.kina"))
        except KinaError as e:
            assert e.render().startswith("bytes.kina:")
