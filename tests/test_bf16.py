"""BF16 end to end: `ml_dtypes.bfloat16` arrays in and out, compiled and interpreted alike.

Matmuls and softmaxes sum in F32 and round once; `*` and `+` round per operation. So the
interpreter and the compiled code agree bit for bit on matmul, `*`, `+` and concat, and a
BF16 step matches the F32 reference, computed from the same bf16 values, within
BF16_RTOL = 2^-5 of max |ref| (README, Python API: eight units of bf16 roundoff).
"""
from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

import kina
from conftest import GENERIC_STEP, assert_same, kv_inputs
from kina import runtime
from kina.models import KVCache, TinyDecoder, prefill

BF16 = np.dtype(ml_dtypes.bfloat16)
BF16_RTOL = 2 ** -5
BF16_T = {"T": "BF16"}  # the generic step (src/kina/models/seed/kv_step.kina) in BF16
STATIC = dict(B=1, H=2, Dh=2, S=3)  # ... with the static example's dims


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def reference_f32(q, k_past, k_new, v_past, v_new, scale):
    """The step in F32 (NumPy) on the same values."""
    q, k_past, k_new, v_past, v_new, scale = (x.astype(np.float32) for x in (q, k_past, k_new, v_past, v_new, scale))
    k, v = np.concatenate([k_past, k_new], axis=3), np.concatenate([v_past, v_new], axis=2)
    s = q @ k * scale
    e = np.exp(s - s.max(axis=3, keepdims=True))
    return k, v, e / e.sum(axis=3, keepdims=True) @ v


def bf16_inputs(B, H, Dh, S, seed=0):
    return [x.astype(BF16) for x in kv_inputs(B, H, Dh, S, seed=seed)]


@pytest.fixture(scope="module")
def ref_step():
    return kina.interpret(GENERIC_STEP.read_text(), dtypes=BF16_T, dims=STATIC).kv_step


# -- the interpreter ---------------------------------------------------------------------

def test_interpreted_bf16_step_matches_f32_within_the_tolerance(ref_step):
    for seed in range(4):
        xs = bf16_inputs(1, 2, 2, 3, seed)
        got, want = ref_step(*xs), reference_f32(*xs)
        assert [g.dtype for g in got] == [BF16] * 3
        assert_same(got[0], want[0].astype(BF16))
        assert_same(got[1], want[1].astype(BF16))
        assert rel_err(got[2], want[2]) <= BF16_RTOL


def test_bf16_and_f16_matmuls_round_once():
    # 1 + 2^-p + 2^-p is exact in F32 and representable in the dtype (p bits of mantissa, 8 for
    # bf16 and 11 for f16); added in the dtype itself, each 1 + 2^-p would be a tie back to 1.
    for kina_dtype, dtype, p in (("BF16", BF16, 8), ("F16", np.dtype(np.float16), 11)):
        fn = kina.interpret(f"let f = fn(x: tensor<{kina_dtype}, [1, 3], @host>, y: tensor<{kina_dtype}, [3, 1], @host>)"
                            f" -> (tensor<{kina_dtype}, [1, 1], @host>) {{\n  (x @ y)\n}}\n").f
        x = np.array([[1, 2.0 ** -p, 2.0 ** -p]]).astype(dtype)
        (got,) = fn(x, np.ones((3, 1), dtype))
        assert got.dtype == dtype and got[0, 0] == 1 + 2.0 ** (1 - p)


def test_bf16_needs_bf16_arrays(ref_step):
    xs = bf16_inputs(1, 2, 2, 3)
    with pytest.raises(TypeError, match=r"^kv_step\(\): parameter 'k_past' expects dtype bfloat16 \(BF16\), got float32$"):
        ref_step(xs[0], xs[1].astype(np.float32), *xs[2:])
    got = ref_step(*[x.astype(np.float32).tolist() for x in xs])  # lists round to bfloat16
    for g, w in zip(got, ref_step(*xs)):
        assert_same(g, w)


def test_torch_bfloat16_tensors_are_read_in_place(ref_step):
    torch = pytest.importorskip("torch")
    xs = bf16_inputs(1, 2, 2, 3, seed=5)
    ts = [torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).clone() for x in xs]  # torch's own memory
    arrays, _ = runtime.bind(kina.interpret(GENERIC_STEP.read_text(), dtypes=BF16_T, dims=STATIC).functions["kv_step"].sig, ts)
    assert [a.dtype for a in arrays] == [BF16] * 6
    assert [a.ctypes.data for a in arrays] == [t.data_ptr() for t in ts]
    for got, want in zip(ref_step(*ts), ref_step(*xs)):
        assert_same(got, want)


def test_tiny_decoder_refuses_bf16():
    with pytest.raises(TypeError, match=r"^dtype: TinyDecoder's host layers are NumPy matmuls"):
        TinyDecoder(17, 8, 2, 1, 20, dtype=BF16)


# -- compiled ------------------------------------------------------------------------------

NO_SOFTMAX = """
let f = fn(q: tensor<BF16, [B, H, 1, D], @host>, k_past: tensor<BF16, [B, H, D, S], @host>,
           k_new: tensor<BF16, [B, H, D, 1], @host>, v: tensor<BF16, [B, H, S+1, D], @host>,
           scale: tensor<BF16, [1, 1, 1, 1], @host>, bias: tensor<BF16, [B, H, 1, D], @host>)
  -> (tensor<BF16, [B, H, D, S+1], @host>, tensor<BF16, [B, H, 1, D], @host>) {
  let k = concat[axis=3] k_past k_new;
  let scores = q @ k * broadcast(scale);
  (k, scores @ v + bias)
}
"""


def test_compiled_and_interpreted_bf16_agree_bit_for_bit():
    fn = kina.compile_source(NO_SOFTMAX, "no_softmax.kina").f
    ref = kina.interpret(NO_SOFTMAX, "no_softmax.kina").f
    for (B, H, D, S) in [(1, 2, 2, 3), (2, 3, 16, 33), (1, 4, 64, 300)]:
        rng = np.random.default_rng(S)
        r = lambda *s: rng.standard_normal(s).astype(BF16)
        xs = [r(B, H, 1, D), r(B, H, D, S), r(B, H, D, 1), r(B, H, S + 1, D), r(1, 1, 1, 1), r(B, H, 1, D)]
        for got, want in zip(fn(*xs), ref(*xs)):
            assert_same(got, want, what=f"B={B} H={H} D={D} S={S}")


def test_compiled_bf16_step_matches_f32_within_the_tolerance(ref_step):
    step = kina.compile_file(GENERIC_STEP, dtypes=BF16_T, dims=STATIC).kv_step
    dyn = kina.compile_file(GENERIC_STEP, dtypes=BF16_T).kv_step
    for seed in range(4):
        xs = bf16_inputs(1, 2, 2, 3, seed)
        got, want = step(*xs), reference_f32(*xs)
        assert [g.dtype for g in got] == [BF16] * 3 and all(type(g) is np.ndarray for g in got)
        assert_same(got[0], want[0].astype(BF16))
        assert_same(got[1], want[1].astype(BF16))
        assert rel_err(got[2], want[2]) <= BF16_RTOL
        assert rel_err(got[2], ref_step(*xs)[2]) <= BF16_RTOL
        for g, d in zip(got, dyn(*xs)):  # static and symbolic: the same bits
            assert_same(g, d)
    for (B, H, Dh, S) in [(1, 4, 64, 127), (2, 3, 16, 33), (1, 8, 128, 511)]:
        xs = bf16_inputs(B, H, Dh, S, seed=S)
        assert rel_err(dyn(*xs)[2], reference_f32(*xs)[2]) <= BF16_RTOL, (B, H, Dh, S)


def test_bf16_kv_cache_step_equals_the_functional_step():
    functional = kina.compile_file(GENERIC_STEP, dtypes=BF16_T).kv_step
    cache = KVCache(2, 3, 4, 16, dtype="bfloat16")
    assert cache.dtype == BF16 and cache.keys().dtype == BF16 and cache.bytes_per_token == 2 * 2 * 3 * 4 * 2
    xs = bf16_inputs(2, 3, 4, 0)
    k_past, v_past, scale = xs[1], xs[3], 0.5
    rng = np.random.default_rng(3)
    for _ in range(10):
        q, k_new, v_new = (rng.standard_normal(s).astype(BF16) for s in ((2, 3, 1, 4), (2, 3, 4, 1), (2, 3, 1, 4)))
        k_past, v_past, want = functional(q, k_past, k_new, v_past, v_new, np.full((1, 1, 1, 1), scale, BF16))
        got = cache.step(q, k_new, v_new, scale)
        assert got.dtype == BF16
        assert_same(got, want)
        assert_same(cache.keys(), k_past)
        assert_same(cache.values(), v_past)
        assert rel_err(got, reference_f32(q, cache.keys()[..., :-1], k_new, cache.values()[:, :, :-1], v_new,
                                          np.full((1, 1, 1, 1), scale, BF16))[2]) <= BF16_RTOL
    with pytest.raises(TypeError, match=r"^step: k_new must have dtype bfloat16 \(the cache's\), got float32$"):
        cache.step(q, k_new.astype(np.float32), v_new, scale)


def test_bf16_prefill_then_step():
    cache = KVCache(1, 2, 4, 8, dtype=BF16)
    context = prefill(cache, *(np.random.default_rng(4).standard_normal(s).astype(BF16)
                               for s in ((1, 2, 5, 4), (1, 2, 4, 5), (1, 2, 5, 4))), 0.5)
    assert context.dtype == BF16 and context.shape == (1, 2, 5, 4) and cache.n_filled == 5
    q = np.ones((1, 2, 1, 4), BF16)
    got = cache.attend(q, 0.5)
    k, v = cache.keys().astype(np.float32), cache.values().astype(np.float32)
    s = q.astype(np.float32) @ k * 0.5
    e = np.exp(s - s.max(axis=3, keepdims=True))
    assert rel_err(got, e / e.sum(axis=3, keepdims=True) @ v) <= BF16_RTOL
