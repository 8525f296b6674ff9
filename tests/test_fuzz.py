"""Property-based tests (hypothesis): random programs and random damage to them.

1. Random well-typed programs over every operation (concat, transpose, reshape,
   slice, @ with broadcast batch dims, + - * / and maximum with broadcast and numbers, unary
   minus, exp, sqrt, rsqrt, sigmoid, sum, max, mean and softmax), with random shapes
   (static, 0, and symbolic dims such as S, T, S+1) and every dtype (F16, BF16, F32,
   F64; I32 and I64 where the op allows integers), pass the checker with the types the generator
   meant, and compiled code agrees with the NumPy interpreter: bit for bit for
   integers and for float programs that only move data (concat, transpose, reshape,
   slice, negation), within a tolerance where floating-point arithmetic may be
   reassociated. Divisors and square roots are kept away from 0 and negatives
   (a number, exp(x), x * x + 1), so that a rounding difference cannot turn into
   an infinity or a NaN on one side only.
2. Random mutations of valid programs (tokens deleted, swapped, duplicated or
   inserted; random bytes) end in either a KinaError or success through the first
   three stages (parse, check, lower to MLIR): never another exception, and never
   a hang (each example runs under an alarm).

The normal suite runs few examples (compiling one costs ~0.3 s). Set
KINA_FUZZ_EXAMPLES=N to scale up (`make fuzz` uses 5000): N front-end examples
per property and N/100 compiled ones per dtype.
"""
from __future__ import annotations

import re
import signal
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kina
from conftest import EXAMPLES, assert_same
from kina import KinaError, knobs
from kina.frontend import check
from kina.frontend import syntax
from kina.driver.pipeline import run_stages
from kina.runtime import numpy_dtype
from kina.frontend.types import Dim

SCALE = knobs.get("KINA_FUZZ_EXAMPLES")
FRONT_END = settings(max_examples=SCALE or 60, deadline=None, derandomize=not SCALE,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COMPILED = settings(max_examples=max(SCALE // 100, 4), deadline=None, derandomize=not SCALE,  # per dtype
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

FLOATS, INTS = ("F16", "BF16", "F32", "F64"), ("I32", "I64")
HALF = ("F16", "BF16")  # round after every op: compared relative to the result's largest value
SYMBOLS = ("S", "T")
SUM, PRODUCT, UNARY, ATOM = 0, 1, 2, 3  # precedence of a generated expression, to parenthesise only when needed
NUMBERS = {"F": ["2", "0.5", "1e-3", "3.25", "-1.5"], "I": ["2", "3", "-1", "0"]}  # literals, by dtype kind
EXACT = {"concat", "transpose", "reshape", "slice", "neg", "maximum"}  # operations that only move, negate or pick data


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
        self.exact = True  # only EXACT operations so far: results must match bit for bit
        self.ops: set[str] = set()  # every operation generated (for the coverage test)

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
            ops += ["mul", "add", "sub", "maximum", "broadcast", "number", "neg", "reshape"] + ["transpose"] * (len(dims) >= 1)
            if any(d.is_static or (d.const > 0 and d.terms) for d in dims):
                ops.append("concat")
            if any(d.is_static for d in dims):
                ops.append("slice")
            if Dim(1) in dims:
                ops += ["reduce"] * 3
            if self.dtype in FLOATS:
                ops += ["div", "unary", "unary"] + ["softmax"] * (len(dims) >= 1) + ["matmul"] * (len(dims) >= 2)
        op = self.draw(st.sampled_from(ops))
        if op == "leaf":
            return self.leaf(dims)
        text, prec = getattr(self, op)(dims, depth - 1)
        self.ops.add(op)
        if op not in EXACT:
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
        """Batch dims broadcast as np.matmul's: each is on both sides, or one side has 1
        there, and one side may lack a few leading ones altogether."""
        k = self.dim()
        batch = dims[:-2]
        where = [self.draw(st.sampled_from(["lhs", "rhs", "both"])) for _ in batch]  # "lhs": only the lhs has it
        lhs_b = [d if w != "rhs" else Dim(1) for d, w in zip(batch, where)]
        rhs_b = [d if w != "lhs" else Dim(1) for d, w in zip(batch, where)]
        side = self.draw(st.sampled_from([lhs_b, rhs_b]))  # one side may lack leading 1s; the other sets the rank
        while side and side[0] == Dim(1) and self.draw(st.booleans()):
            side.pop(0)
        if lhs_b != rhs_b:
            self.ops.add("broadcast matmul")
        lhs = self.operand((*lhs_b, dims[-2], k), depth, PRODUCT)
        rhs = self.operand((*rhs_b, k, dims[-1]), depth, UNARY)
        return f"{lhs} @ {rhs}", PRODUCT

    def mul(self, dims, depth):
        return f"{self.operand(dims, depth, PRODUCT)} * {self.operand(dims, depth, UNARY)}", PRODUCT

    def add(self, dims, depth):
        return f"{self.operand(dims, depth, SUM)} + {self.operand(dims, depth, PRODUCT)}", SUM

    def sub(self, dims, depth):
        return f"{self.operand(dims, depth, SUM)} - {self.operand(dims, depth, PRODUCT)}", SUM

    def maximum(self, dims, depth):
        """Of two tensors, or of a tensor and a number or a broadcast one, either way round."""
        other = self.draw(st.sampled_from(["tensor", "number", "broadcast"]))
        if other == "number":
            y = self.draw(st.sampled_from(NUMBERS["F" if self.dtype in FLOATS else "I"]))
        elif other == "broadcast":
            y = f"broadcast({self.expr(tuple(Dim(1) if self.draw(st.booleans()) else d for d in dims), depth)[0]})"
        else:
            y = self.expr(dims, depth)[0]
        x = self.expr(dims, depth)[0]
        if self.draw(st.booleans()):
            x, y = y, x
        return f"maximum({x}, {y})", ATOM

    def div(self, dims, depth):
        """x / d with d a number or exp(y): never 0, so both sides agree on every element."""
        if self.draw(st.booleans()):
            d = self.draw(st.sampled_from([n for n in NUMBERS["F"] if n != "0"]))
        else:
            d = f"exp({self.expr(dims, depth)[0]})"
        return f"{self.operand(dims, depth, PRODUCT)} / {d}", PRODUCT

    def number(self, dims, depth):
        """A number beside a tensor, on either side, under any elementwise operator."""
        n = self.draw(st.sampled_from(NUMBERS["F" if self.dtype in FLOATS else "I"]))
        op = self.draw(st.sampled_from(["+", "-", "*"]))
        prec = SUM if op in "+-" else PRODUCT
        if self.draw(st.booleans()):
            return f"{self.operand(dims, depth, prec)} {op} {n}", prec
        return f"{n} {op} {self.operand(dims, depth, prec + 1)}", prec

    def neg(self, dims, depth):
        return f"-{self.operand(dims, depth, UNARY)}", UNARY

    def unary(self, dims, depth):
        """exp and sigmoid of anything; sqrt and rsqrt of x * x + 1 (never negative or 0)."""
        fn = self.draw(st.sampled_from(["exp", "sigmoid", "sqrt", "rsqrt"]))
        x = self.expr(dims, depth)[0] if fn in ("exp", "sigmoid") else \
            (lambda t: f"{t} * {t} + 1")(self.operand(dims, depth, UNARY))
        self.ops.add(fn)
        return f"{fn}({x})", ATOM

    def reduce(self, dims, depth):
        """A reduction over an axis where the target has 1, from any size there (0 too)."""
        axis = self.draw(st.sampled_from([a for a, d in enumerate(dims) if d == Dim(1)]))
        fn = self.draw(st.sampled_from(["sum", "max"] + ["mean"] * (self.dtype in FLOATS)))
        wide = dims[:axis] + (self.dim(),) + dims[axis + 1:]
        self.ops.add(fn)
        return f"{fn}({self.expr(wide, depth)[0]}, axis={axis})", ATOM

    def transpose(self, dims, depth):
        perm = self.draw(st.permutations(range(len(dims))))
        src = [None] * len(dims)
        for i, p in enumerate(perm):  # dim i of the result is dim perm[i] of the operand
            src[p] = dims[i]
        return f"transpose[perm=[{', '.join(map(str, perm))}]] {self.operand(tuple(src), depth, ATOM)}", ATOM

    def reshape(self, dims, depth):
        """From an operand with the same symbolic dims in order and the same static product:
        the target with static dims split or merged and unit dims added or removed."""
        src = list(dims)
        for _ in range(self.draw(st.integers(1, 2))):
            kind = self.draw(st.sampled_from(["split", "merge", "unit", "drop"]))
            static = [i for i, d in enumerate(src) if d.is_static]
            if kind == "split" and static:
                i = self.draw(st.sampled_from(static))
                c = src[i].const
                a = self.draw(st.sampled_from([f for f in range(1, c + 1) if c % f == 0] or [0]))
                src[i:i + 1] = [Dim(a), Dim(c // a if a else self.draw(st.integers(0, 3)))]
            elif kind == "merge" and any(i + 1 in static for i in static):
                i = self.draw(st.sampled_from([i for i in static if i + 1 in static]))
                src[i:i + 2] = [Dim(src[i].const * src[i + 1].const)]
            elif kind == "unit":
                src.insert(self.draw(st.integers(0, len(src))), Dim(1))
            elif kind == "drop" and Dim(1) in src:
                src.remove(Dim(1))
        return f"reshape[dims=[{', '.join(map(str, dims))}]] {self.operand(tuple(src), depth, ATOM)}", ATOM

    def slice(self, dims, depth):
        """The target's static dim n at axis, from a larger dim (static or symbolic) at start."""
        axis = self.draw(st.sampled_from([a for a, d in enumerate(dims) if d.is_static]))
        extra = self.draw(st.integers(0, 2))
        start = self.draw(st.integers(0, extra))
        whole = self.draw(st.sampled_from([Dim(0), Dim.of("S"), Dim.of("T")])) + (dims[axis].const + extra)
        src = dims[:axis] + (whole,) + dims[axis + 1:]
        return f"slice[axis={axis}, start={start}, size={dims[axis].const}] {self.operand(src, depth, ATOM)}", ATOM

    def broadcast(self, dims, depth):
        small = tuple(Dim(1) if self.draw(st.booleans()) else d for d in dims)
        stretched = f"broadcast({self.expr(small, depth)[0]})"
        op = self.draw(st.sampled_from(["*", "+", "-"]))
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


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_random_programs_compile_and_agree_with_the_interpreter(dtype):
    """Each dtype gets its own examples, so the compiled fuzz covers all of them."""
    @COMPILED
    @given(programs(dtypes=(dtype,), max_depth=2), SIZES, st.integers(0, 2**32 - 1))
    def run(prog, sizes, seed):
        compare_compiled(prog, sizes, seed)
    run()


def compare_compiled(prog, sizes, seed):
    source, _, exact, dtype, _ = prog
    program = check.check(syntax.parse(source, "<fuzz>"))
    args = random_args(program, sizes, seed)
    want = kina.interpret(program).f(*args)
    got = kina.compile_source(source, "<fuzz>").f(*args)
    tol = {"F32": (1e-4, 1e-5), "F64": (1e-10, 1e-12), "F16": (2e-2, 2e-2), "BF16": (8e-2, 8e-2)}.get(dtype, (0, 0))
    for i, (g, w) in enumerate(zip(got, want)):
        if exact:
            assert_same(g, w, what=f"result {i}\n{source}")
        elif dtype in HALF:
            # each op rounds to 11 (F16) or 8 (BF16) bits, and the two sides sum and take exp in
            # different orders in F32 before rounding: a rounding apart early may move a later
            # value by a few units of the result's scale, so the bound is relative to its largest value
            finite = np.abs(w.astype(np.float32))[np.isfinite(w.astype(np.float32))]
            scale = max(1.0, float(finite.max())) if finite.size else 1.0
            assert_same(g.astype(np.float32), w.astype(np.float32), tol[0], tol[1] * scale, what=f"result {i}\n{source}")
        else:
            assert_same(g, w, *tol, what=f"result {i}\n{source}")


def test_the_generator_covers_every_operation():
    # The properties above mean little if the generator never emits an operation.
    features = {"concat": "concat[", "matmul": " @ ", "mul": " * ", "add": " + ", "broadcast": "broadcast(",
                "softmax": "softmax(", "let": "  let ", "compound dim": "S+1", "zero dim": "[0,", "I32": "<I32",
                "F64": "<F64", "F16": "<F16", "BF16": "<BF16", "parentheses": "= (", "sub": " - ", "div": " / ", "float number": "0.5",
                "negative number": "-1", "neg": "-p", "transpose": "transpose[", "reshape": "reshape[",
                "slice": "slice[", "maximum": "maximum("}
    ops = {"broadcast matmul", "exp", "sigmoid", "sqrt", "rsqrt", "sum", "max", "mean"}
    seen = set()

    @settings(max_examples=600, deadline=None, derandomize=True)
    @given(programs())
    def collect(prog):
        seen.update(name for name, text in features.items() if text in prog[0])
        seen.update(prog[4].ops & ops)
    collect()
    assert seen == set(features) | ops, (set(features) | ops) - seen


# -- mutations of valid programs ---------------------------------------------------------------

TOKEN = re.compile(r"//[^\n]*|[A-Za-z_]\w*|\d+|->|\s+|.", re.S)
VOCAB = ["let", "fn", "tensor", "concat", "softmax", "broadcast", "axis", "F32", "I32", "BF16", "F8", "host",
         "device", "@", "(", ")", "[", "]", "{", "}", "<", ">", ",", ";", "=", "+", "*", "->", ":", "0", "1",
         "99999999999999999999", "S", "S+1", "x", "p0", "//", "\n", " ", "((((", "-", "/", "0.5", "1e-6", "1e999",
         "transpose", "reshape", "slice", "perm", "dims", "start", "size", "[0, 1]", "exp", "sqrt", "rsqrt",
         "sigmoid", "maximum", "sum", "max", "mean"]


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
