"""-O0 against the default level: the optimisation passes change speed, not results.

At -O0 none of the optimisation passes run (fusion, buffer reuse, the matmul and sum
loops, exp as arith ops; LLVM at -O0), and the .so is still correct. Between the
two levels:
  * results are bit-identical wherever the summation order is the same: concat,
    elementwise ops, and every matmul (fused or not, the k order never changes);
  * softmax, exp, sigmoid, sum and mean differ only by the order of innermost-dim
    sums (fixed vector partial sums at the default level, the plain loop at -O0) and
    by exp (Kina's <= 1 ulp arith expansion, or libm's expf): within SOFTMAX_RTOL
    (F32; SOFTMAX_RTOL_F64 for F64) of each result and of the largest in magnitude;
  * static == symbolic and functional == in place hold at both levels, bit for bit.
Random programs come from tests/test_fuzz.py's generator.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given

import kina
from kina import knobs
from conftest import DYN_TEXT, EXAMPLES, ROOT, assert_same, kv_inputs
from kina.frontend import check
from kina.frontend import syntax
from kina.driver.pipeline import Options
from test_fuzz import COMPILED, SIZES, programs, random_args

SOFTMAX_RTOL = 2e-6  # F32: a few ulps of the sum's reordering and of exp, relative to each result
SOFTMAX_RTOL_F64 = 1e-14
LEVELS = (0, 3)


@COMPILED
@given(programs(max_depth=2, dtypes=("F32", "F64", "I32")), SIZES, __import__("hypothesis").strategies.integers(0, 2**32 - 1))
def test_random_programs_agree_at_O0_and_the_default_level(prog, sizes, seed):
    source = prog[0]
    program = check.check(syntax.parse(source, "<levels>"))
    args = random_args(program, sizes, seed)
    o0 = kina.compile_source(source, "<levels>", Options(opt_level=0)).f(*args)
    o3 = kina.compile_source(source, "<levels>", Options(opt_level=3)).f(*args)
    # exp (softmax, sigmoid) and innermost-dim sums (softmax, sum, mean) differ between the levels
    exact = not any(op in source for op in ("softmax(", "exp(", "sigmoid(", "sum(", "mean("))
    rtol = SOFTMAX_RTOL_F64 if "<F64" in source else SOFTMAX_RTOL
    for i, (a, b) in enumerate(zip(o0, o3)):
        if exact:
            assert_same(a, b, what=f"result {i} (-O0 vs -O3, same summation order)\n{source}")
        else:
            atol = rtol * float(np.max(np.abs(b), initial=0))
            assert_same(a, b, rtol=rtol, atol=atol, what=f"result {i} (-O0 vs -O3)\n{source}")


@pytest.fixture(scope="module", params=LEVELS, ids=lambda level: f"O{level}")
def level(request):
    return request.param


@pytest.mark.parametrize("S", [0, 1, 7])
def test_static_and_symbolic_agree_at_each_level(level, S):
    args = kv_inputs(1, 2, 4, S, seed=S)
    dyn = kina.compile_source(DYN_TEXT, "dyn.kina", Options(opt_level=level)).kv_step(*args)
    static = kina.compile_source(DYN_TEXT, "dyn.kina", Options(opt_level=level),
                                 dims=dict(B=1, H=2, Dh=4, S=S)).kv_step(*args)
    for i, (a, b) in enumerate(zip(dyn, static)):
        assert_same(a, b, what=f"result {i} at -O{level}, S={S}")


def test_the_step_agrees_across_levels():
    args = kv_inputs(1, 4, 32, 100, seed=3)
    o0, o3 = (kina.compile_source(DYN_TEXT, "dyn.kina", Options(opt_level=n)).kv_step(*args) for n in LEVELS)
    assert_same(o0[0], o3[0], what="k_next")
    assert_same(o0[1], o3[1], what="v_next")
    assert_same(o0[2], o3[2], rtol=SOFTMAX_RTOL, atol=SOFTMAX_RTOL * float(np.max(np.abs(o3[2]))), what="context")


def test_functional_and_in_place_agree_at_each_level(level, monkeypatch):
    from kina.models import KVCache
    B, H, Dh = 1, 2, 8
    with knobs.scoped(KINA_OPT_LEVEL=level):  # the level of the cache's kernels
        cache = KVCache(B, H, Dh, max_seq_len=16)
        step = kina.compile_source(DYN_TEXT, "dyn.kina", Options(opt_level=level)).kv_step
        k_past, v_past = np.zeros((B, H, Dh, 0), np.float32), np.zeros((B, H, 0, Dh), np.float32)
        for t in range(5):
            q, _, k_new, _, v_new, scale = kv_inputs(B, H, Dh, 0, seed=t)
            k_past, v_past, want = step(q, k_past, k_new, v_past, v_new, scale)
            got = cache.step(q, k_new, v_new, float(scale.ravel()[0]))
            assert_same(got, want, what=f"context at step {t}, -O{level}")


def test_O0_runs_none_of_the_optimisation_passes(tmp_path):
    from kina.ir.passes import PASSES
    from kina.driver.pipeline import run_stages
    text = (EXAMPLES / "storylm0_kv_step.kina").read_text()
    run_stages(text, "kv.kina", "to-llvm", Options(opt_level=0), dump_dir=tmp_path)
    ran = {p.name.split("-", 1)[1].rsplit(".", 1)[0] for p in tmp_path.iterdir()}
    assert not ran & {p.name for p in PASSES if p.optimisation}
    lowered = next(tmp_path.glob("*-bufferize.mlir")).read_text()
    assert lowered.count("memref.alloc(") > 3, "at -O0 nothing is fused or reused"


@pytest.mark.parametrize("flag", ["-O0", "-O3"])
def test_validate_kv_cache_passes(tmp_path, flag):
    """scripts/validate_kv_cache.py, as `make demo` runs it, on a .so built at each level."""
    so = tmp_path / "step.so"
    kinac = [sys.executable, "-m", "kina"]
    subprocess.run([*kinac, str(EXAMPLES / "storylm0_kv_step.kina"), flag, "-o", str(so)], check=True,
                   capture_output=True)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "validate_kv_cache.py"), str(so)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MISMATCH" not in proc.stdout


def test_KINA_OPT_LEVEL_set_at_run_time_counts(monkeypatch, tmp_path):
    from kina.driver.pipeline import run_stages
    with knobs.scoped(KINA_OPT_LEVEL=0):
        run_stages(DYN_TEXT, "dyn.kina", "to-llvm", dump_dir=tmp_path)
    assert not list(tmp_path.glob("*-matmul-loops.mlir")), "the default options must read KINA_OPT_LEVEL per call"
    monkeypatch.setenv("KINA_OPT_LEVEL", "7")
    with pytest.raises(ValueError, match="KINA_OPT_LEVEL: expected 0, 1, 2 or 3, got '7'"):
        run_stages(DYN_TEXT, "dyn.kina", "mlir")
