"""Threaded entries (kina.ir.passes.threads) and their runtime (Function.prepare(threads=)).

Every thread count gives the same bits as the plain entry on one thread: at the
kernel level (an MLP and a softmax over odd, symbolic and static sizes, on 1, 2, 3
and 7 threads, through prepared calls and call_unchecked) and at the model level
(StoryLM's greedy tokens and logits on 1, 2 and 3 threads). The barrier survives
thousands of calls without a hang (each run under a timeout). The .so of a threaded
build needs nothing beyond libc and libm.
"""
from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kina
from kina import runtime
from kina.driver import pipeline
from kina.models import StoryLM

# big enough that the matmuls (K * N * 4 bytes and more) are split, small ops stay on thread 0
MLP = """
let mlp = fn(x: tensor<F32, [1, 1, K], @host>, g: tensor<F32, [1, 1, K], @host>,
             w1: tensor<F32, [K, N], @host>, w2: tensor<F32, [N, M], @host>) -> (tensor<F32, [1, 1, M], @host>) {
  let a = x * broadcast(rsqrt(mean(x * x, axis=2))) * broadcast(g);
  let h = a @ w1;
  (h * sigmoid(h) @ w2)
}

let rows = fn(x: tensor<F32, [1, P, K], @host>, g: tensor<F32, [1, 1, K], @host>,
              w: tensor<F32, [K, N], @host>) -> (tensor<F32, [1, P, N], @host>) {
  let a = x * broadcast(rsqrt(mean(x * x, axis=2))) * broadcast(g);
  (a * sigmoid(a) @ w)
}

let attend = fn(q: tensor<F32, [1, H, 1, D], @host>, k: tensor<F32, [1, H, D, S], @host>,
                v: tensor<F32, [1, H, S, D], @host>) -> (tensor<F32, [1, H, 1, D], @host>) {
  (softmax(q @ k, axis=3) @ v)
}
"""


@pytest.fixture(scope="module")
def symbolic():
    return kina.compile_source(MLP, "mlp.kina")


def mlp_inputs(K, N, M, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    return [r(1, 1, K), r(1, 1, K), r(K, N) / np.float32(np.sqrt(K)), r(N, M) / np.float32(np.sqrt(N))]


def threaded_results(fn, args, threads):
    """`fn` on `args` through a prepared call on `threads` threads (the threaded entry for > 1)."""
    arrays, env = fn._bind(args)
    outs = [runtime.empty(shape, r.dtype) for shape, r in zip(runtime.result_shapes(fn.signature, env),
                                                                 fn(*args, threads=1))]
    fn.prepare(arrays, outs, threads=threads)()
    return outs


def test_functions_get_a_threaded_entry(symbolic):
    assert symbolic.mlp.threaded and symbolic.attend.threaded


@pytest.mark.parametrize("K,N,M", [(576, 1536, 576), (301, 1001, 577), (7, 3, 1), (1000, 17, 2000)])
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_mlp_is_bit_identical_on_any_thread_count(symbolic, K, N, M, threads):
    args = mlp_inputs(K, N, M)
    (want,) = symbolic.mlp(*args, threads=1)
    (got,) = threaded_results(symbolic.mlp, args, threads)
    assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("P", [1, 5, 17, 33, 130])
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_row_wise_ops_run_as_one_task_with_the_same_bits(symbolic, P, threads):
    """`rows`' ops before the matmul are cut along P and run as one task (threads{fuse}):
    each part's rows through all of them in turn."""
    rng = np.random.default_rng(P)
    K, N = 576, 384
    args = [rng.standard_normal(s).astype(np.float32) for s in [(1, P, K), (1, 1, K), (K, N)]]
    (want,) = symbolic.rows(*args, threads=1)
    (got,) = threaded_results(symbolic.rows, args, threads)
    assert got.shape == (1, P, N) and np.array_equal(got, want)


@pytest.mark.parametrize("S", [0, 1, 33, 4099])
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_attention_with_a_symbolic_length_is_bit_identical(symbolic, S, threads):
    rng = np.random.default_rng(S)
    H, D = 5, 64
    args = [rng.standard_normal(s).astype(np.float32) for s in [(1, H, 1, D), (1, H, D, S), (1, H, S, D)]]
    (want,) = symbolic.attend(*args, threads=1)
    (got,) = threaded_results(symbolic.attend, args, threads)
    assert np.array_equal(got, want, equal_nan=True)


def test_a_grown_cache_then_a_matmul_with_its_transpose_compiles():
    # _fusable compared the extent of a dim held by a value (k's S+1 rows) with an unknown one
    # (None), which an MLIR value's == refuses: 'threads' raised a TypeError on this program
    source = """
let step = fn(k_past: tensor<F32, [S, 4], @host>, k_new: tensor<F32, [1, 4], @host>) -> (tensor<F32, [1, S+1], @host>) {
  let k = concat[axis=0] k_past k_new;
  let kn = k * k;
  (k_new @ transpose[perm=[1, 0]] kn)
}
"""
    rng = np.random.default_rng(0)
    k_past, k_new = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((1, 4)).astype(np.float32)
    (got,) = kina.compile_source(source, "grown.kina").step(k_past, k_new)
    k = np.concatenate([k_past, k_new])
    np.testing.assert_allclose(got, k_new @ (k * k).T, rtol=1e-5)


def test_a_static_specialisation_is_bit_identical():
    static = kina.compile_source(MLP.split("let attend")[0], "mlp.kina", dims={"K": 333, "N": 1111, "M": 555})
    args = mlp_inputs(333, 1111, 555, seed=1)
    (want,) = static.mlp(*args, threads=1)
    for threads in (2, 3, 7):
        (got,) = threaded_results(static.mlp, args, threads)
        assert np.array_equal(got, want)


TWO = """
let two = fn(x: tensor<F32, [1, 1, K], @host>, w1: tensor<F32, [K, N], @host>, w2: tensor<F32, [K, N], @host>)
    -> (tensor<F32, [1, 1, N], @host>, tensor<F32, [1, 1, K], @host>, tensor<F32, [1, 1, N], @host>) {
  (x @ w1, x * x, x @ w2)
}

let dep = fn(x: tensor<F32, [1, 1, K], @host>, w1: tensor<F32, [K, N], @host>, w2: tensor<F32, [K, N], @host>)
    -> (tensor<F32, [1, 1, N], @host>, tensor<F32, [1, 1, K], @host>, tensor<F32, [1, 1, N], @host>) {
  (x @ w1, x * x, (x + x) @ w2)
}
"""


@pytest.mark.parametrize("K,N", [(576, 1536), (256, 8192), (96, 1000)])
def test_a_matmul_moved_past_small_ops_into_the_chain_before_gives_the_same_bits(K, N):
    """In `two`, x @ w2 runs in the same parts as x @ w1, before the small ops between them
    (x @ w1's partial sums, x * x), which touch nothing it reads or writes (threads'
    _chains); in `dep`, (x + x) @ w2 reads what the small ops write, and stays after them:
    every result as on one thread, on 2, 3 and 7."""
    two = kina.compile_source(TWO, "two.kina", dims={"K": K, "N": N})
    # a task fewer in `two`: x @ w2 joined x @ w1's (and still does when the fill of x @ w1's
    # sums went into x @ w1's split-k parts: ops of different extents in one task)
    assert two.two._counter_bytes < two.dep._counter_bytes
    rng = np.random.default_rng(K)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(1, 1, K), (K, N), (K, N)]]
    x, w1, w2 = args
    for fn, lhs in ((two.two, x), (two.dep, x + x)):
        want = fn(*args, threads=1)
        np.testing.assert_allclose(want[0], x @ w1, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(want[1], x * x)
        np.testing.assert_allclose(want[2], lhs @ w2, rtol=1e-4, atol=1e-4)
        for threads in (2, 3, 7):
            for got, w in zip(threaded_results(fn, args, threads), want):
                assert np.array_equal(got, w)


def test_without_the_copy_one_thread_runs_the_entry_with_the_same_bits(symbolic):
    """threads{copy=false}: each function is a call of its entry on one thread (its own
    workspace, counters zeroed per call, so calls may repeat), with the same bits."""
    called = kina.compile_source(MLP, "mlp.kina", pipeline.Options(pass_options="threads{copy=false}"))
    assert called.path.stat().st_size < 0.8 * symbolic.path.stat().st_size  # the loops are there once, not twice
    for K, N, M in [(576, 1536, 576), (301, 1001, 577), (7, 3, 1)]:
        args = mlp_inputs(K, N, M, seed=K)
        (want,) = symbolic.mlp(*args, threads=1)
        for _ in range(2):
            assert np.array_equal(called.mlp(*args, threads=1)[0], want)
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(1, 5, 1, 64), (1, 5, 64, 33), (1, 5, 33, 64)]]
    assert np.array_equal(called.attend(*args, threads=1)[0], symbolic.attend(*args, threads=1)[0])
    assert np.array_equal(threaded_results(called.attend, args, 2)[0], symbolic.attend(*args, threads=1)[0])


def claims(lib, parts: int, order: list[int], nthreads: int) -> list[tuple[int, int]]:
    """(thread, part) of each call of kina_claim on one task's zeroed word, by the threads in
    `order` (each claiming once per turn), until every one has been told none is left."""
    word, out, done = ctypes.c_int64(0), [], set()
    while len(done) < len(set(order)):
        for t in order:
            if t in done:
                continue
            c = lib.kina_claim(ctypes.addressof(word), parts, t, nthreads)
            if c >= parts:
                done.add(t)
            else:
                out.append((t, c))
    return out


def test_a_thread_claims_its_own_range_in_order_then_the_last_free_part(symbolic):
    """kina_claim (kina_threads.c, in the .so): thread t of n takes the parts of its range
    [t P / n, (t + 1) P / n) front to back, then the last part still free: every part once.
    One thread, or more than 64 parts, counts 0, 1, 2, ... Turns interleave here as threads would."""
    lib = symbolic._lib
    lib.kina_claim.restype, lib.kina_claim.argtypes = ctypes.c_int64, [ctypes.c_void_p] + [ctypes.c_int64] * 3
    assert claims(lib, 8, [0, 1], 2) == [(0, 0), (1, 4), (0, 1), (1, 5), (0, 2), (1, 6), (0, 3), (1, 7)]
    # thread 1 is late: thread 0 runs its own range, then takes thread 1's from the back
    assert claims(lib, 8, [0], 2) == [(0, p) for p in (0, 1, 2, 3, 7, 6, 5, 4)]
    late = claims(lib, 6, [0, 0, 0, 0, 1], 3)  # thread 2 never comes; thread 1 has one turn in five
    assert sorted(p for _, p in late) == list(range(6)) and late[:3] == [(0, 0), (0, 1), (0, 5)]
    assert claims(lib, 1, [1, 0], 2) == [(1, 0)]  # one part: whoever comes first
    assert claims(lib, 3, [0], 1) == [(0, 0), (0, 1), (0, 2)]
    many = claims(lib, 100, [0, 1], 2)
    assert [p for _, p in many] == list(range(100))


@pytest.mark.parametrize("K, N, M, threaded", [(576, 1536, 576, True), (64, 768, 64, True),
                                               (64, 384, 64, False)])
def test_a_call_takes_the_threaded_entry_from_threaded_min_bytes(symbolic, monkeypatch, K, N, M, threaded):
    """A public call on 2 or 3 threads runs the threaded entry when it moves at least
    THREADED_MIN_BYTES (7 MiB of weights, and 384 KiB: w1 and w2 of 192 KiB each), one thread
    below it (192 KiB), with the same bits either way."""
    args = mlp_inputs(K, N, M)
    (want,) = symbolic.mlp(*args, threads=1)
    entered = []
    run_threaded = runtime.calls.Function._run_threaded
    monkeypatch.setattr(runtime.calls.Function, "_run_threaded",
                        lambda self, *a, **kw: entered.append(a[1]) or run_threaded(self, *a, **kw))
    for threads in (2, 3):
        (got,) = symbolic.mlp(*args, threads=threads)
        assert np.array_equal(got, want)
    assert entered == ([2, 3] if threaded else [])


def run_with_timeout(fn, seconds: float) -> None:
    """fn() on a thread; fail (rather than hang the suite) if it has not returned in `seconds`."""
    errors = []

    def body():
        try:
            fn()
        except BaseException as e:  # reported below
            errors.append(e)
    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"no return after {seconds} s: a barrier hangs"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("threads", [2, 3])
def test_the_barrier_holds_over_many_calls(symbolic, threads):
    args = mlp_inputs(256, 384, 256)  # small: each call is mostly barriers and hand-over
    (want,) = symbolic.mlp(*args, threads=1)
    arrays, env = symbolic.mlp._bind(args)
    out = runtime.empty(want.shape, want.dtype)
    call = symbolic.mlp.prepare(arrays, [out], threads=threads)

    def many():
        for i in range(2000):
            call()
            if i % 500 == 0:
                assert np.array_equal(out, want)
    run_with_timeout(many, 300)
    assert np.array_equal(out, want)


def test_only_the_counters_are_zeroed_between_calls(symbolic):
    """Before each call the runtime zeroes the workspace's task counters only
    (`kina_<f>_counters` bytes): the temporaries after them are written before they are
    read. Garbage left there, and new inputs, still give the one-thread results."""
    fn = symbolic.mlp
    args = mlp_inputs(256, 384, 256, seed=1)
    arrays, _ = fn._bind(args)
    out = runtime.empty((1, 1, 256), np.float32)
    call = fn.prepare(arrays, [out], threads=2)
    call()
    bytes_needed = fn._workspace_bytes(*call._pointers)
    assert 0 < fn._counter_bytes < bytes_needed
    ws = call._workspace._buffer
    ws[fn._counter_bytes:bytes_needed] = 0xFF  # NaNs in every temporary
    fresh = mlp_inputs(256, 384, 256, seed=2)
    for a, b in zip(arrays, fresh):
        a[...] = b
    call()
    assert np.array_equal(out, fn(*fresh, threads=1)[0])


def test_concurrent_callers_each_have_their_own_workspace(symbolic):
    args = mlp_inputs(576, 1536, 576)
    (want,) = symbolic.mlp(*args, threads=1)
    bad = []

    def caller():
        for _ in range(20):
            (got,) = symbolic.mlp(*args, threads=2)
            bad.append(not np.array_equal(got, want))
    def three_callers():
        callers = [threading.Thread(target=caller) for _ in range(3)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
    run_with_timeout(three_callers, 300)
    assert bad and not any(bad)


def test_the_so_needs_only_libc_and_libm(symbolic):
    readelf = pipeline.toolchain.find("llvm-readelf")
    dynamic = subprocess.run([readelf, "-d", str(symbolic.path)], capture_output=True, text=True, check=True).stdout
    needed = {line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line}
    assert needed <= {"libc.so.6", "libm.so.6"}, needed


@pytest.fixture(scope="module")
def model():
    return StoryLM(vocab_size=1000, d_model=256, n_heads=4, n_kv_heads=2, n_layers=2, ffn_dim=704,
                   max_seq_len=48, threads=1)


def test_storylm_tokens_and_logits_are_bit_identical_on_1_2_and_3_threads(model):
    results = {}
    for threads in (1, 2, 3):
        model.threads = threads
        cache = model.new_cache()
        logits = [model.prefill([3, 1, 4, 1, 5], cache)]
        tokens = []
        for _ in range(12):
            tokens.append(int(np.argmax(logits[-1])))
            logits.append(model.step(tokens[-1], cache))
        logits.append(model.prefill(list(range(20, 37)), cache))  # a second chunk, after 17 cached positions
        results[threads] = tokens, np.stack(logits)
    model.threads = 1
    kernels = model._kernels
    assert kernels.decoder_step.threaded and kernels.decoder_prefill.threaded and kernels.logits.threaded
    for threads in (2, 3):
        assert results[threads][0] == results[1][0]
        assert np.array_equal(results[threads][1], results[1][1])
    model.threads = 2
    assert model.generate([3, 1, 4, 1, 5], 12) == results[1][0]
    model.threads = 1


def test_closing_a_module_stops_its_team():
    m = kina.compile_source(MLP, "mlp.kina")
    args = mlp_inputs(576, 1536, 576)
    (want,) = m.mlp(*args, threads=1)
    (got,) = m.mlp(*args, threads=2)
    assert np.array_equal(got, want) and m._teams
    team = next(iter(m._teams.values()))
    run_with_timeout(m.close, 60)
    assert not team._threads and not m._teams


SLEEPERS_AT = 232  # kina_threads.c: offsetof(kina_team, sleepers), in the Team's 256-byte state


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the futex is Linux's (elsewhere workers nap)")
def test_workers_asleep_between_calls_wake_for_the_next_call_and_for_close():
    """After about a millisecond without a call a worker sleeps on a futex: the next call
    rings it awake (the same bits), and close() rings it to stop; a ring that missed it
    would leave it asleep for good, and close() would hang."""
    m = kina.compile_source(MLP, "mlp.kina")
    args = mlp_inputs(576, 1536, 576)
    (want,) = m.mlp(*args, threads=1)
    for _ in range(3):
        (got,) = m.mlp(*args, threads=2)
        assert np.array_equal(got, want)
        team = next(iter(m._teams.values()))
        time.sleep(0.05)
        assert int.from_bytes(team._state.raw[SLEEPERS_AT:SLEEPERS_AT + 8], "little") == 1, "the worker is not asleep"
    run_with_timeout(m.close, 60)
    assert not team._threads


def test_a_function_of_many_parameters_runs_on_the_team_with_the_same_bits():
    """The team calls every threaded entry through its kina_<f>_team (team-entries), so
    arity is no limit: 60 parameters, each added in order, on 1, 2 and 3 threads."""
    n = 60
    params = ", ".join(f"a{i}: tensor<F32, [64, 1024], @host>" for i in range(n))
    body = " + ".join(f"a{i}" for i in range(n))
    m = kina.compile_source(f"let f = fn({params}) -> (tensor<F32, [64, 1024], @host>) {{\n  ({body})\n}}\n", "many.kina")
    rng = np.random.default_rng(6)
    args = [rng.standard_normal((64, 1024)).astype(np.float32) for _ in range(n)]
    want = args[0]
    for a in args[1:]:
        want = want + a
    assert m.f.threaded and m.f._team_entry is not None
    for threads in (1, 2, 3):
        assert np.array_equal(threaded_results(m.f, args, threads)[0], want), threads
    assert set(m._teams) == {1, 2}  # the 2- and 3-thread calls ran on the team's workers
    m.close()
