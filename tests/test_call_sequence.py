"""CallSequence: prepared calls of one module run in order in one entry from the host.

A chain of calls, each reading the one before's result, gives the bits of the same
calls made one by one, on 1, 2 and 3 threads, with a function that has no threaded
entry among them; the calls share one workspace, sized when they were prepared for the
largest sizes a patch may give them, and a patched size up to those runs in it (so does a
prepared call's run alone, in its own workspace); a module
without the C runner (-O0), and a team busy with another call, fall back to calls
made one by one, with the same bits; mistakes are TypeErrors or ValueErrors that name
what was wrong.
"""
from __future__ import annotations

import numpy as np
import pytest

import kina
from kina import runtime
from kina.driver.pipeline import Options

# mlp's output is its input's shape, so calls chain; double is too small to be split
SRC = """
let mlp = fn(x: tensor<F32, [1, 1, K], @host>, w1: tensor<F32, [K, N], @host>,
             w2: tensor<F32, [N, K], @host>) -> (tensor<F32, [1, 1, K], @host>) {
  let h = x @ w1;
  (h * sigmoid(h) @ w2)
}

let double = fn(x: tensor<F32, [1, 1, K], @host>) -> (tensor<F32, [1, 1, K], @host>) {
  (x + x)
}

let attend = fn(q: tensor<F32, [1, H, 1, D], @host>, k: tensor<F32, [1, H, D, S], @host>,
                v: tensor<F32, [1, H, S, D], @host>) -> (tensor<F32, [1, H, 1, D], @host>) {
  (softmax(q @ k, axis=3) @ v)
}
"""
K, N = 576, 1536


@pytest.fixture(scope="module")
def module():
    m = kina.compile_source(SRC, "seq.kina", dims={"K": K, "N": N})
    yield m
    m.close()


def chain(m, n_layers: int, seed: int = 0):
    """n_layers mlp calls and a double between each pair, xs[i] -> xs[i + 1]: (calls, xs)."""
    rng = np.random.default_rng(seed)
    xs = [runtime.empty((1, 1, K), np.float32) for _ in range(2 * n_layers + 1)]
    xs[0][...] = rng.standard_normal((1, 1, K))
    calls = []
    for i in range(n_layers):
        w1 = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        w2 = (rng.standard_normal((N, K)) / np.sqrt(N)).astype(np.float32)
        calls.append(m.mlp.prepare([xs[2 * i], w1, w2], [xs[2 * i + 1]]))
        calls.append(m.double.prepare([xs[2 * i + 1]], [xs[2 * i + 2]]))
    return calls, xs


def one_by_one(calls, xs, threads):
    for c in calls:
        c.threads = threads
        c()
    return xs[-1].copy()


def test_the_module_has_the_runner_and_every_function_its_packed_form(module):
    assert all(f._packed is not None for f in module.functions.values())
    assert module.mlp.threaded and not module.double.threaded
    assert runtime.CallSequence(chain(module, 1)[0])._native


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_chain_gives_the_bits_of_its_calls_one_by_one(module, threads):
    calls, xs = chain(module, 4)
    want = one_by_one(calls, xs, 1)
    for x in xs[1:]:
        x[...] = np.nan
    seq = runtime.CallSequence(calls, threads=threads)
    seq()  # in the given order: a call run early would read a NaN
    assert np.array_equal(xs[-1], want)
    for x in xs[1:]:
        x[...] = np.nan
    seq()  # again: each call's task counters are zeroed before it runs
    assert np.array_equal(xs[-1], want)


@pytest.mark.parametrize("alone", [False, True])  # in a sequence, or a prepared call run by itself
@pytest.mark.parametrize("threads", [1, 2])
def test_patched_sizes_up_to_the_largest_run_in_the_workspace_sized_at_prepare(module, threads, alone):
    rng = np.random.default_rng(1)
    H, D, S = 9, 64, 2047
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(1, H, 1, D), (1, H, D, S), (1, H, S, D)])
    out = runtime.empty((1, H, 1, D), np.float32)
    call = module.attend.prepare([q, k, v], [out], dims=("S",), threads=threads)
    seq = call if alone else runtime.CallSequence([call], threads=threads)
    workspace = call._workspace if alone else seq._workspace
    for s in (1, 33, S):  # each run needs more workspace than the one before
        call.set_dim("S", s)
        seq()
        if threads > 1:  # sized once, for S at its largest, without asking the entry again
            assert workspace.capacity == call._most_workspace == module.attend._workspace_bytes(
                *module.attend.prepare([q, k, v], [out], dims=("S",))._pointers)
        (want,) = module.attend(q, np.ascontiguousarray(k[..., :s]), v[:, :, :s], threads=1)
        assert np.array_equal(out, want), s


def test_the_calls_share_one_workspace_the_size_of_the_largest_need(module):
    rng = np.random.default_rng(3)
    H, D, S = 9, 64, 300
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(1, H, 1, D), (1, H, D, S), (1, H, S, D)])
    outs = [runtime.empty((1, H, 1, D), np.float32) for _ in range(2)]
    attends = [module.attend.prepare([q, k, v], [out], dims=("S",)) for out in outs]
    calls, xs = chain(module, 2)
    seq = runtime.CallSequence([calls[0], attends[0], *calls[1:], attends[1]], threads=2)
    attends[1].set_dim("S", 7)  # the two attends need different workspaces; so do the mlps
    seq()
    needs = [c._fn._workspace_bytes(*c._pointers) for c in seq.calls if c._fn.threaded]
    assert len(set(needs)) > 1 and seq._workspace.capacity == max(needs)  # attends[0]'s, at its largest S
    assert all(c._workspace.capacity == 0 for c in seq.calls)  # none of their own
    assert np.array_equal(xs[-1], one_by_one(calls, xs, 1))
    (want,) = module.attend(q, np.ascontiguousarray(k[..., :7]), v[:, :, :7], threads=1)
    assert np.array_equal(outs[0], module.attend(q, k, v, threads=1)[0]) and np.array_equal(outs[1], want)


def test_set_dim_patches_every_call_prepared_with_the_dim(module):
    rng = np.random.default_rng(4)
    H, D, S = 9, 64, 200
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(1, H, 1, D), (1, H, D, S), (1, H, S, D)])
    outs = [runtime.empty((1, H, 1, D), np.float32) for _ in range(2)]
    attends = [module.attend.prepare([q, k[..., :S - 10 * i], v], [out], dims=("S",)) for i, out in enumerate(outs)]
    calls, xs = chain(module, 1)
    seq = runtime.CallSequence([attends[0], *calls, attends[1]], threads=2)
    mlp_words = [c.words.copy() for c in calls]
    seq.set_dim("S", 57)  # the mlps have no S: left as they are
    assert all(np.array_equal(c.words, w) for c, w in zip(calls, mlp_words))
    seq()
    (want,) = module.attend(q, np.ascontiguousarray(k[..., :57]), v[:, :, :57], threads=1)
    assert np.array_equal(outs[0], want) and np.array_equal(outs[1], want)
    assert np.array_equal(xs[-1], one_by_one(calls, xs, 1))
    with pytest.raises(ValueError, match=r"S = 191 is outside 0 \.\. 190"):  # attends[1]'s k holds 190
        seq.set_dim("S", 191)
    with pytest.raises(ValueError, match="no call was prepared with dims=\\('K',\\)"):
        seq.set_dim("K", 3)
    with pytest.raises(TypeError, match="S must be an integer, got float"):
        seq.set_dim("S", 5.0)
    with pytest.raises(TypeError, match="S must be an integer, got float"):
        attends[0].set_dim("S", 5.0)
    seq.set_dim("S", 190)
    seq()
    (want,) = module.attend(q, np.ascontiguousarray(k[..., :190]), v[:, :, :190], threads=1)
    assert np.array_equal(outs[0], want) and np.array_equal(outs[1], want)


def test_set_dim_on_some_calls_leaves_the_others(module):
    """A dim that is not one value across the sequence (a sliding-window layer's cache length
    beside a full layer's): set_dim(..., calls=) patches the calls given, and bounds the value by
    their buffers alone."""
    rng = np.random.default_rng(5)
    H, D, S = 2, 64, 100
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(1, H, 1, D), (1, H, D, S), (1, H, S, D)])
    outs = [runtime.empty((1, H, 1, D), np.float32) for _ in range(2)]
    long, short = (module.attend.prepare([q, k[..., :n], v[:, :, :n]], [out], dims=("S",))
                   for n, out in zip((S, 16), outs))
    seq = runtime.CallSequence([long, short])
    seq.set_dim("S", 90, calls=(0,))  # past the short call's 16: only the long one is bounded
    seq.set_dim("S", 12, calls=(1,))
    seq()
    for out, n in zip(outs, (90, 12)):
        (want,) = module.attend(q, np.ascontiguousarray(k[..., :n]), v[:, :, :n], threads=1)
        assert np.array_equal(out, want)
    with pytest.raises(ValueError, match=r"S = 17 is outside 0 \.\. 16"):
        seq.set_dim("S", 17, calls=(1,))


def test_without_the_runner_the_calls_are_made_one_by_one():
    m = kina.compile_source(SRC, "seq0.kina", Options(opt_level=0), dims={"K": 64, "N": 96})
    try:
        rng = np.random.default_rng(2)
        x, out = rng.standard_normal((1, 1, 64)).astype(np.float32), runtime.empty((1, 1, 64), np.float32)
        w1, w2 = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 64)).astype(np.float32)
        seq = runtime.CallSequence([m.mlp.prepare([x, w1, w2], [out])], threads=2)
        assert not seq._native
        seq()
        assert np.array_equal(out, m.mlp(x, w1, w2)[0])
    finally:
        m.close()


def test_a_busy_team_gives_the_same_bits(module):
    calls, xs = chain(module, 2)
    want = one_by_one(calls, xs, 2)
    xs[-1][...] = 0
    team = module.team(1)
    with team._busy:  # another caller holds the team: the calls go one by one, on threads started per call
        runtime.CallSequence(calls, threads=2)()
    assert np.array_equal(xs[-1], want)


def test_mistakes_are_named(module):
    calls, _ = chain(module, 1)
    with pytest.raises(ValueError, match="at least one PreparedCall"):
        runtime.CallSequence([])
    with pytest.raises(TypeError, match=r"calls\[1\] must be a PreparedCall .*got Function"):
        runtime.CallSequence([calls[0], module.mlp])
    with pytest.raises(ValueError, match="threads must be a positive integer, got 0"):
        runtime.CallSequence(calls, threads=0)
    seq = runtime.CallSequence(calls)
    seq.threads = -1
    with pytest.raises(ValueError, match="threads must be a positive integer, got -1"):
        seq()
    other = kina.compile_source(SRC, "seq2.kina", dims={"K": K, "N": N})
    try:
        theirs, _ = chain(other, 1)
        seq = runtime.CallSequence([calls[0], theirs[0]])  # calls of two modules (builds for other dtypes)
        seq()
    finally:
        other.close()
    with pytest.raises(ValueError, match="seq2.so is closed"):
        seq()


def test_calls_of_two_modules_run_in_one_sequence_with_the_same_bits(module):
    """A model whose layers differ in weight dtypes runs one build per dtype set: its sequence
    holds calls of several modules, run on the first one's team, each entry its own module's."""
    other = kina.compile_source(SRC, "seq_other.kina", dims={"K": K, "N": N})
    try:
        for threads in (1, 2):
            ours, xs = chain(module, 2, seed=5)  # mlp, double, mlp, double
            theirs = [other.double.prepare([xs[1]], [xs[2]]), other.double.prepare([xs[3]], [xs[4]])]
            mixed = [ours[0], theirs[0], ours[2], theirs[1]]
            for c in mixed:
                c()
            alone = [x.copy() for x in xs[1:]]
            for x in xs[1:]:
                x[...] = 0
            runtime.CallSequence(mixed, threads=threads)()
            for got, was in zip(xs[1:], alone):
                np.testing.assert_array_equal(got, was)
    finally:
        other.close()
