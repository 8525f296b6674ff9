"""The Section 19 example end to end: compile, call, compare with NumPy; the .so's dependencies."""
import subprocess

import numpy as np
import pytest

import kina
from kina.runtime import passable
from conftest import DYN_TEXT, EXAMPLES, GENERIC_STEP, check_against_numpy, kv_inputs


def kv_step(B, H, Dh, S, dtype="F32") -> dict:
    """The step at other sizes and dtypes: the generic kernel, specialised by the compiler."""
    return dict(dtypes={"T": dtype}, dims=dict(B=B, H=H, Dh=Dh, S=S))


GENERIC_TEXT = GENERIC_STEP.read_text()


def test_example_matches_numpy():
    check_against_numpy((EXAMPLES / "storylm0_kv_step.kina").read_text(), "kv_step", *kv_inputs(1, 2, 2, 3),
                        exact=(0, 1), rtol=1e-6)


@pytest.mark.parametrize("B,H,Dh,S", [(1, 1, 1, 1), (2, 3, 4, 5), (1, 4, 16, 31), (3, 2, 8, 0)])
def test_other_sizes(B, H, Dh, S):
    check_against_numpy(GENERIC_TEXT, "kv_step", *kv_inputs(B, H, Dh, S), exact=(0, 1), **kv_step(B, H, Dh, S))


def test_f64():
    check_against_numpy(GENERIC_TEXT, "kv_step", *kv_inputs(2, 2, 8, 9, np.float64), **kv_step(2, 2, 8, 9, "F64"),
                        exact=(0, 1), rtol=1e-12, atol=1e-14)


def test_so_needs_only_libc_and_libm(tmp_path):
    from kina.driver.cache import build_so
    so = build_so((EXAMPLES / "storylm0_kv_step.kina").read_text(), "kv.kina")
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    libs = sorted(line.split("[")[1].split("]")[0] for line in needed.splitlines() if "(NEEDED)" in line)
    assert set(libs) <= {"libc.so.6", "libm.so.6"}, libs
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(so)], capture_output=True, text=True).stdout
    assert "memrefCopy" not in undefined and "_mlir_" not in undefined


def test_inputs_are_not_modified_and_views_work():
    mod = kina.compile_file(EXAMPLES / "storylm0_kv_step.kina")
    args = kv_inputs(1, 2, 2, 3)
    copies = [a.copy() for a in args]
    # the same values as views: q_new strided along its outer dims, with NaN in the gaps
    # (passed as it is), k_past with innermost stride 2 (copied first)
    q_view = np.full((1, 4, 3, 2), np.nan, np.float32)[:, ::2, 1:2, :]
    q_view[...] = args[0]
    assert not q_view.flags.c_contiguous and passable(q_view)
    k_view = np.ascontiguousarray(np.concatenate([args[1], args[1]], axis=3))[..., ::2]
    k_view[...] = args[1]
    assert not passable(k_view)
    frozen = [a.copy() for a in args]
    for a in frozen:
        a.setflags(write=False)
    want = mod.kv_step(*args)
    got = mod.kv_step(q_view, k_view, *frozen[2:])
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)
    for a, c in zip(args, copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("shift", [0, 1, 3, 8, 15])
def test_step_into_misaligned_out_buffers(shift):
    """The fused cache copies use aligned non-temporal stores after a scalar head:
    any alignment of the caller's out-buffers must give the same bits."""
    mod = kina.compile_file(EXAMPLES / "storylm0_kv_step_dyn.kina")
    args = kv_inputs(1, 3, 40, 77, seed=shift)
    outs = []
    for shape in [(1, 3, 40, 78), (1, 3, 78, 40), (1, 3, 1, 40)]:
        flat = np.full(int(np.prod(shape)) + 16, np.nan, np.float32)
        outs.append(flat[shift:shift + int(np.prod(shape))].reshape(shape))
    mod.kv_step.call_into(args, outs)
    want = mod.kv_step(*args)
    for got, ref in zip(outs, want):
        np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(outs[0], np.concatenate([args[1], args[2]], axis=3))
    np.testing.assert_array_equal(outs[1], np.concatenate([args[3], args[4]], axis=2))


def test_call_into_checks_its_outs():
    mod = kina.compile_file(EXAMPLES / "storylm0_kv_step_dyn.kina")
    args = kv_inputs(1, 2, 4, 5)
    good = [np.empty(s, np.float32) for s in [(1, 2, 4, 6), (1, 2, 6, 4), (1, 2, 1, 4)]]
    with pytest.raises(TypeError, match=r"outs must be a list of 3 arrays"):
        mod.kv_step.call_into(args, good[:1])
    with pytest.raises(ValueError, match=r"out 0 must be a float32 array of shape \[1, 2, 4, 6\], got float32 \[1, 1, 1, 1\]"):
        mod.kv_step.call_into(args, [np.empty((1, 1, 1, 1), np.float32), *good[1:]])
    with pytest.raises(ValueError, match=r"out 2 overlaps another argument or out"):
        mod.kv_step.call_into(args, [*good[:2], args[0]])
    frozen = good[2].copy()
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match=r"out 2 must be writable"):
        mod.kv_step.call_into(args, [*good[:2], frozen])
    mod.kv_step.call_into(args, good)
    for got, want in zip(good, mod.kv_step(*args)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("shift", [0, 1])
@pytest.mark.parametrize("Dh", [16, 32, 48, 64, 96, 128, 160])
def test_fused_value_rows_in_registers_or_not_give_the_same_bits(Dh, shift, static):
    """Value rows of whole vectors up to lower.REGISTER_ROW_BYTES keep their sums in
    registers when every row of the new cache starts on a cache line (shift 0); otherwise
    (shift 1, or Dh = 16, 48, 160) the row-at-a-time loops run. Either way the new caches
    are exact copies and the context has the bits of the unfused attention kernel."""
    from kina.models.seed import kernel_program as _program
    from kina.runtime import empty
    step = kina.compile_file(EXAMPLES / "storylm0_kv_step_dyn.kina",
                             dims=dict(B=1, H=3, Dh=Dh, S=37) if static else None).kv_step
    args = kv_inputs(1, 3, Dh, 37, seed=Dh)
    outs = []
    for shape in [(1, 3, Dh, 38), (1, 3, 38, Dh), (1, 3, 1, Dh)]:
        n = int(np.prod(shape))
        outs.append(empty(n + 1)[shift:shift + n].reshape(shape))
    step.call_into(args, outs)
    k_next, v_next, context = outs
    np.testing.assert_array_equal(k_next, np.concatenate([args[1], args[2]], axis=3))
    np.testing.assert_array_equal(v_next, np.concatenate([args[3], args[4]], axis=2))
    unfused = _program("attention", np.dtype(np.float32)).attend(args[0], k_next, v_next, args[5])[0]
    np.testing.assert_array_equal(context, unfused)
