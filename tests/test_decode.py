"""kina.models (kvcache, tiny): the KV cache, prefill, the in-place step and greedy generation (Sections 20-22).

The equivalences of issue 5 are the tests marked (a)-(e) below.
"""
import importlib.util
import io
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

import kina
from conftest import EXAMPLES, ROOT, assert_same
from kina.models import CacheFullError, KVCache, TinyDecoder, causal_attention, causal_mask, prefill

B, H, Dh = 2, 3, 4


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def kv(rng, n, dtype=np.float32, b=B, h=H, dh=Dh):
    return rand(rng, b, h, dh, n, dtype=dtype), rand(rng, b, h, n, dh, dtype=dtype)


def filled(n, t=8, dtype=np.float32, seed=0):
    cache = KVCache(B, H, Dh, t, dtype)
    if n:
        cache.append(*kv(np.random.default_rng(seed), n, dtype))
    return cache


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def snapshot(cache):
    return cache.n_filled, cache._k.tobytes(), cache._v.tobytes()


def rel_err(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


# -- construction and capacity ---------------------------------------------------

def test_construction_and_capacity():
    cache = KVCache(B, H, Dh, 10)
    assert (cache.n_filled, cache.max_seq_len, cache.fill_ratio, cache.dtype) == (0, 10, 0.0, np.float32)
    assert cache.keys().shape == (B, H, Dh, 0) and cache.values().shape == (B, H, 0, Dh)
    assert cache._k.shape == (B, H, Dh, 10) and cache._v.shape == (B, H, 10, Dh)
    assert not cache._k.any() and not cache._v.any()
    assert cache.bytes_per_token == 2 * B * H * Dh * 4
    assert cache.nbytes == 10 * cache.bytes_per_token
    cache.append(*kv(np.random.default_rng(0), 4))
    assert cache.fill_ratio == 0.4
    assert KVCache(1, 1, 2, 3, np.float64).bytes_per_token == 32


@pytest.mark.parametrize("args, kwargs, exc, words", [
    ((0, 1, 1, 1), {}, ValueError, "batch"),
    ((1, 1.5, 1, 1), {}, TypeError, "n_heads"),
    ((1, 1, -2, 1), {}, ValueError, "head_dim"),
    ((1, 1, 1, 0), {}, ValueError, "max_seq_len"),
    ((1, 1, 1, True), {}, TypeError, "max_seq_len"),
    ((1, 1, 1, 4), {"dtype": np.int32}, TypeError, "dtype"),
    ((1, 1, 1, 4), {"dtype": "nonsense"}, TypeError, "dtype"),
])
def test_construction_errors(args, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        KVCache(*args, **kwargs)


# -- append, views, reads ------------------------------------------------------

def test_append_writes_in_place_and_returns_the_position():
    rng = np.random.default_rng(1)
    cache = KVCache(B, H, Dh, 8)
    k1, v1 = kv(rng, 3)
    k2, v2 = kv(rng, 1)
    assert cache.append(k1, v1) == 0
    assert cache.append(k2, v2) == 3
    assert cache.n_filled == 4
    assert_same(cache.keys(), np.concatenate([k1, k2], axis=3))
    assert_same(cache.values(), np.concatenate([v1, v2], axis=2))
    assert np.shares_memory(cache.keys(), cache._k) and np.shares_memory(cache.values(), cache._v)
    assert not cache.keys().flags.writeable and not cache.values().flags.writeable
    assert cache.k_at(2, 3, 1, batch=1) == k2[1, 2, 1, 0]
    assert cache.v_at(0, 1, 3) == v1[0, 0, 1, 3]


@pytest.mark.parametrize("k_shape, v_shape, exc, words", [
    ((B, H, Dh), (B, H, 1, Dh), ValueError, r"k_new must have shape \[2, 3, 4, n\], got \[2, 3, 4\]"),
    ((B, H + 1, Dh, 1), (B, H, 1, Dh), ValueError, "k_new must have shape"),
    ((B, H, Dh, 1), (B, H, 1, Dh + 1), ValueError, r"v_new must have shape \[2, 3, n, 4\]"),
    ((B, H, Dh, 2), (B, H, 1, Dh), ValueError, "k_new holds 2 positions .* v_new holds 1"),
])
def test_append_shape_errors(k_shape, v_shape, exc, words):
    cache = filled(2)
    before = snapshot(cache)
    with pytest.raises(exc, match=words):
        cache.append(np.zeros(k_shape, np.float32), np.zeros(v_shape, np.float32))
    assert snapshot(cache) == before


def test_append_type_errors():
    cache = filled(0)
    with pytest.raises(TypeError, match="k_new must be a numpy.ndarray, got list"):
        cache.append([[[[1.0]]]], np.zeros((B, H, 1, Dh), np.float32))
    with pytest.raises(TypeError, match="v_new must have dtype float32 .* got float64"):
        cache.append(np.zeros((B, H, Dh, 1), np.float32), np.zeros((B, H, 1, Dh)))


def test_cache_full_leaves_the_cache_byte_for_byte_unchanged():
    cache = filled(6, t=8)
    before = snapshot(cache)
    with pytest.raises(CacheFullError, match=r"6 of 8 positions are filled, so 3 more do not fit \(2 free\)") as e:
        cache.append(*kv(np.random.default_rng(2), 3))
    assert (e.value.n_filled, e.value.max_seq_len, e.value.requested) == (6, 8, 3)
    assert isinstance(e.value, ValueError)
    assert snapshot(cache) == before
    rng = np.random.default_rng(3)
    q = rand(rng, B, H, 1, Dh)
    cache.append(*kv(rng, 2))  # exactly full is fine
    before = snapshot(cache)
    with pytest.raises(CacheFullError, match="8 of 8"):
        cache.step(q, *kv(rng, 1), 0.5)
    assert snapshot(cache) == before


def test_step_checks_everything_before_appending():
    cache = filled(2)
    before = snapshot(cache)
    k, v = kv(np.random.default_rng(4), 1)
    with pytest.raises(ValueError, match=r"step: q must have shape \[2, 3, 1, 4\]"):
        cache.step(np.zeros((B, H, 2, Dh), np.float32), k, v, 0.5)
    with pytest.raises(TypeError, match="step: scale must be a real number"):
        cache.step(np.zeros((B, H, 1, Dh), np.float32), k, v, "0.5")
    with pytest.raises(ValueError, match="step: scale must be finite"):
        cache.step(np.zeros((B, H, 1, Dh), np.float32), k, v, float("nan"))
    assert snapshot(cache) == before


def test_clear_and_crop():
    cache = filled(5)
    keys = cache.keys().copy()
    cache.crop(3)
    assert cache.n_filled == 3
    assert_same(cache.keys(), keys[..., :3])
    cache.crop(3)
    with pytest.raises(ValueError, match="crop: n=4 is past the fill: only 3 positions are filled"):
        cache.crop(4)
    with pytest.raises(ValueError, match="n: expected an int >= 0, got -1"):
        cache.crop(-1)
    with pytest.raises(TypeError, match="n: expected an int"):
        cache.crop(1.0)
    assert cache.n_filled == 3
    cache.clear()
    assert cache.n_filled == 0 and cache.keys().shape == (B, H, Dh, 0)
    assert cache.append(*kv(np.random.default_rng(5), 1)) == 0


@pytest.mark.parametrize("read", ["k_at", "v_at"])
@pytest.mark.parametrize("index, words", [
    (dict(head=3, pos=0, dim=0), r"head 3 is out of range: expected 0 <= head < n_heads = 3"),
    (dict(head=-1, pos=0, dim=0), r"head -1 is out of range"),
    (dict(head=0, pos=5, dim=0), r"pos 5 is out of range: expected 0 <= pos < n_filled = 5"),
    (dict(head=0, pos=7, dim=0), r"pos 7 is out of range"),  # inside T_max, past the fill
    (dict(head=0, pos=-1, dim=0), r"pos -1 is out of range"),
    (dict(head=0, pos=0, dim=4), r"dim 4 is out of range: expected 0 <= dim < head_dim = 4"),
    (dict(head=0, pos=0, dim=0, batch=2), r"batch 2 is out of range: expected 0 <= batch < batch = 2"),
])
def test_reads_are_bounds_checked(read, index, words):
    cache = filled(5)
    with pytest.raises(IndexError, match=f"{read}: {words}"):
        getattr(cache, read)(**index)


def test_read_index_types():
    with pytest.raises(TypeError, match="k_at: pos must be an int, got float"):
        filled(2).k_at(0, 1.0, 0)


# -- attention ---------------------------------------------------------------

@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_score_apply_attend_match_numpy(dtype, tol):
    rng = np.random.default_rng(6)
    cache = filled(5, t=9, dtype=dtype, seed=6)
    q = rand(rng, B, H, 1, Dh, dtype=dtype)
    k, v = cache.keys(), cache.values()
    scores = cache.score(q)
    assert_same(scores, q @ k, rtol=tol, atol=tol)
    weights = softmax(scores * dtype(0.5))
    assert_same(cache.apply(weights), weights @ v, rtol=tol, atol=tol)
    assert_same(cache.attend(q, 0.5), softmax(q @ k * dtype(0.5)) @ v, rtol=tol, atol=tol)


def test_attention_argument_errors():
    cache = filled(3)
    with pytest.raises(ValueError, match=r"apply: weights must have shape \[2, 3, 1, 3\], got \[2, 3, 1, 4\]"):
        cache.apply(np.zeros((B, H, 1, 4), np.float32))
    with pytest.raises(TypeError, match="score: q must have dtype float32"):
        cache.score(np.zeros((B, H, 1, Dh), np.float64))
    with pytest.raises(ValueError, match="attend: the cache is empty"):
        filled(0).attend(np.zeros((B, H, 1, Dh), np.float32), 1.0)
    empty = filled(0)
    assert empty.score(np.zeros((B, H, 1, Dh), np.float32)).shape == (B, H, 1, 0)
    assert_same(empty.apply(np.zeros((B, H, 1, 0), np.float32)), np.zeros((B, H, 1, Dh), np.float32))


class _Spy:
    """Stands in for the compiled kernels and records the N of every call."""

    def __init__(self, kernels):
        self.kernels, self.sizes = kernels, []

    def __getattr__(self, name):
        spy, fn = self, getattr(self.kernels, name)

        def record(args):
            spy.sizes.append((name, args[1].shape[-1] if name != "apply" else args[1].shape[2]))

        class Recorded:  # the checked call and the raw one that KVCache.attend makes
            def __call__(self, *args):
                record(args)
                return fn(*args)

            def call_unchecked(self, arrays, outs):
                record(arrays)
                return fn.call_unchecked(arrays, outs)
        return Recorded()


def test_kernels_see_only_the_filled_prefix():
    cache = filled(3, t=1000)
    cache._kernels = spy = _Spy(cache._kernels)
    rng = np.random.default_rng(7)
    q = rand(rng, B, H, 1, Dh)
    cache.score(q)
    cache.apply(np.zeros((B, H, 1, 3), np.float32))
    assert spy.sizes == [("score", 3), ("apply", 3)]
    # attend and step run the kernel prepared on the whole buffers: its descriptors say N
    call, seen = cache._call, []

    class Recorded:  # the prepared call, recording the N of K^T (dim 3) and V (dim 2) it is made with
        set_dim, set_data = call.set_dim, call.set_data

        def __call__(self):
            seen.append((call.words[call._size_word["k", "N"]], call.words[call._size_word["v", "N"]]))
            call()
    cache._call = Recorded()
    cache.attend(q, 1.0)
    cache.step(q, *kv(rng, 1), 1.0)
    assert seen == [(3, 3), (4, 4)]


def test_unused_slots_never_change_a_result():
    """(d), Section 22: NaN in every unused slot (appended, then cropped away) changes nothing."""
    rng = np.random.default_rng(9)
    k, v = kv(rng, 4)
    q = rand(rng, B, H, 1, Dh)
    clean = KVCache(B, H, Dh, 4)
    clean.append(k, v)
    dirty = KVCache(B, H, Dh, 64)
    dirty.append(np.full((B, H, Dh, 64), np.nan, np.float32), np.full((B, H, 64, Dh), np.nan, np.float32))
    dirty.clear()
    dirty.append(k, v)
    assert np.isnan(dirty._k[..., 4:]).all() and np.isnan(dirty._v[:, :, 4:]).all()
    assert_same(dirty.attend(q, 0.5), clean.attend(q, 0.5))
    assert_same(dirty.score(q), clean.score(q))
    w = softmax(clean.score(q))
    assert_same(dirty.apply(w), clean.apply(w))


# -- (c) the functional Section 19 step and the in-place step -------------------

@pytest.mark.parametrize("dtype, kina_dtype", [(np.float32, "F32"), (np.float64, "F64")])
def test_functional_and_in_place_steps_are_bit_identical(dtype, kina_dtype):
    """(c)"""
    text = (EXAMPLES / "storylm0_kv_step_dyn.kina").read_text().replace("F32", kina_dtype)
    functional = kina.compile_source(text, "storylm0_kv_step_dyn.kina").kv_step
    rng = np.random.default_rng(10)
    k_past, v_past = kv(rng, 0, dtype)
    cache = KVCache(B, H, Dh, 16, dtype)
    scale = 1 / np.sqrt(Dh)
    for _ in range(12):
        q, (k_new, v_new) = rand(rng, B, H, 1, Dh, dtype=dtype), kv(rng, 1, dtype)
        k_past, v_past, want = functional(q, k_past, k_new, v_past, v_new, np.full((1, 1, 1, 1), scale, dtype))
        got = cache.step(q, k_new, v_new, scale)
        assert_same(got, want)
        assert_same(cache.keys(), k_past)
        assert_same(cache.values(), v_past)


def test_the_in_place_step_stays_bit_identical_while_kt_rows_move(monkeypatch):
    """Kᵀ's row stride grows by KT_STRIDE_STEP as the cache fills, then jumps to T_max;
    rows move each time. Every step still equals the functional step, through a crop back
    (which keeps the stride) and a clear (which resets it), with NaN in every unused slot."""
    from kina.models.seed import kvcache as decode
    monkeypatch.setattr(decode, "KT_SHORT_ROW_BYTES", 160 * 4)  # the jump to T_max at 160 positions
    functional = kina.compile_file(EXAMPLES / "storylm0_kv_step_dyn.kina").kv_step
    rng = np.random.default_rng(11)
    cache = KVCache(B, H, Dh, 300)
    cache._kt_buffer[:] = np.nan
    cache._v[:] = np.nan
    scale = np.full((1, 1, 1, 1), 1 / np.sqrt(Dh), np.float32)
    strides = []
    k_past, v_past = kv(rng, 0, np.float32)
    for t in range(230):
        if t == 150:  # roll back 40 positions
            cache.crop(110)
            k_past, v_past = k_past[..., :110], v_past[:, :, :110]
        if t == 200:
            cache.clear()
            assert cache._stride == decode.KT_STRIDE_STEP
            k_past, v_past = kv(rng, 0, np.float32)
        q, (k_new, v_new) = rand(rng, B, H, 1, Dh), kv(rng, 1, np.float32)
        k_past, v_past, want = functional(q, k_past, k_new, v_past, v_new, scale)
        assert_same(cache.step(q, k_new, v_new, float(scale[0, 0, 0, 0])), want, what=f"step {t}")
        assert_same(cache.keys(), k_past)
        assert_same(cache.values(), v_past)
        strides.append(cache._stride)
    assert strides[0] == 64 and 128 in strides and 192 not in strides and 300 in strides  # 64, 128, then T_max
    assert strides[199] == 300 and strides[200] == 64


# -- prefill (Section 21) ------------------------------------------------------

def test_causal_mask():
    m = causal_mask(2, 3)
    assert m.shape == (1, 1, 3, 5) and m.dtype == np.float32
    assert_same(m[0, 0] == 0, np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool))
    assert np.isneginf(m[0, 0, 0, 3])


def test_prefill_example_seeds_a_cache_and_decoding_continues():
    """examples/storylm0_prefill.kina: its Kᵀ and V seed a KVCache; the next step equals a prefill of P+1."""
    example = kina.compile_file(EXAMPLES / "storylm0_prefill.kina").prefill
    rng = np.random.default_rng(11)
    P, scale = 5, np.full((1, 1, 1, 1), 0.5, np.float32)
    q, (k, v) = rand(rng, B, H, P + 1, Dh), kv(rng, P + 1)
    mask = causal_mask(0, P)
    assert mask.shape == (1, 1, P, P)
    k_t, v_out, context = example(q[:, :, :P], k[..., :0], k[..., :P], v[:, :, :0], v[:, :, :P], mask, scale)
    scores = q[:, :, :P] @ k[..., :P] * scale + mask
    assert_same(context, softmax(scores) @ v[:, :, :P], rtol=1e-5, atol=1e-6)
    assert_same(k_t, np.ascontiguousarray(k[..., :P]))
    assert_same(v_out, v[:, :, :P])
    cache = KVCache(B, H, Dh, 8)
    cache.append(k_t, v_out)
    step = cache.step(q[:, :, P:], k[..., P:], v[:, :, P:], 0.5)
    _, _, full = example(q, k[..., :0], k, v[:, :, :0], v, causal_mask(0, P + 1), scale)
    assert_same(step, full[:, :, P:])  # the last row of a masked prefill is exactly the step


def test_chunked_prefill_equals_one_prefill():
    rng = np.random.default_rng(12)
    q, (k, v) = rand(rng, B, H, 7, Dh), kv(rng, 7)
    whole, chunked = KVCache(B, H, Dh, 8), KVCache(B, H, Dh, 8)
    want = prefill(whole, q, k, v, 0.5)
    got = np.concatenate([prefill(chunked, q[:, :, :3], k[..., :3], v[:, :, :3], 0.5),
                          prefill(chunked, q[:, :, 3:], k[..., 3:], v[:, :, 3:], 0.5)], axis=2)
    assert_same(got, want)
    assert_same(chunked.keys(), whole.keys())
    assert_same(chunked.values(), whole.values())


def test_prefill_errors_leave_the_cache_unchanged():
    rng = np.random.default_rng(13)
    cache = filled(5, t=8)
    before = snapshot(cache)
    q, (k, v) = rand(rng, B, H, 4, Dh), kv(rng, 4)
    with pytest.raises(CacheFullError):
        prefill(cache, q, k, v, 1.0)
    with pytest.raises(ValueError, match=r"prefill: q must have shape \[2, 3, 2, 4\]"):
        prefill(cache, q, k[..., :2], v[:, :, :2], 1.0)
    with pytest.raises(ValueError, match="prefill: k_new and v_new hold no positions"):
        prefill(cache, q[:, :, :0], k[..., :0], v[:, :, :0], 1.0)
    assert snapshot(cache) == before


# -- generation (Section 20) ---------------------------------------------------

MODELS = [dict(vocab_size=23, d_model=8, n_heads=1, n_layers=1), dict(vocab_size=31, d_model=24, n_heads=4, n_layers=3)]
PROMPT = [3, 1, 4, 1, 5]


@pytest.mark.parametrize("sizes", MODELS)
def test_cached_and_recomputed_generation_agree(sizes):
    """(a) same tokens, and logits within 1e-5 relative at every step."""
    model = TinyDecoder(**sizes, max_seq_len=40, seed=1)
    cached = model.trace(PROMPT, 30)
    recomputed = model.trace(PROMPT, 30, use_cache=False)
    assert cached.tokens == recomputed.tokens
    assert len(cached.tokens) == 30 and all(0 <= t < sizes["vocab_size"] for t in cached.tokens)
    assert cached.logits.shape == (30, sizes["vocab_size"]) and cached.logits.dtype == np.float32
    for i, (a, b) in enumerate(zip(cached.logits, recomputed.logits)):
        assert rel_err(a, b) <= 1e-5, f"step {i}"
        assert int(np.argmax(a)) == cached.tokens[i]
    assert len(set(cached.tokens)) > 1
    assert model.generate(PROMPT, 30) == cached.tokens
    assert model.generate(PROMPT, 30, use_cache=False) == cached.tokens


@pytest.mark.parametrize("sizes", MODELS)
def test_prefill_then_decode_equals_token_by_token(sizes):
    """(b)"""
    model = TinyDecoder(**sizes, max_seq_len=32, seed=2)
    prefilled, stepped = model.new_cache(), model.new_cache()
    a = model.prefill(PROMPT, prefilled)
    for t in PROMPT:
        b = model.step(t, stepped)
    for _ in range(10):
        assert rel_err(a, b) <= 1e-5
        assert np.argmax(a) == np.argmax(b)
        token = int(np.argmax(a))
        a, b = model.step(token, prefilled), model.step(token, stepped)
    for p, s in zip(prefilled, stepped):
        assert p.n_filled == s.n_filled == len(PROMPT) + 10
        assert_same(p.keys(), s.keys(), rtol=1e-5, atol=1e-6)
        assert_same(p.values(), s.values(), rtol=1e-5, atol=1e-6)


def test_results_depend_neither_on_max_seq_len_nor_on_unused_slots():
    """(d)"""
    sizes = MODELS[1]
    short = TinyDecoder(**sizes, max_seq_len=25, seed=3).trace(PROMPT, 20)
    long_model = TinyDecoder(**sizes, max_seq_len=500, seed=3)
    long = long_model.trace(PROMPT, 20)
    assert short.tokens == long.tokens
    assert_same(short.logits, long.logits)
    dirty = long_model.new_cache()
    for c in dirty:  # NaN everywhere, then start over: every unused slot holds NaN
        B, H, T, Dh = c._v.shape
        c.append(np.full((B, H, Dh, T), np.nan, np.float32), np.full(c._v.shape, np.nan, np.float32))
        c.clear()
    clean = long_model.new_cache()
    assert_same(long_model.prefill(PROMPT, dirty), long_model.prefill(PROMPT, clean))
    for t in long.tokens:
        assert_same(long_model.step(t, dirty), long_model.step(t, clean))


def test_crop_then_redecode_equals_never_decoding_past_n():
    """(e)"""
    model = TinyDecoder(**MODELS[1], max_seq_len=40, seed=4)
    n = len(PROMPT) + 3
    base = model.trace(PROMPT, 12).tokens
    detour, straight = model.new_cache(), model.new_cache()
    model.prefill(PROMPT, detour)
    for t in base[:10]:  # decode well past n ...
        model.step(t, detour)
    for c in detour:
        c.crop(n)  # ... then roll back to n positions
    model.prefill(PROMPT, straight)
    for t in base[:3]:
        model.step(t, straight)
    for t in [7, 0, 30, 2]:  # a different continuation from position n
        assert_same(model.step(t, detour), model.step(t, straight))
    for d, s in zip(detour, straight):
        assert_same(d.keys(), s.keys())
        assert_same(d.values(), s.values())


def test_models_are_seeded_and_deterministic():
    a, b, c = (TinyDecoder(29, 16, 2, 2, 30, seed=s) for s in (5, 5, 6))
    assert a.generate(PROMPT, 10) == b.generate(PROMPT, 10)
    assert_same(a.embedding, b.embedding)
    assert not np.array_equal(a.embedding, c.embedding)


def test_generation_edge_cases_and_errors():
    model = TinyDecoder(11, 8, 2, 1, max_seq_len=8)
    assert model.generate([1], 0) == []
    assert len(model.generate([1, 2, 3], 6)) == 6  # 3 + 6 - 1 = 8 positions: the last token is never fed
    assert len(model.generate(np.array([1, 2, 3]), 6, use_cache=False)) == 6
    with pytest.raises(ValueError, match="n_new: 3 prompt tokens \\+ 7 new need 9 positions, more than max_seq_len = 8"):
        model.generate([1, 2, 3], 7)
    with pytest.raises(ValueError, match="prompt_tokens: expected at least one token"):
        model.generate([], 3)
    with pytest.raises(ValueError, match=r"prompt_tokens\[1\]: token id 11 is out of range"):
        model.generate([1, 11], 3)
    with pytest.raises(TypeError, match=r"prompt_tokens\[0\]: expected an int token id, got float"):
        model.generate([1.0], 3)
    with pytest.raises(TypeError, match="prompt_tokens: expected a sequence of token ids, got str"):
        model.generate("abc", 3)
    with pytest.raises(ValueError, match="n_new: expected an int >= 0"):
        model.generate([1], -1)
    with pytest.raises(ValueError, match="d_model: 10 is not a multiple of n_heads = 4"):
        TinyDecoder(11, 10, 4, 1, 8)
    caches = model.new_cache()
    model.prefill(list(range(8)), caches)
    with pytest.raises(CacheFullError, match="8 of 8"):
        model.step(1, caches)
    with pytest.raises(TypeError, match="caches: expected a list of 1 KVCache"):
        model.step(1, caches[0])


def test_float64_model_and_float16_cache():
    model = TinyDecoder(17, 8, 2, 2, 20, seed=7, dtype=np.float64)
    cached, recomputed = model.trace(PROMPT, 8), model.trace(PROMPT, 8, use_cache=False)
    assert cached.tokens == recomputed.tokens and cached.logits.dtype == np.float64
    assert rel_err(cached.logits, recomputed.logits) < 1e-12
    half = filled(3, dtype=np.float16)
    q = np.ones((B, H, 1, Dh), np.float16)
    want = softmax(q.astype(np.float32) @ half.keys().astype(np.float32) * 0.5) @ half.values().astype(np.float32)
    got = half.attend(q, 0.5)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


# -- the scripts ---------------------------------------------------------------

def _run_script(monkeypatch, name, argv):
    """Run scripts/<name>.py's main(argv) here, with scripts/ on sys.path as when it is run
    (for its own imports: benchlib, plotting)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = module.main(argv)
    return status, out.getvalue(), err.getvalue()


def test_demo_script(monkeypatch):
    status, out, err = _run_script(monkeypatch, "demo_generate", ["--tokens", "40", "--prompt", "4", "--d-model", "16"])
    assert status == 0
    assert "total" in out and "tokens/s" in out and "KV cache: 2 layers" in out
    assert err == ""  # captured stderr is no terminal, so no tqdm bar (tests/test_plots.py checks it on one)


def test_bench_script(monkeypatch):
    status, out, _ = _run_script(monkeypatch, "bench_decode", ["--tokens", "20", "--repeats", "1", "--d-model", "8"])
    assert status == 0
    assert "same tokens from both: yes" in out and "ratio" in out and "n^2" in out


def test_causal_attention_matches_numpy_and_checks_k_t():
    rng = np.random.default_rng(14)
    q, (k, v) = rand(rng, B, H, 6, Dh), kv(rng, 6)
    want = softmax(q @ k * np.float32(0.5) + causal_mask(0, 6)) @ v
    assert_same(causal_attention(q, k, v, 0.5), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="k_t must be a numpy.ndarray, got list"):
        causal_attention(q, [1.0], v, 0.5)
    with pytest.raises(ValueError, match=r"k_t must have shape \[B, H, Dh, P\], got \[4, 6\]"):
        causal_attention(q, k[0, 0], v, 0.5)
    with pytest.raises(ValueError, match="k_t holds no positions"):
        causal_attention(q, k[..., :0], v, 0.5)


def test_attend_takes_any_query_view():
    """KVCache calls its kernel without the runtime's checks, so it passes a query whose
    innermost stride is not one element as a contiguous copy itself."""
    cache = filled(5)
    q = rand(np.random.default_rng(12), B, H, 1, 2 * Dh)[..., ::2]
    assert q.strides[-1] != q.itemsize
    assert_same(cache.attend(q, 0.5), cache.attend(np.ascontiguousarray(q), 0.5))


def test_step_on_an_empty_cache_with_no_new_position_is_refused():
    cache = filled(0)
    q = np.zeros((B, H, 1, Dh), np.float32)
    with pytest.raises(ValueError, match="step: the cache is empty"):
        cache.step(q, np.zeros((B, H, Dh, 0), np.float32), np.zeros((B, H, 0, Dh), np.float32), 1.0)
    assert cache.n_filled == 0


def test_prepared_call_patches_by_name_and_checks_names_once():
    """PreparedCall names arguments and dims as the signature does; unknown names are
    ValueErrors naming them, found when the call is prepared (dims) or patched."""
    cache = filled(3, t=16)
    attend = cache._kernels.attend
    out = np.empty((B, H, 1, Dh), np.float32)
    with pytest.raises(ValueError, match="no parameter or result has a dim named 'S'"):
        attend.prepare([cache._q, cache._k, cache._v, cache._s], [out], dims=("S",))
    call = attend.prepare([cache._q, cache._k, cache._v, cache._s], [out], dims=("N",))
    call.set_dims(N=5)
    assert (call.words[call._size_word["k", "N"]], call.words[call._size_word["v", "N"]]) == (5, 5)
    call.set_dim("N", 4)
    assert (call.words[call._size_word["k", "N"]], call.words[call._size_word["v", "N"]]) == (4, 4)
    call.set_size("k", "N", 3)
    assert call.words[call._size_word["k", "N"]] == 3
    for patch, words in [(lambda: call.set_dims(Dh=4), "'Dh' was not named to prepare"),
                         (lambda: call.set_dim("S", 4), "'S' was not named to prepare"),
                         (lambda: call.set_size("kk", "N", 3), "no parameter or result named 'kk'"),
                         (lambda: call.set_size("q", "N", 3), "q has no axis of size 'N'"),
                         (lambda: call.set_data("out1", out), "no parameter or result named 'out1'")]:
        with pytest.raises(ValueError, match=words):
            patch()


def test_prepared_call_is_bounded_by_its_buffers():
    """A prepared call checks its buffers once, as a call checks its arguments, and no
    patch takes a descriptor past them: a mistake is an error naming it, never a write
    outside the memory given (the bug behind StoryLM's crash at exit)."""
    cache = filled(3, t=16)
    attend = cache._kernels.attend
    q, s = cache._q, cache._s
    q[...], s[...] = rand(np.random.default_rng(4), B, H, 1, Dh), 0.5
    out = np.empty((B, H, 1, Dh), np.float32)
    short_v = cache._v[:, :, :10]  # Kᵀ holds 16 positions, V 10: N starts at the largest both hold
    call = attend.prepare([q, cache._k, short_v, s], [out], dims=("N",))
    assert call.dim_range("N") == range(11)
    assert (call.words[call._size_word["k", "N"]], call.words[call._size_word["v", "N"]]) == (10, 10)
    with pytest.raises(ValueError, match=r"set_dim: N = 11 is outside 0 \.\. 10"):
        call.set_dim("N", 11)
    with pytest.raises(ValueError, match=r"set_dim: N = -1 is outside"):
        call.set_dim("N", -1)
    with pytest.raises(ValueError, match=r"set_size: v's N = 11 is outside 0 \.\. 10"):
        call.set_size("v", "N", 11)
    with pytest.raises(ValueError, match="'N' was not named to prepare"):
        attend.prepare([q, cache._k, cache._v, s], [out]).dim_range("N")
    with pytest.raises(ValueError, match=r"dim N is 16 in k but 10 in v"):  # a dim not named must agree
        attend.prepare([q, cache._k, short_v, s], [out])
    # set_size patches one axis: the next call checks that the others agree
    call.set_size("k", "N", 3)
    with pytest.raises(ValueError, match=r"dim N is 3 in k but 10 in v \(dim 2\)"):
        call()
    call.set_size("v", "N", 3)
    call()
    assert_same(out, cache.attend(q, 0.5), rtol=1e-6)
    # the descriptors change only through the setters
    with pytest.raises(ValueError, match="read-only"):
        call.words[call._size_word["k", "N"]] = 99
    # set_data: an array as prepared (dtype, shape, strides; writable for an out), kept alive
    for bad, words in [(np.empty((B, H, 2, Dh), np.float32), r"out0 must be a writable aligned float32 array "
                                                               r"of shape \[2, 3, 1, 4\]"),
                       (np.empty((B, H, 1, Dh), np.float64), "got float64"),
                       (np.empty((B, H, 1, 2 * Dh), np.float32)[..., ::2], "as prepared"),
                       ([[0.0]], "got list")]:
        with pytest.raises(ValueError, match=words):
            call.set_data("out0", bad)
    frozen = np.empty((B, H, 1, Dh), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        call.set_data("out0", frozen)
    import gc
    import weakref
    other = np.empty((B, H, 1, Dh), np.float32)
    alive = weakref.ref(other)
    call.set_data("out0", other)
    del other
    gc.collect()
    assert alive() is not None and alive() is call._buffers[-1]
    # prepare checks what a call checks
    for arrays, outs, exc, words in [
        ([q, cache._k, cache._v], [out], TypeError, "prepare takes 4 arrays and 1 outs"),
        ([q.astype(np.float64), cache._k, cache._v, s], [out], TypeError, "q must have dtype float32"),
        ([q[0], cache._k, cache._v, s], [out], ValueError, "q must have rank 4"),
        ([q, cache._k, cache._v, s], [np.empty((B, H, 2, Dh), np.float32)], ValueError,
         r"out0 dim 2 must be 1 = 1, got 2"),
        ([q, cache._k, cache._v[:, :2], s], [out], ValueError, r"dim H is 3 in k but 2 in v"),
        ([q, cache._k, cache._v, s], [out[..., ::2]], ValueError, "unit innermost stride"),
        ([q, cache._k, cache._v, s], [frozen], ValueError, "out0 must be writable"),
        ([list(q), cache._k, cache._v, s], [out], TypeError, "q must be a numpy.ndarray")]:
        with pytest.raises(exc, match=words):
            attend.prepare(arrays, outs, dims=("N",))
