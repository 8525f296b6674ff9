"""Any array in: compiled functions (and the interpreter, which shares `runtime.bind`) take
NumPy arrays, anything that speaks DLPack or the array interface, and nested lists.

Typed arrays are read in place and never converted to another dtype; lists, which have
no dtype, are converted to the parameter's (rounded to nearest for a floating dtype, exact
only for an integer one). The torch and JAX cases are skipped when those are not installed;
the small wrapper classes below speak one protocol each, so the rest runs everywhere.
"""
from __future__ import annotations

import numpy as np
import pytest

import kina
from conftest import EXAMPLES, assert_same, kv_inputs
from kina import runtime
from kina.runtime import calls, prepared

STEP = EXAMPLES / "storylm0_kv_step.kina"
SMALL = """
let f = fn(x: tensor<F32, [2, 3], @host>, n: tensor<I32, [2, 3], @host>, s: tensor<F32, [], @host>)
  -> (tensor<F32, [2, 3], @host>, tensor<I32, [2, 3], @host>, tensor<F32, [], @host>) {
  (x + x, n + n, s * s)
}
"""


@pytest.fixture(scope="module")
def step():
    return kina.compile_file(STEP).kv_step


@pytest.fixture(scope="module")
def ref_step():
    return kina.interpret(STEP.read_text(), str(STEP)).kv_step


@pytest.fixture(scope="module")
def small():
    return kina.compile_source(SMALL, "small.kina").f, kina.interpret(SMALL, "small.kina").f


@pytest.fixture
def pointers(monkeypatch):
    """The data pointer of every buffer handed to the compiled code, one list per call."""
    seen, real = [], calls.descriptor_words

    def spy(arrays):
        arrays = list(arrays)
        seen.append([a.ctypes.data for a in arrays])
        return real(arrays)
    for module in (calls, prepared):  # a call's descriptors, and a prepared call's
        monkeypatch.setattr(module, "descriptor_words", spy)
    return seen


class DLPackOnly:
    """Speaks DLPack and nothing else (a NumPy array exports itself)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class InterfaceOnly:
    """Speaks the array interface (a dict naming the memory) and nothing else."""

    def __init__(self, a):
        self._a, self.__array_interface__ = a, a.__array_interface__


class ArrayMethodOnly:
    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a


class OnDevice:
    """A DLPack object on a device the host cannot read (CUDA device 1): never exported."""

    def __init__(self, device=(2, 1)):
        self.device = device

    def __dlpack__(self, **kwargs):
        raise AssertionError("a tensor on another device must be refused before it is exported")

    def __dlpack_device__(self):
        if isinstance(self.device, Exception):
            raise self.device
        return self.device


def test_objects_speaking_dlpack_or_the_array_interface_give_the_numpy_answers(step, ref_step, pointers):
    xs = kv_inputs(1, 2, 2, 3, seed=1)
    for run in (step, ref_step):
        want = run(*xs)
        for wrap in (DLPackOnly, InterfaceOnly, ArrayMethodOnly):
            for got, w in zip(run(*[wrap(x) for x in xs]), want):
                assert type(got) is np.ndarray
                assert_same(got, w, what=wrap.__name__)
    pointers.clear()
    for wrap in (DLPackOnly, InterfaceOnly):  # both describe the caller's memory: the kernel reads it
        step(*[wrap(x) for x in xs])
        assert pointers[-1][:6] == [x.ctypes.data for x in xs], wrap.__name__


def test_nested_lists_give_the_numpy_answers(step, ref_step):
    xs = kv_inputs(1, 2, 2, 3, seed=2)
    for run in (step, ref_step):
        for got, want in zip(run(*[x.tolist() for x in xs]), run(*xs)):  # float32 values: exact as lists
            assert_same(got, want)


def test_list_conversion_rounds_floats_and_keeps_integers_exact(small):
    x = [[0.1, 0.2, 1 / 3], (1e-50, -0.0, 16777217)]  # a tuple row; 16777217 rounds to 16777216 in F32
    n = [[2.0, -3, True], [0, 2**31 - 1, -2**31]]     # integral floats and bools are exact in I32
    for run in small:
        twice_x, twice_n, square = run(x, n, 1.5)
        assert_same(twice_x, 2 * np.array(x, np.float32))
        assert_same(twice_n, (2 * np.array(n, np.int64)).astype(np.int32))  # I32 adds wrap, as in C
        assert_same(square, np.array(2.25, np.float32))


@pytest.mark.parametrize("call,error,message", [
    (dict(x=[[1e39, 0, 0], [0, 0, 0]]), ValueError,
     r"^f\(\): parameter 'x' expects float32 \(F32\), got a list holding 1e\+39, which float32 cannot represent$"),
    (dict(n=[[2.5, 0, 0], [0, 0, 0]]), ValueError,
     r"^f\(\): parameter 'n' expects int32 \(I32\), got a list holding 2.5, which int32 cannot represent exactly$"),
    (dict(n=[[2**40, 0, 0], [0, 0, 0]]), ValueError, r"parameter 'n' .* holding 1099511627776, which int32 cannot"),
    (dict(n=[[float("nan"), 0, 0], [0, 0, 0]]), ValueError, r"parameter 'n' .* holding nan, which int32 cannot"),
    (dict(x=[[1, 2, 3], [4, 5]]), ValueError, r"^f\(\): parameter 'x' got a list that is not a regular nest"),
    (dict(x=[[None] * 3] * 2), TypeError, r"parameter 'x' expects numbers for float32 \(F32\), .* reads as object$"),
    (dict(s=np.float64(1.5)), TypeError, r"^f\(\): parameter 's' expects dtype float32 \(F32\), got float64$"),
    (dict(s=1 + 2j), TypeError, r"parameter 's' expects an array of float32 with shape \[\] .* got complex$"),
    (dict(x=DLPackOnly(np.zeros((2, 3)))), TypeError, r"^f\(\): parameter 'x' expects dtype float32 \(F32\), got float64$"),
    (dict(n=InterfaceOnly(np.zeros((2, 3), np.int64))), TypeError, r"parameter 'n' expects dtype int32 \(I32\), got int64$"),
    (dict(x=OnDevice()), ValueError,
     r"^f\(\): parameter 'x' is on device cuda:1, but Kina runs on the host: copy it to the CPU first"),
    (dict(x=OnDevice(ValueError("Unknown device type meta for Dlpack"))), ValueError,
     r"parameter 'x' is on a device that DLPack cannot describe \(Unknown device type meta for Dlpack\)"),
])
def test_bad_array_arguments_are_clear_errors(small, call, error, message):
    args = dict(x=np.zeros((2, 3), np.float32), n=np.zeros((2, 3), np.int32), s=np.float32(1))
    args.update(call)
    for run in small:
        with pytest.raises(error, match=message):
            run(*args.values())


def test_call_into_refuses_an_out_that_overlaps_a_dlpack_input(small):
    fn = small[0]
    buf = runtime.empty((2, 3), np.float32)
    outs = [buf, runtime.empty((2, 3), np.int32), runtime.empty((), np.float32)]
    with pytest.raises(ValueError, match=r"^f\(\): out 0 overlaps another argument or out$"):
        fn.call_into((DLPackOnly(buf), np.zeros((2, 3), np.int32), np.float32(2)), outs)


# -- torch -----------------------------------------------------------------------------------

def test_torch_tensors_are_read_in_place(step, ref_step, pointers):
    torch = pytest.importorskip("torch")
    xs = kv_inputs(1, 2, 2, 3, seed=3)
    ts = [torch.tensor(x) for x in xs]  # torch's own memory, not NumPy's
    for run in (step, ref_step):
        for got, w in zip(run(*ts), run(*xs)):
            assert type(got) is np.ndarray
            assert_same(got, w)
    want = step(*xs)
    pointers.clear()
    step(*ts)
    assert pointers[0][:6] == [t.data_ptr() for t in ts]
    # bound once, then changed through torch: the kernel sees the change, so nothing was copied
    arrays, env = runtime.bind(step.signature, ts)
    ts[1].mul_(2)
    ts[4].add_(1)
    outs = [runtime.empty(s, np.float32) for s in runtime.result_shapes(step.signature, env)]
    step.call_unchecked(arrays, outs)
    for got, w in zip(outs, step(*[t.numpy() for t in ts])):
        assert_same(got, w)
    assert not np.array_equal(outs[2], want[2])


def test_torch_wraps_the_results_without_a_copy(step):
    torch = pytest.importorskip("torch")
    for r in step(*kv_inputs(1, 2, 2, 3)):
        t = torch.from_numpy(r)
        assert t.data_ptr() == r.ctypes.data and t.dtype == torch.float32


def test_strided_torch_views_give_the_right_answers(step):
    torch = pytest.importorskip("torch")
    xs = kv_inputs(1, 2, 2, 3, seed=4)
    k_past = torch.tensor(np.ascontiguousarray(xs[1].transpose(0, 1, 3, 2))).transpose(2, 3)  # innermost stride 3
    assert not k_past.is_contiguous()
    for got, want in zip(step(xs[0], k_past, *xs[2:]), step(*xs)):
        assert_same(got, want)


@pytest.mark.parametrize("make,error,message", [
    (lambda torch, x: torch.tensor(x, dtype=torch.float64), TypeError,
     r"^kv_step\(\): parameter 'q_new' expects dtype float32 \(F32\), got float64$"),
    (lambda torch, x: torch.tensor(x).to(torch.int32), TypeError, r"parameter 'q_new' expects dtype float32 \(F32\), got int32$"),
    (lambda torch, x: torch.tensor(x).to(torch.bfloat16), TypeError, r"parameter 'q_new' expects dtype float32 \(F32\), got bfloat16$"),
    (lambda torch, x: torch.tensor(x).to(torch.complex64), TypeError, r"parameter 'q_new' expects dtype float32 .* got complex64$"),
    (lambda torch, x: torch.tensor(x).to(torch.float8_e4m3fn), TypeError,
     r"^kv_step\(\): parameter 'q_new' expects dtype float32 \(F32\), got a Tensor of dtype torch.float8_e4m3fn, "
     r"which NumPy cannot import"),
    (lambda torch, x: torch.tensor(x, requires_grad=True), ValueError,
     r"^kv_step\(\): parameter 'q_new' is a tensor that requires grad; Kina does not track gradients: pass .detach\(\)"),
    (lambda torch, x: torch.empty(x.shape, device="meta"), ValueError,
     r"^kv_step\(\): parameter 'q_new' is on a device that DLPack cannot describe .* but Kina runs on the host"),
])
def test_bad_torch_tensors_are_clear_errors(step, ref_step, make, error, message):
    torch = pytest.importorskip("torch")
    xs = kv_inputs(1, 2, 2, 3)
    for run in (step, ref_step):
        with pytest.raises(error, match=message):
            run(make(torch, xs[0]), *xs[1:])


def test_a_detached_tensor_is_accepted(step):
    torch = pytest.importorskip("torch")
    xs = kv_inputs(1, 2, 2, 3, seed=5)
    q = torch.tensor(xs[0], requires_grad=True)
    assert_same(step(q.detach(), *xs[1:])[2], step(*xs)[2])


# -- JAX -------------------------------------------------------------------------------------

def test_jax_arrays_give_the_numpy_answers(step, ref_step):
    jnp = pytest.importorskip("jax.numpy")
    xs = kv_inputs(1, 2, 2, 3, seed=6)
    for run in (step, ref_step):
        for got, want in zip(run(*[jnp.asarray(x) for x in xs]), run(*xs)):
            assert_same(got, want)


def test_the_fast_data_pointer_is_the_arrays_data_pointer():
    """Descriptors read each array's data pointer from NumPy's array struct (pool.data_pointer):
    for every kind of array a call can see it must be exactly `a.ctypes.data`."""
    import platform
    from kina.runtime.pool import FAST_DATA_POINTER, data_pointer
    if platform.python_implementation() == "CPython":
        assert FAST_DATA_POINTER  # the import-time check took the struct path
    base = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    frozen = base.copy()
    frozen.flags.writeable = False
    arrays = [base, base[1:, 2:, 3:], base[::2, ::-1], base[..., 5], base[2, 3, 4:5], base[2, 3, 4, None][0:0],
              np.ones((), np.float32), np.empty((0, 3), np.float32), frozen,
              np.frombuffer(bytearray(64), np.uint8)[8:], runtime.empty((3, 5)),
              runtime.RESULTS.empty((300, 1024), np.float32), base.view(np.int32)[1]]
    torch = pytest.importorskip("torch")
    arrays.append(np.from_dlpack(torch.arange(12, dtype=torch.float32).reshape(3, 4)[1:]))
    for a in arrays:
        assert data_pointer(a) == a.ctypes.data, (a.shape, a.strides)


def test_a_length_one_innermost_dim_with_any_stride(step):
    """A view whose innermost dim has length 1 is passed as it is, whatever NumPy gives as
    that dim's stride (here 28 bytes): the descriptor says 1, as the memref type does."""
    args = list(kv_inputs(1, 2, 2, 3))
    want = step(*args)
    wide = np.zeros((1, 2, 2, 7), np.float32)
    wide[..., 0] = args[2][..., 0]
    args[2] = wide[..., ::7]  # k_new [1, 2, 2, 1], innermost stride 28 bytes
    assert args[2].strides[-1] == 28 and runtime.passable(args[2])
    for got, w in zip(step(*args), want):
        assert_same(got, w)
