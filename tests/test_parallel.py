"""Recycled results (kina.runtime.pool), calls on several threads (kina.runtime), and which
leading axes of a function are independent (kina.frontend.axes).

Results of large calls reuse the memory of dead results, so a host loop feeding each
step's results back allocates a few blocks and then none; memory kept stays under
the limit. A call on any number of threads (its threaded entry) gives the same bits as
one thread, for the public call, call_into and the in-place KVCache step, with NaN in
unused cache slots, strided views, S = 0 and 1, and concurrent calls from several Python
threads (the team busy with one, the others on worker threads).
"""
from __future__ import annotations

import faulthandler
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

import kina
from conftest import DYN_TEXT, assert_same, kv_inputs
from kina.frontend import check
from kina.runtime import pool
from kina import runtime
from kina.runtime import calls
from kina.frontend import syntax
from kina.runtime import workers
from kina.frontend.axes import independent_axes

MIB = 1 << 20


@pytest.fixture(scope="module")
def step():
    return kina.compile_source(DYN_TEXT, "dyn.kina").kv_step


# -- kina.runtime.pool -----------------------------------------------------------------------------

def test_size_classes_round_up_by_at_most_a_sixteenth():
    for n in [1, 63, 64, 1000, MIB, MIB + 1, 3 * MIB + 12345, 1 << 33]:
        c = pool.size_class(n)
        assert n <= c <= max(n * 17 // 16 + 64, 64) and c % 64 == 0
    assert pool.size_class(64 * MIB + 16 * 1024) == pool.size_class(64 * MIB + 32 * 1024), \
        "a cache growing by one position stays in its class"


def test_pooled_arrays_are_plain_aligned_arrays_and_their_memory_comes_back():
    p = pool.Pool()
    a = p.empty((4, MIB // 4), np.float32)
    assert type(a) is np.ndarray and a.flags.writeable and a.flags.c_contiguous
    assert a.ctypes.data % 64 == 0 and a.shape == (4, MIB // 4)
    address = a.ctypes.data
    del a
    gc.collect()
    b = p.empty((4, MIB // 4), np.float32)
    assert b.ctypes.data == address and (p.allocated, p.reused) == (1, 1)


def test_a_live_view_keeps_its_block_out_of_the_pool():
    p = pool.Pool()
    a = p.empty((2 * MIB,), np.uint8)
    view = a[MIB:]
    view[:] = 7
    del a
    gc.collect()
    b = p.empty((2 * MIB,), np.uint8)
    b[:] = 1
    assert not np.shares_memory(b, view) and (view == 7).all() and p.allocated == 2


def test_small_results_are_not_pooled():
    p = pool.Pool()
    for _ in range(10):
        p.empty((1000,), np.float32)
    assert p.allocated == p.reused == p.kept_bytes == 0


def test_kept_memory_stays_under_the_limit_and_is_released():
    p = pool.Pool(limit=5 * MIB)
    blocks = [p.empty((MIB * 2,), np.uint8) for _ in range(4)]
    del blocks
    gc.collect()
    assert 0 < p.kept_bytes <= 5 * MIB
    p.set_limit(0)
    assert p.kept_bytes == 0
    p.set_limit(64 * MIB)
    x = p.empty((MIB * 2,), np.uint8)
    del x
    gc.collect()
    assert p.kept_bytes > 0 and p.release() > 0 and p.kept_bytes == 0
    with pytest.raises(ValueError, match="limit: expected a non-negative number of bytes"):
        p.set_limit(-1)


def test_blocks_come_back_from_other_threads():
    p = pool.Pool()
    arrays = [p.empty((MIB,), np.uint8) for _ in range(8)]
    threads = [threading.Thread(target=arrays.pop) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert p.kept_bytes == 8 * pool.size_class(MIB + pool.ALIGN)


def test_a_host_loop_of_1000_calls_reuses_a_few_sets_of_results(step):
    """Section 19's host loop: each step's caches are the next step's inputs (8 MiB caches)."""
    B, H, Dh, S = 1, 8, 64, 2047
    q, k, k_new, v, v_new, scale = kv_inputs(B, H, Dh, S)
    before = runtime.RESULTS.allocated
    for i in range(1000):
        k_next, v_next, context = step(q, k, k_new, v, v_new, scale)
        k, v = k_next[..., :S], v_next[:, :, :S]  # the cache stays at S positions: a steady loop
    assert runtime.RESULTS.allocated - before <= 6, "a steady loop must stop allocating fresh blocks"
    assert runtime.RESULTS.kept_bytes <= pool.DEFAULT_LIMIT


# -- independent axes ------------------------------------------------------------------------------

def _axes(source: str) -> int:
    return independent_axes(check.check(syntax.parse(source)).functions[0])


X = "tensor<F32, [B, H, 4, 4], @host>"  # B and H symbolic: static dims never count (see below)


@pytest.mark.parametrize("body, results, want", [
    ("(softmax(x, axis=3))", X, 2),  # not 3: axis 2 is static
    ("(softmax(x, axis=0))", X, 0),
    ("(concat[axis=1] x x)", "tensor<F32, [B, H+H, 4, 4], @host>", 1),
    ("(x @ y)", X, 2),
    ("(x * broadcast(s))", X, 2),
    ("(x + x, softmax(x, axis=2))", f"{X}, {X}", 2),
])
def test_independent_axes(body, results, want):
    source = (f"let f = fn(x: {X}, y: {X}, s: tensor<F32, [1, 1, 1, 1], @host>) -> ({results}) {{\n"
              f"  {body}\n}}\n")
    assert _axes(source) == want


def test_the_step_has_two_independent_axes_and_unaligned_dims_stop_the_count(step):
    assert step.independent_axes == 2
    source = ("let f = fn(x: tensor<F32, [A, 4], @host>, y: tensor<F32, [B, 4], @host>) "
              "-> (tensor<F32, [A+B, 4], @host>) {\n  (concat[axis=0] x y)\n}\n")
    assert _axes(source) == 0


# -- threads: the same bits ----------------------------------------------------------------------

@pytest.mark.parametrize("B, H, Dh, S", [(1, 32, 64, 300), (2, 8, 128, 257), (1, 16, 64, 0), (3, 5, 32, 1)])
def test_any_thread_count_gives_the_same_bits(step, B, H, Dh, S, monkeypatch):
    monkeypatch.setattr(calls, "THREADED_MIN_BYTES", 0)  # threads even for small calls
    args = kv_inputs(B, H, Dh, S, seed=S)
    want = step(*args, threads=1)
    for threads in (2, 3, 4, 7):
        for i, (got, w) in enumerate(zip(step(*args, threads=threads), want)):
            assert_same(got, w, what=f"result {i} on {threads} threads")
    outs = [runtime.empty(w.shape) for w in want]
    step.call_into(args, outs, threads=3)
    for got, w in zip(outs, want):
        assert_same(got, w)


def test_threads_on_strided_views(step, monkeypatch):
    monkeypatch.setattr(calls, "THREADED_MIN_BYTES", 0)
    q, k, k_new, v, v_new, scale = kv_inputs(1, 6, 32, 40, seed=1)
    big_k = np.full((1, 12, 32, 64), np.nan, np.float32)
    big_k[:, ::2, :, :40] = k
    k_view = big_k[:, ::2, :, :40]  # every other head, a prefix of the positions
    want = step(q, k, k_new, v, v_new, scale, threads=1)
    for got, w in zip(step(q, k_view, k_new, v, v_new, scale, threads=4), want):
        assert_same(got, w)


def test_concurrent_calls_from_python_threads(step, monkeypatch):
    monkeypatch.setattr(calls, "THREADED_MIN_BYTES", 0)
    inputs = [kv_inputs(1, 8, 64, 100 + 10 * i, seed=i) for i in range(6)]
    want = [step(*a, threads=1) for a in inputs]
    got = [None] * len(inputs)

    def run(i):
        for _ in range(5):
            got[i] = step(*inputs[i], threads=2)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert_same(a, b)


@pytest.mark.parametrize("B, H", [(1, 8), (3, 2)])
def test_in_place_step_on_threads_with_nan_in_unused_slots(monkeypatch, B, H):
    """KVCache runs its prepared call on the threaded entry: the same bits as one
    thread, after every step, and after its thread count changes."""
    from kina.models import KVCache
    monkeypatch.setattr(runtime, "THREADED_MIN_BYTES", 0)  # as KVCache reads it
    Dh = 32
    caches = [KVCache(B, H, Dh, 64, threads=n) for n in (1, 2, 5)]
    for c in caches:
        c._k[:], c._v[:] = np.nan, np.nan  # unused slots never reach a result
    for t in range(8):
        if t == 4:
            caches[1].threads, caches[2].threads = 3, 2
        q, _, k_new, _, v_new, _ = kv_inputs(B, H, Dh, 0, seed=t)
        got = [c.step(q, k_new, v_new, 0.125) for c in caches]
        for g in got[1:]:
            assert_same(g, got[0], what=f"step {t}")


def test_bad_thread_counts_are_clear_errors(step, monkeypatch):
    args = kv_inputs(1, 2, 4, 3)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"kv_step\(\): threads must be a positive integer"):
            step(*args, threads=bad)
    monkeypatch.setenv("KINA_NUM_THREADS", "two")
    with pytest.raises(ValueError, match="KINA_NUM_THREADS: expected a positive integer, got 'two'"):
        step(*args)
    monkeypatch.setenv("KINA_NUM_THREADS", "3")
    assert runtime.default_threads() == 3


@pytest.mark.parametrize("body, results, want", [
    ("(sum(x, axis=2))", "tensor<F32, [B, H, 1, 4], @host>", 2),
    ("(transpose[perm=[0, 2, 1, 3]] x)", "tensor<F32, [B, 4, H, 4], @host>", 1),
    ("(reshape[dims=[B, H, 16]] x)", "tensor<F32, [B, H, 16], @host>", 0),
    ("(reshape[dims=[B, H, 2, 8]] x)", "tensor<F32, [B, H, 2, 8], @host>", 2),
    ("(slice[axis=3, start=0, size=2] x)", "tensor<F32, [B, H, 4, 2], @host>", 2),
    ("(exp(x) - x / 2)", X, 2),
    ("(x @ w)", X, 2),
])
def test_independent_axes_of_the_decoder_ops(body, results, want):
    source = (f"let f = fn(x: {X}, w: tensor<F32, [4, 4], @host>) -> ({results}) {{\n  {body}\n}}\n")
    assert _axes(source) == want


def test_static_leading_dims_are_never_split():
    """A static extent is a constant in the kernel's loops: a part would still run over all of
    it (a static broadcast matmul split by heads read and wrote out of bounds)."""
    source = ("let f = fn(x: tensor<F32, [1, 1, 1, 512], @host>, w: tensor<F32, [11, 512, 128], @host>) "
              "-> (tensor<F32, [1, 11, 1, 128], @host>) {\n  (x @ w)\n}\n")
    assert _axes(source) == 1  # axis 0: all ones, nothing to split; axis 1: the static 11 stops it
    fn = kina.compile_source(source, "static.kina").f
    r = np.random.default_rng(0)
    x, w = r.standard_normal((1, 1, 1, 512)).astype(np.float32), r.standard_normal((11, 512, 128)).astype(np.float32)
    (got,) = fn(x, w, threads=4)
    np.testing.assert_allclose(got, np.matmul(x, w), rtol=1e-4, atol=1e-4)
    static_step = kina.compile_source(DYN_TEXT, "dyn.kina", dims=dict(B=1, H=32, Dh=64, S=300)).kv_step
    assert static_step.independent_axes == 1  # B = 1: nothing to split; H = 32 static: not split


# -- kina.runtime.workers --------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _hang_is_a_failure():
    """A hand-over that hangs fails the run (with every thread's stack) instead of stalling it."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _recorder():
    """A part that records which thread ran it and the cores that thread was bound to."""
    seen = []

    def part(tag):
        seen.append((tag, threading.current_thread() is threading.main_thread(), os.sched_getaffinity(0)))
    return seen, part


def test_workers_are_bound_off_the_callers_core_and_the_caller_gets_its_binding_back(monkeypatch):
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("one core: nothing to bind apart")
    here = min(cpus)
    monkeypatch.setattr(workers, "_sched_getcpu", lambda: here)
    seen, part = _recorder()
    workers.run_concurrently(part, [[0], [1]])
    (_, main, main_cpus), = [r for r in seen if r[0] == 0]
    (_, worker_main, worker_cpus), = [r for r in seen if r[0] == 1]
    assert main and not worker_main
    assert len(worker_cpus) == 1 and here not in worker_cpus  # bound, and not to the caller's core
    assert not (main_cpus & worker_cpus)  # the caller was off the worker's core for the call
    assert os.sched_getaffinity(0) == cpus  # and has its binding back


def test_a_caller_bound_to_one_core_keeps_it(step, monkeypatch):
    monkeypatch.setattr(calls, "THREADED_MIN_BYTES", 0)
    cpus = os.sched_getaffinity(0)
    args = kv_inputs(1, 4, 8, 5)
    want = step(*args, threads=1)
    one = {max(cpus)}
    os.sched_setaffinity(0, one)
    try:
        for got, w in zip(step(*args, threads=2), want):
            assert_same(got, w)
        assert os.sched_getaffinity(0) == one
    finally:
        os.sched_setaffinity(0, cpus)


def test_a_part_that_raises_raises_in_the_caller_after_every_part_is_done():
    cpus = os.sched_getaffinity(0)
    done = []

    def part(tag):
        if tag == 0:  # the caller's own part fails at once
            raise ValueError("part 0 failed")
        time.sleep(0.05)
        done.append(tag)
        if tag == 2:
            raise RuntimeError("part 2 failed")
    with pytest.raises(ValueError, match="part 0 failed"):
        workers.run_concurrently(part, [[0], [1], [2]])
    assert sorted(done) == [1, 2]  # the caller waited for both workers before raising
    with pytest.raises(RuntimeError, match="part 2 failed"):
        workers.run_concurrently(part, [[1], [2]])
    assert os.sched_getaffinity(0) == cpus
    seen, ok = _recorder()
    workers.run_concurrently(ok, [[0], [1], [2]])  # the workers that saw an exception still run parts
    assert sorted(r[0] for r in seen) == [0, 1, 2]


def test_an_interrupted_wait_waits_on_then_raises(monkeypatch):
    """A signal that raises while the caller waits (Ctrl-C) is raised only after every part
    has finished: no part may write into buffers its caller has let go."""
    done = []

    def part(tag):
        if tag == 0:
            signal.setitimer(signal.ITIMER_REAL, 0.01)  # fires while the caller waits for part 1
            return
        time.sleep(0.1)
        done.append(tag)

    def interrupt(*_):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            workers.run_concurrently(part, [[0], [1]])
    finally:
        signal.signal(signal.SIGALRM, old)
    assert done == [1]
    seen, ok = _recorder()
    workers.run_concurrently(ok, [[0], [1]])  # and the pool still works
    assert len(seen) == 2


# JAX (imported by test_arrays in the same session) warns at every fork that its threads may
# deadlock the child; this child runs no JAX, and its alarm ends it if anything hangs.
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_a_forked_child_starts_with_no_workers():
    seen, part = _recorder()
    workers.run_concurrently(part, [[0], [1]])  # the parent has an idle worker now
    pid = os.fork()
    if pid == 0:  # the child: its copy of that worker has no thread behind it
        try:
            signal.alarm(10)
            workers.run_concurrently(lambda tag: None, [[0], [1]])
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_parts_go_to_the_least_busy_cores(monkeypatch):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one core")
    monkeypatch.setattr(workers, "_sched_getcpu", lambda: cpus[0])
    pool = workers._Pool()
    first = pool.take(1)
    assert first[0].cpu == cpus[1]  # not the caller's core
    second = pool.take(len(cpus))  # more parts than free cores: the least busy first
    counts = {c: sum(w.cpu == c for w in first + second) for c in cpus}
    assert max(counts.values()) - min(counts.values()) <= 1
    pool.give_back(first + second)
    assert all(n == 0 for n in pool.running.values())
    again = pool.take(1)[0]
    assert again is first[0] or again.cpu == cpus[1] and again in first + second  # an idle one, reused


def test_without_binding_the_parts_still_run(monkeypatch):
    """Where the system cannot say or set a thread's cores, workers run unbound."""
    monkeypatch.setattr(workers, "_pool", workers._Pool())
    monkeypatch.setattr(workers, "cpus", lambda: None)
    seen, part = _recorder()
    workers.run_concurrently(part, [[0], [1], [2]])
    assert sorted(r[0] for r in seen) == [0, 1, 2]
    assert all(w.cpu is None for ws in workers._pool.idle.values() for w in ws)


def test_a_started_tool_whose_feed_is_interrupted_is_killed():
    from kina.driver import toolchain
    started = toolchain.Started("opt", ["-S", "-", "-o", "-"])

    real = started._proc.communicate

    def interrupted(*a, **k):  # the first feed is interrupted (Ctrl-C); later calls are real
        started._proc.communicate = real
        raise KeyboardInterrupt
    started._proc.communicate = interrupted
    with pytest.raises(KeyboardInterrupt):
        started.finish(b"", ["-S", "x.ll"])
    assert started._proc.wait(timeout=10) == -9  # killed, not left waiting for its input
