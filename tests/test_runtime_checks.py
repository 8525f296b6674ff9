"""Calls into a compiled module: every bad call is a clear TypeError or ValueError, every odd
but valid one (read-only, non-contiguous, unaligned, NaN, Inf) gives the right answer, and a
.so that cannot be trusted (sidecar missing, mismatched or corrupt) or a closed module is
refused with an error rather than a segfault. The NumPy interpreter runs the same checks
(the same code, runtime.bind: its test checks it is wired in, not a second opinion).
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import kina
from conftest import EXAMPLES, assert_same, kv_inputs
from kina.driver.cache import build_so
from kina.runtime import LoadError, load

SOURCE = """
let f = fn(a: tensor<F32, [2, 3], @host>, b: tensor<F32, [3, S], @host>, c: tensor<F32, [2, S], @host>)
  -> (tensor<F32, [2, S], @host>, tensor<F32, [2, S], @host>, tensor<F32, [2, 6], @host>) {
  let m = a @ b;
  (m + c, softmax(m, axis=1), concat[axis=1] a a)
}
"""


@pytest.fixture(scope="module")
def so(tmp_path_factory):
    """A private copy of the built .so and its sidecar (tests below damage copies of them)."""
    built = build_so(SOURCE, "rt.kina")
    folder = tmp_path_factory.mktemp("rt")
    for p in (built, built.with_suffix(".json")):
        shutil.copy(p, folder / p.name)
    return folder / built.name


@pytest.fixture(scope="module")
def mod(so):
    with load(so) as m:
        yield m


@pytest.fixture(scope="module")
def ref():
    return kina.interpret(SOURCE, "rt.kina")


def args(S=4, seed=0, dtype=np.float32):
    r = np.random.default_rng(seed)
    return [r.standard_normal(s).astype(dtype) for s in [(2, 3), (3, S), (2, S)]]


def agree(mod, ref, *inputs):
    got, want = mod.f(*inputs), ref.f(*inputs)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, *((0, 0) if i == 2 else (1e-5, 1e-6)), what=f"result {i}")
    return got


# -- bad calls: the same clear error from the compiled module and from the interpreter ---------

A, B, C = args()
BAD_CALLS = [
    ((A, B), TypeError, r"^f\(\) takes 3 arguments \(a, b, c\), got 2$"),
    ((A, B, C, C), TypeError, r"^f\(\) takes 3 arguments \(a, b, c\), got 4$"),
    ((), TypeError, r"^f\(\) takes 3 arguments"),
    ((A, B, None), TypeError, r"^f\(\): parameter 'c' expects an array of float32 with shape \[2, S\] \(NumPy, "
                              r"DLPack, the array interface or a nested list\), got NoneType$"),
    ((A, B, "ab"), TypeError, r"parameter 'c' expects an array of float32 .* got str$"),
    ((A, 1.5, C), ValueError, r"^f\(\): parameter 'b' expects rank 2 \[3, S\], got rank 0 with shape \[\]$"),
    ((A.tolist()[:1], B, C), ValueError, r"parameter 'a' expects shape \[2, 3\], got \[1, 3\] \(dim 0 is 1"),
    (([[1, 2, 3], [4, 5]], B, C), ValueError, r"^f\(\): parameter 'a' got a list that is not a regular nest of numbers"),
    ((A, B, [["x"] * 4] * 2), TypeError, r"^f\(\): parameter 'c' expects numbers for float32 \(F32\), got a list "
                                          r"that NumPy reads as <U1$"),
    ((A.astype(np.float64), B, C), TypeError, r"^f\(\): parameter 'a' expects dtype float32 \(F32\), got float64$"),
    ((A, B.astype(np.int32), C), TypeError, r"parameter 'b' expects dtype float32 \(F32\), got int32$"),
    ((A[0], B, C), ValueError, r"^f\(\): parameter 'a' expects rank 2 \[2, 3\], got rank 1 with shape \[3\]$"),
    ((A[None], B, C), ValueError, r"parameter 'a' expects rank 2 \[2, 3\], got rank 3"),
    ((A.T.copy(), B, C), ValueError, r"parameter 'a' expects shape \[2, 3\], got \[3, 2\] \(dim 0 is 3, expected 2\)$"),
    ((A, B, args(S=5)[2]), ValueError, r"^f\(\): dim S is 4 from b but 5 from c \(dim 1\)$"),
]


@pytest.mark.parametrize("call,error,message", BAD_CALLS)
def test_bad_call_is_a_clear_error(mod, call, error, message):
    """The compiled call refuses with the expected message, and so does call_into before the
    kernel runs: results it was handed stay as they were."""
    with pytest.raises(error, match=message):
        mod.f(*call)
    outs = [np.full((2, 4), 7.0, np.float32), np.full((2, 4), 7.0, np.float32), np.full((2, 6), 7.0, np.float32)]
    with pytest.raises(error, match=message):
        mod.f.call_into(list(call), outs)
    assert all((o == 7.0).all() for o in outs), "call_into wrote its results before refusing the call"
    assert_same(mod.f(*args())[2], np.concatenate([A, A], axis=1), 0, 0, what="a good call after it")


@pytest.mark.parametrize("call,error,message", BAD_CALLS)
def test_interpreter_refuses_bad_calls_alike(ref, call, error, message):
    """kina.interpret checks its arguments with the runtime's own checker (runtime.bind), so
    this is not a second opinion on the messages above: it checks that the interpreter
    checks at all, against the same expected messages."""
    with pytest.raises(error, match=message):
        ref.f(*call)


# -- odd but valid arrays give correct results -------------------------------------------------

def test_read_only_inputs(mod, ref):
    inputs = args()
    for a in inputs:
        a.setflags(write=False)
    agree(mod, ref, *inputs)


def test_non_contiguous_inputs(mod, ref):
    a, b, c = args(S=5, seed=1)
    views = [
        np.asfortranarray(a),                        # column-major
        np.ascontiguousarray(b[:, ::-1])[:, ::-1],   # negative strides
        np.repeat(c, 3, axis=1)[:, ::3],             # strided inner dim
    ]
    assert not any(v.flags.c_contiguous for v in views[1:])
    got = agree(mod, ref, *views)
    for g, w in zip(got, mod.f(a, b, c)):
        np.testing.assert_array_equal(g, w)
    assert all(g.flags.c_contiguous and g.flags.writeable for g in got)


def test_broadcast_and_unaligned_inputs(mod, ref):
    a, b, c = args(S=3, seed=2)
    stretched = np.broadcast_to(c[:1], c.shape)  # stride 0 on the outer dim, read-only
    raw = np.zeros(a.size * 4 + 1, np.uint8)
    unaligned = raw[1:].view(np.float32).reshape(a.shape)
    unaligned[...] = a
    assert not unaligned.flags.aligned
    got = agree(mod, ref, unaligned, b, stretched)
    np.testing.assert_array_equal(got[2], np.concatenate([a, a], axis=1))


def test_inputs_are_not_modified(mod):
    inputs = args(seed=3)
    copies = [x.copy() for x in inputs]
    mod.f(*inputs)
    for x, y in zip(inputs, copies):
        np.testing.assert_array_equal(x, y)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # the reference treats NaN as a value, silently
def test_nan_and_inf_propagate_as_in_numpy(mod, ref):
    a, b, c = args(S=4, seed=4)
    a[0, 0] = np.nan                          # row 0 of a @ b is all NaN
    c[1, 1], c[1, 2] = np.inf, -np.inf        # inf in the sum
    b[:, 3] = 0
    a[1, :] = [np.inf, 1, 1]                  # row 1: inf * 0 is NaN in column 3
    got = agree(mod, ref, a, b, c)
    assert np.isnan(got[0][0]).all() and np.isnan(got[1][0]).all()
    assert np.isnan(got[0][1, 3]) and np.isnan(got[1][1]).all()  # one NaN poisons its softmax row
    assert np.isnan(got[2][0, 0]) and np.isinf(got[2][1, 0])
    # softmax of a row holding +inf and finite values: the max subtracted first gives NaN at inf-inf
    x = np.array([[np.inf, 1.0, 2.0, -np.inf]] * 2, np.float32)
    sm = kina.compile_source("let g = fn(x: tensor<F32, [2, 4], @host>) -> (tensor<F32, [2, 4], @host>) {\n"
                             "  (softmax(x, axis=1))\n}\n", "inf.kina").g(x)[0]
    assert_same(sm, kina.interpret("let g = fn(x: tensor<F32, [2, 4], @host>) -> (tensor<F32, [2, 4], @host>) {\n"
                                   "  (softmax(x, axis=1))\n}\n").g(x)[0])


# -- a .so that cannot be trusted is refused when it is loaded -----------------------------------

def copy_build(so, tmp_path):
    for p in (so, so.with_suffix(".json")):
        shutil.copy(p, tmp_path / p.name)
    return tmp_path / so.name


def test_missing_sidecar(so, tmp_path):
    path = copy_build(so, tmp_path)
    path.with_suffix(".json").unlink()
    with pytest.raises(LoadError, match=r"its sidecar rt.json is missing; rebuild with kinac"):
        load(path)


def test_missing_so(tmp_path):
    with pytest.raises(LoadError, match="no such shared object"):
        load(tmp_path / "nothing.so")


def test_sidecar_of_another_build(so, tmp_path):
    path = copy_build(so, tmp_path)
    other = build_so(SOURCE.replace("concat[axis=1] a a", "concat[axis=1] a (a + a)"), "rt.kina")
    shutil.copy(other.with_suffix(".json"), path.with_suffix(".json"))
    with pytest.raises(LoadError, match=r"rt.json does not match rt.so: it describes another build"):
        load(path)


def test_so_changed_after_build(so, tmp_path):
    path = copy_build(so, tmp_path)
    with open(path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(LoadError, match="does not match"):
        load(path)


@pytest.mark.parametrize("damage", [
    lambda text: text[: len(text) // 2],                                   # truncated JSON
    lambda text: text.replace('"kina-sidecar-1"', '"kina-sidecar-0"'),    # unknown format
    lambda text: text.replace('"dims"', '"shape"'),                        # missing field
    lambda text: text.replace('"S"', '"S+"', 1),                            # a dim that does not parse
])
def test_corrupt_sidecar(so, tmp_path, damage):
    path = copy_build(so, tmp_path)
    sidecar = path.with_suffix(".json")
    damaged = damage(sidecar.read_text())
    assert damaged != sidecar.read_text()
    sidecar.write_text(damaged)
    with pytest.raises(LoadError, match="not a valid kina sidecar"):
        load(path)


def test_sidecar_naming_a_function_the_so_lacks(so, tmp_path):
    path = copy_build(so, tmp_path)
    sidecar = json.loads(path.with_suffix(".json").read_text())
    sidecar["functions"][0]["name"] = "g"
    path.with_suffix(".json").write_text(json.dumps(sidecar))
    with pytest.raises(LoadError, match="sidecar lists function 'g' but the .so has no _mlir_ciface_kina_g"):
        load(path)


# -- a closed module refuses calls ---------------------------------------------------------------

def test_call_after_close(so, tmp_path):
    m = load(copy_build(so, tmp_path))
    f = m.f
    assert f(*args())[0].shape == (2, 4)
    m.close()
    m.close()  # closing twice is harmless
    for call in (f, m.f):
        with pytest.raises(ValueError, match=r"^f\(\): the module rt.so is closed$"):
            call(*args())


def test_with_block_closes(so, tmp_path):
    with load(copy_build(so, tmp_path)) as m:
        f = m.f
        f(*args())
    with pytest.raises(ValueError, match="is closed"):
        f(*args())


def test_unknown_function_is_an_attribute_error(mod, ref):
    with pytest.raises(AttributeError, match=r"has no function 'g' \(it has: f\)"):
        mod.g
    with pytest.raises(AttributeError, match=r"has no function 'g' \(it has: f\)"):
        ref.g


def test_so_built_for_a_cpu_with_more_instructions_is_refused(so, tmp_path):
    path = copy_build(so, tmp_path)
    sidecar = json.loads(path.with_suffix(".json").read_text())
    sidecar["cpu_flags"] = sorted(set(sidecar["cpu_flags"]) | {"kina_test_isa"})
    path.with_suffix(".json").write_text(json.dumps(sidecar))
    with pytest.raises(LoadError, match=r"uses kina_test_isa, which this CPU lacks; rebuild here, or with --cpu x86-64"):
        load(path)


def test_portable_build_records_no_cpu_flags_and_runs(ref):
    from kina.driver.pipeline import Options
    portable = build_so(SOURCE, "portable.kina", Options(cpu="x86-64"))
    sidecar = json.loads(portable.with_suffix(".json").read_text())
    assert sidecar["cpu"] == "x86-64" and sidecar["cpu_flags"] == []
    with load(portable) as module:
        agree(module, ref, *args(S=5))


def test_intermediates_larger_than_memory_are_refused_before_the_call():
    # a @ b is an N x N intermediate: at N = 2^20 that is 4 TiB, which the compiled
    # code could not allocate (it would write through a null pointer), so the call is refused
    source = """
let f = fn(a: tensor<F32, [N, 1], @host>, b: tensor<F32, [1, N], @host>, c: tensor<F32, [N, 1], @host>)
  -> (tensor<F32, [N, 1], @host>) {
  let big = a @ b;
  (big @ c)
}
"""
    mod = kina.compile_source(source, "big.kina")
    n = 1 << 20
    col, row = np.ones((n, 1), np.float32), np.ones((1, n), np.float32)
    with pytest.raises(ValueError, match=r"f\(\): at N=1048576 its intermediate tensors need 4398050705408 bytes, "
                                         r"more than this machine's \d+ bytes of memory"):
        mod.f(col, row, col)
    small = np.arange(3, dtype=np.float32).reshape(3, 1)
    np.testing.assert_allclose(mod.f(small, small.T, small)[0], (small @ small.T) @ small)


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3", "x86-64-v4"])
def test_level_builds_record_the_level_s_extensions(level):
    from kina.driver.pipeline import Options
    from kina.runtime.cpu import CPU_LEVELS, cpu_flags
    built = build_so(SOURCE, f"{level}.kina", Options(cpu=level))
    sidecar = json.loads(built.with_suffix(".json").read_text())
    assert sidecar["cpu"] == level and set(sidecar["cpu_flags"]) == CPU_LEVELS[level]
    if CPU_LEVELS[level] <= set(cpu_flags()):
        load(built).close()
    else:
        with pytest.raises(LoadError, match="which this CPU lacks"):
            load(built)


def test_results_and_runtime_empty_start_on_a_cache_line():
    """The compiled kernels' fast paths (whole-line loads, non-temporal stores) need it."""
    from kina.runtime import ALIGN, empty, zeros
    mod = kina.compile_file(EXAMPLES / "storylm0_kv_step_dyn.kina")
    for a in mod.kv_step(*kv_inputs(1, 2, 8, 5)):
        assert a.ctypes.data % ALIGN == 0 and a.flags.c_contiguous and a.flags.writeable
    for shape, dtype in [((3,), np.float32), ((2, 3, 5), np.float64), ((1, 1, 1, 1), np.float16), ((), np.float32)]:
        a = empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.ctypes.data % ALIGN == 0
    assert not zeros((4, 5)).any()
    big = zeros((3, 64, 8192))  # a mapped one (MAPPED_MIN)
    assert big.ctypes.data % ALIGN == 0 and big.flags.writeable and not big[:, :, -1].any()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc")
def test_a_large_zeros_costs_only_the_pages_written():
    """A KV cache's Kᵀ [Hk, Dh, T] gets one value per row a position: after 5 positions of 8192,
    192 rows 32 KB apart, 192 small pages (0.75 MB) are resident, not the 6 MB that huge pages
    (which NumPy advises for its arrays of 4 MB and more) would make it."""
    from kina.runtime import zeros

    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    k = zeros((1, 3, 64, 8192))
    before = resident()
    k[..., :5] = 1
    assert resident() - before < 2 << 20


def test_misaligned_rank_0_argument_is_copied_as_rank_0():
    """A misaligned array is copied before the call; a 0-d one must stay 0-d (its memref
    descriptor has no sizes), or every later descriptor would be read from the wrong words."""
    source = ("let f = fn(s: tensor<F32, [], @host>, a: tensor<F32, [2, N], @host>)\n"
              "  -> (tensor<F32, [], @host>, tensor<F32, [2, N], @host>) {\n  (s * s, a + a)\n}\n")
    raw = np.zeros(17, np.uint8)
    s = raw[1:5].view(np.float32).reshape(())
    s[...] = 3
    assert not s.flags.aligned
    a = np.arange(10, dtype=np.float32).reshape(2, 5)
    square, twice = kina.compile_source(source, "rank0.kina").f(s, a)
    assert square.shape == () and square == 9
    np.testing.assert_array_equal(twice, a + a)
