"""Hypothesis over the surfaces a user reaches with odd values: op attributes, number
literals, and generic specialisations.

Each property writes a program (or a specialisation) from random values, valid or
not, and runs it through the front end and the lowering to the reference IR. The
only allowed outcomes are success or a user error (a located `KinaError`, or the
`ValueError`/`TypeError` that names a bad argument); anything else — an internal
error, another exception, a hang — fails the test. `KINA_FUZZ_EXAMPLES=N` scales the
example counts (`make fuzz`).
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings, strategies as st

from kina import KinaError
from kina.driver.pipeline import Options, run_stages

SCALE = int(os.environ.get("KINA_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=SCALE or 80, deadline=None, derandomize=not SCALE,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DTYPES = ("F16", "BF16", "F32", "F64", "I32", "I64")


def front_end(source: str, **spec) -> None:
    """Parse, check and lower `source`; a user error is fine, anything else propagates."""
    options = Options(dtypes=tuple(spec.get("dtypes", {}).items()), dims=tuple(spec.get("dims", {}).items()))
    try:
        run_stages(source, "fuzz.kina", "mlir", options)
    except KinaError as e:
        assert e.render().startswith("fuzz.kina:"), e.render()
    except (ValueError, TypeError) as e:  # a bad specialisation argument, named
        assert spec, f"{type(e).__name__} from a plain program: {e}"
        assert "dtypes" in str(e) or "dims" in str(e), e


def program(dtype: str, shape: str, body: str) -> str:
    return (f"let f = fn(x: tensor<{dtype}, [{shape}], @host>) -> (tensor<{dtype}, [{shape}], @host>) {{\n"
            f"  let y = {body};\n  (y)\n}}\n")


def result_free(dtype: str, shape: str, expr: str, result_shape: str) -> str:
    return (f"let f = fn(x: tensor<{dtype}, [{shape}], @host>) -> (tensor<{dtype}, [{result_shape}], @host>) {{\n"
            f"  let y = {expr};\n  (y)\n}}\n")


dims = st.lists(st.sampled_from(["0", "1", "2", "3", "4", "6", "S", "T", "S+1", "2+S", "99999999999"]),
                min_size=0, max_size=5)
ints = st.one_of(st.integers(0, 8), st.integers(0, 10**30))
dtype = st.sampled_from(DTYPES + ("F8", "f32", "T"))


@FUZZ
@given(dtype, dims, st.lists(ints, max_size=6))
def test_transpose_permutations(dt, shape, perm):
    s = ", ".join(shape)
    front_end(result_free(dt, s, f"transpose[perm=[{', '.join(map(str, perm or [0]))}]] x",
                          ", ".join(shape[p] if p < len(shape) else "1" for p in perm or [0])))


@FUZZ
@given(dtype, dims, dims)
def test_reshape_dims(dt, shape, new):
    front_end(result_free(dt, ", ".join(shape), f"reshape[dims=[{', '.join(new)}]] x", ", ".join(new)))


@FUZZ
@given(dtype, dims, ints, ints, ints)
def test_slice_bounds(dt, shape, axis, start, size):
    result = list(shape)
    if axis < len(result):
        result[axis] = str(size)
    front_end(result_free(dt, ", ".join(shape), f"slice[axis={axis}, start={start}, size={size}] x",
                          ", ".join(result)))


@FUZZ
@given(dtype, dims, ints, st.sampled_from(["softmax", "sum", "max", "mean"]))
def test_axes(dt, shape, axis, op):
    result = ["1" if i == axis and op != "softmax" else d for i, d in enumerate(shape)]
    front_end(result_free(dt, ", ".join(shape), f"{op}(x, axis={axis})", ", ".join(result)))


@FUZZ
@given(dtype, dims, ints)
def test_concat_axes(dt, shape, axis):
    front_end(result_free(dt, ", ".join(shape), f"concat[axis={axis}] x x", ", ".join(shape)))


digits = st.text("0123456789", min_size=1, max_size=400)
literal = st.one_of(
    digits,
    st.builds(lambda a, b: f"{a}.{b}", digits, digits),
    st.builds(lambda a, e, s, x: f"{a}{e}{s}{x}", digits, st.sampled_from("eE"), st.sampled_from(["", "+", "-"]),
              st.text("0123456789", min_size=1, max_size=12)),
    st.sampled_from(["0", "0.0", "1e-45", "1e-46", "3.4e38", "3.5e38", "65504", "65520", "1e308", "1e309",
                     "2147483647", "2147483648", "9223372036854775807", "9223372036854775808", "1e-400"]),
)


@FUZZ
@given(st.sampled_from(DTYPES), literal, st.sampled_from(["+", "-", "*", "/"]), st.booleans(), st.booleans())
def test_number_literals_of_every_length_and_form(dt, text, op, left, negative):
    number = f"-{text}" if negative else text
    body = f"{number} {op} x" if left else f"x {op} {number}"
    front_end(program(dt, "2, 3", body))


@FUZZ
@given(st.dictionaries(st.sampled_from(["T", "U", "S", "x", ""]), st.one_of(st.sampled_from(DTYPES + ("f32", "")),
                                                                            st.integers(-3, 3), st.none()),
                       max_size=3),
       st.dictionaries(st.sampled_from(["S", "T", "B", "Q", ""]), st.one_of(st.integers(-2, 10**20), st.text(max_size=3),
                                                                            st.floats(allow_nan=True), st.booleans()),
                       max_size=3))
def test_generic_specialisations(dtypes, dims_):
    source = ("let f = fn[T](x: tensor<T, [B, S], @host>, y: tensor<T, [B, S], @host>) -> (tensor<T, [B, S+S], @host>) {\n"
              "  let z = concat[axis=1] x y;\n  let w = z * z;\n  (w)\n}\n")
    front_end(source, dtypes=dtypes, dims=dims_)
