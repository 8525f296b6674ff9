"""Symbolic dims at run time (issue 4), and the compiled step's memory (issue 2).

One compile of examples/storylm0_kv_step_dyn.kina must serve every cache length
and every B, H, Dh: the module fixture counts the builds of that file for the
whole module (a build per shape would show up as more than one). The static
program at the same sizes (the same source with the dims written as integers)
must agree with the symbolic one bit for bit, on all three results.
"""
import ctypes
import functools
import re

import numpy as np
import pytest

import kina
from kina import knobs
from kina.driver import pipeline

from conftest import DYN_TEXT, EXAMPLES, GENERIC_STEP, ROOT, assert_same, kv_inputs

DYN = EXAMPLES / "storylm0_kv_step_dyn.kina"


def reference(q, k_past, k_new, v_past, v_new, scale):
    """The Section 19 step in NumPy; context in float64."""
    k_next = np.concatenate([k_past, k_new], axis=3)
    v_next = np.concatenate([v_past, v_new], axis=2)
    scores = np.matmul(q.astype(np.float64), k_next) * scale
    e = np.exp(scores - scores.max(axis=3, keepdims=True))
    return k_next, v_next, np.matmul(e / e.sum(axis=3, keepdims=True), v_next.astype(np.float64))


@pytest.fixture(scope="module")
def dyn_builds(tmp_path_factory):
    """Every build of the symbolic example in this module, recorded while the module runs."""
    builds = []
    real = pipeline.run_stages

    def counting(source, filename, *args, **kwargs):
        if filename == str(DYN):
            builds.append(filename)
        return real(source, filename, *args, **kwargs)
    # a cold cache: one real build
    with pytest.MonkeyPatch.context() as mp, knobs.scoped(KINA_CACHE_DIR=tmp_path_factory.mktemp("symbolic-cache")):
        mp.setattr(pipeline, "run_stages", counting)
        yield builds


@pytest.fixture(scope="module")
def dyn(dyn_builds):
    mod = kina.compile_file(DYN)
    assert len(dyn_builds) == 1
    return mod


@functools.lru_cache(maxsize=None)
def static_module(B, H, Dh, S):
    return kina.compile_file(DYN, dims=dict(B=B, H=H, Dh=Dh, S=S))


SIZES = [(1, 2, 2, S) for S in (0, 1, 2, 3, 17, 1000, 4095)] + [
    (2, 3, 4, 5), (3, 1, 1, 0), (1, 8, 64, 4095), (4, 2, 16, 100), (1, 1, 7, 2048), (5, 4, 3, 1)]


@pytest.mark.parametrize("B,H,Dh,S", SIZES)
def test_one_compile_serves_every_size(dyn, dyn_builds, B, H, Dh, S):
    args = kv_inputs(B, H, Dh, S, seed=S)
    k_next, v_next, context = dyn.kv_step(*args)
    want_k, want_v, want_c = reference(*args)
    assert_same(k_next, want_k, what="k_next")
    assert_same(v_next, want_v, what="v_next")
    assert context.shape == (B, H, 1, Dh) and context.dtype == np.float32
    np.testing.assert_allclose(context, want_c, rtol=1e-5, atol=1e-6)
    assert len(dyn_builds) == 1, "the symbolic step was rebuilt"


def test_symbolic_example_is_what_the_specialization_replaces():
    """The static programs used below are the dyn example with its dims fixed: the static
    example's signature; and the generic kernel at T = F32 is the dyn example."""
    from kina.frontend import check
    from kina.frontend import syntax
    want = check.check(syntax.parse((EXAMPLES / "storylm0_kv_step.kina").read_text())).functions[0].sig
    assert check.check(syntax.parse(DYN_TEXT), dims=dict(B=1, H=2, Dh=2, S=3)).functions[0].sig == want
    from kina.driver.pipeline import Options, _render, run_stages
    ir = [_render(run_stages(text, "step.kina", "mlir", Options(dtypes=dtypes)), "mlir")
          for text, dtypes in ((GENERIC_STEP.read_text(), (("T", "F32"),)), (DYN_TEXT, ()))]
    assert ir[0] == ir[1], "the generic step at T = F32 is not the dyn example"


@pytest.mark.parametrize("B,H,Dh,S", [(1, 2, 2, 3), (2, 3, 4, 5), (1, 8, 64, 127), (3, 2, 8, 0), (1, 1, 1, 1)])
def test_static_and_symbolic_agree_bit_for_bit(dyn, B, H, Dh, S):
    args = kv_inputs(B, H, Dh, S, seed=100 + S)
    got = dyn.kv_step(*args)
    want = static_module(B, H, Dh, S).kv_step(*args)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, what=f"result {i} (symbolic vs static)")


def test_static_example_file_agrees_with_symbolic(dyn):
    args = kv_inputs(1, 2, 2, 3, seed=5)
    want = kina.compile_file(EXAMPLES / "storylm0_kv_step.kina").kv_step(*args)
    for i, (g, w) in enumerate(zip(dyn.kv_step(*args), want)):
        assert_same(g, w, what=f"result {i}")


def test_empty_past(dyn):
    """S_past = 0: the softmax runs over the one new position, so context is exactly v_new."""
    q, k_past, k_new, v_past, v_new, scale = kv_inputs(2, 3, 4, 0, seed=1)
    assert k_past.shape == (2, 3, 4, 0)
    k_next, v_next, context = dyn.kv_step(q, k_past, k_new, v_past, v_new, scale)
    assert_same(k_next, k_new, what="k_next")
    assert_same(v_next, v_new, what="v_next")
    assert_same(context, v_new, what="context")


@pytest.mark.parametrize("B,H", [(0, 2), (1, 0)])
def test_empty_batch_or_heads(dyn, B, H):
    args = kv_inputs(B, H, 2, 3)
    got = dyn.kv_step(*args)
    for g, w in zip(got, reference(*args)):
        assert g.shape == w.shape and g.size == 0


def test_growing_cache_loop(dyn):
    """A decode loop: the caches the step returns are the next step's past, S = 0, 1, 2, ..."""
    B, H, Dh = 1, 2, 4
    rng = np.random.default_rng(3)
    k = np.zeros((B, H, Dh, 0), np.float32)
    v = np.zeros((B, H, 0, Dh), np.float32)
    scale = np.full((1, 1, 1, 1), 0.5, np.float32)
    for step in range(20):
        q, kn, vn = (rng.standard_normal(s).astype(np.float32) for s in [(B, H, 1, Dh), (B, H, Dh, 1), (B, H, 1, Dh)])
        want = reference(q, k, kn, v, vn, scale)
        k, v, context = dyn.kv_step(q, k, kn, v, vn, scale)
        assert k.shape == (B, H, Dh, step + 1) and v.shape == (B, H, step + 1, Dh)
        assert_same(k, want[0]) and assert_same(v, want[1])
        np.testing.assert_allclose(context, want[2], rtol=1e-5, atol=1e-6)


# -- binding the dims -----------------------------------------------------------------------

@pytest.mark.parametrize("runner", ["compiled", "interpreted"])
def test_inconsistent_bindings_name_the_dim(dyn, runner):
    fn = dyn.kv_step if runner == "compiled" else kina.interpret(DYN_TEXT).kv_step
    q, k_past, k_new, v_past, v_new, scale = kv_inputs(1, 2, 2, 5)
    v6 = kv_inputs(1, 2, 2, 6)[3]
    with pytest.raises(ValueError, match=r"dim S is 5 from k_past but 6 from v_past"):
        fn(q, k_past, k_new, v6, v_new, scale)
    with pytest.raises(ValueError, match=r"dim Dh is 2 from q_new but 3 from k_past"):
        fn(q, kv_inputs(1, 2, 3, 5)[1], k_new, v_past, v_new, scale)
    with pytest.raises(ValueError, match=r"dim B is 1 from \w+ but 2 from k_new"):
        fn(q, k_past, kv_inputs(2, 2, 2, 5)[2], v_past, v_new, scale)
    with pytest.raises(ValueError, match=r"dim H is 2 from \w+ but 4 from v_new"):
        fn(q, k_past, k_new, v_past, kv_inputs(1, 4, 2, 5)[4], scale)
    with pytest.raises(ValueError, match=r"parameter 'k_new' expects shape \[B, H, Dh, 1\]"):
        fn(q, k_past, np.zeros((1, 2, 2, 2), np.float32), v_past, v_new, scale)
    with pytest.raises(ValueError, match=r"parameter 'scale'"):
        fn(q, k_past, k_new, v_past, v_new, np.ones((1, 1, 1, 2), np.float32))
    with pytest.raises(ValueError, match=r"parameter 'k_past' expects rank 4"):
        fn(q, k_past[0], k_new, v_past, v_new, scale)


COMPOUND = """
let f = fn(a: tensor<F32, [S, 2], @host>, b: tensor<F32, [S+1, 2], @host>) -> (tensor<F32, [S+S+1, 2], @host>) {
  let c = concat[axis=0] a b;
  (c)
}
"""


@pytest.fixture(scope="module")
def compound():
    return kina.compile_source(COMPOUND, "compound.kina")


@pytest.mark.parametrize("S", [0, 1, 3, 40])
def test_compound_param_dim(compound, S):
    a = np.arange(2 * S, dtype=np.float32).reshape(S, 2)
    b = -np.arange(2 * S + 2, dtype=np.float32).reshape(S + 1, 2)
    (c,) = compound.f(a, b)
    assert_same(c, np.concatenate([a, b]))


def test_compound_param_dim_is_checked(compound):
    a, b = np.zeros((3, 2), np.float32), np.zeros((5, 2), np.float32)
    with pytest.raises(ValueError, match=r"parameter 'b' dim 0 must be S\+1 = 4, got 5"):
        compound.f(a, b)
    with pytest.raises(ValueError, match=r"parameter 'b' dim 0 must be S\+1 = 1, got 0"):
        compound.f(np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32))


# -- memory -----------------------------------------------------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _heap_in_use() -> int | None:
    """Bytes malloc has handed out and not had back (glibc), or None where unavailable.

    The compiled step allocates its temporaries with malloc and must free them,
    so a per-call leak of even a few bytes shows up here, unlike in RSS.
    """
    try:
        libc = ctypes.CDLL(None)
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]
    mallinfo2.restype = Mallinfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def _growth(call, n: int, warmup: int) -> tuple[int, int | None]:
    for i in range(warmup):
        call(i)
    rss, heap = _rss(), _heap_in_use()
    for i in range(n):
        call(i)
    after = _heap_in_use()
    return _rss() - rss, (None if heap is None else after - heap)


def test_symbolic_calls_with_varying_lengths_do_not_leak(dyn):
    B, H, Dh = 1, 4, 32
    lengths = [(i * 37) % 600 for i in range(64)]
    inputs = {S: kv_inputs(B, H, Dh, S, seed=S) for S in set(lengths)}

    def call(i):
        dyn.kv_step(*inputs[lengths[i % len(lengths)]])
    rss, heap = _growth(call, 3000, warmup=300)
    assert rss < 64 << 20, f"RSS grew by {rss >> 20} MiB over 3000 calls"
    if heap is not None:
        assert heap < 512 << 10, f"malloc'd bytes in use grew by {heap} over 3000 calls"


def test_static_step_30000_calls_do_not_grow_memory():
    mod = kina.compile_file(EXAMPLES / "storylm0_kv_step.kina")
    args = kv_inputs(1, 2, 2, 3)

    def call(i):
        mod.kv_step(*args)
    rss, heap = _growth(call, 30_000, warmup=1000)
    assert rss < 16 << 20, f"RSS grew by {rss >> 20} MiB over 30,000 calls"
    if heap is not None:
        assert heap < 256 << 10, f"malloc'd bytes in use grew by {heap} over 30,000 calls"


def test_prefill_example_is_the_kernel_at_f32():
    """examples/storylm0_prefill.kina is the F32 copy of the generic kernel kina.models uses."""
    from kina.driver.pipeline import Options, _render, run_stages
    kernel = ROOT / "src" / "kina" / "models" / "seed" / "prefill.kina"
    ir = [_render(run_stages(path.read_text(), "prefill.kina", "mlir", Options(dtypes=dtypes)), "mlir")
          for path, dtypes in ((kernel, (("T", "F32"),)), (EXAMPLES / "storylm0_prefill.kina", ()))]
    assert ir[0] == ir[1]
