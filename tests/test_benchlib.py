"""scripts/benchlib, the benchmarks' shared parts, on made-up numbers (nothing here measures):
the floor model never lets a variant beat its floor, interleaved rounds rotate and restore
the garbage collector, input sets rotate on one shared counter, and the bandwidth table
takes the best kernel on at most n threads."""
import gc
import sys

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def benchlib():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import benchlib.bandwidth
        import benchlib.floor
        import benchlib.timing
        yield benchlib
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def size_result(benchlib, variants: dict) -> dict:
    moved = benchlib.floor.bytes_moved(1, 32, 128, 2047)
    return {"H": 32, "Dh": 128, "S_past": 2047, "bytes": {k: {"read": r, "written": w} for k, (r, w) in moved.items()},
            "variants": {name: {"floor": kind, "threads": n, "min_s": t, "median_s": t * 1.1}
                         for name, (kind, n, t) in variants.items()}}


def test_bytes_moved_by_the_decode_step(benchlib):
    kv = 2 * 32 * 128 * 4  # K and V of one position, bytes
    moved = benchlib.floor.bytes_moved(1, 32, 128, 2047)
    small = (3 * 32 * 128 + 1) * 4  # q, k_new, v_new and the scale
    assert moved["functional"] == (2047 * kv + small, 2048 * kv + 32 * 128 * 4)
    assert moved["in place"] == (2048 * kv + small, kv + 32 * 128 * 4)


def test_a_variant_faster_than_its_floor_raises_the_bandwidth_and_is_named(benchlib):
    floor = benchlib.floor
    bw = {1: {"read": 30e9, "copy": 20e9, "read_by": "np.dot", "copy_by": "np.copyto"},
          2: {"read": 25e9, "copy": 35e9, "read_by": "np.sum", "copy_by": "np.copyto"}}
    r = size_result(benchlib, {"fast in place": ("in place", 1, 64 * 2**20 / 40e9),  # reads 64 MiB at 40 GB/s
                               "slow copy": ("functional", 1, 1.0), "numpy": ("functional", 2, 1.0)})
    fit_before = floor.floor_of(r, bw, "in place", 1)
    assert fit_before > r["variants"]["fast in place"]["min_s"]  # it beats the kernels' floor
    floor.fit_floors([r], bw)
    assert bw[1]["read"] > 30e9 and bw[1]["read_by"].startswith("fast in place at H=32 Dh=128 S_past=2047")
    assert bw[1]["copy"] == pytest.approx(20e9, rel=1e-12)  # nothing beat the copy floor (but rounding)
    assert bw[2]["read"] >= bw[1]["read"]  # two threads do at least what one did
    floor.add_floors(r, bw)
    for name, v in r["variants"].items():
        assert v["floor_s"] <= v["min_s"] * (1 + 1e-12), name  # no sample below its floor
        assert v["ratio_floor"] >= 1.0, name
    assert r["floor_s"] == r["floor_s_threads"]["1"]


def test_rounds_rotate_and_the_collector_comes_back(benchlib):
    t = benchlib.timing
    calls = []
    sets = t.InputSets(["a", "b", "c", "d"], 1)
    variants = [t.Variant(name, sets, lambda item, name=name: calls.append((name, item))) for name in ("x", "y", "z")]
    t.run_rounds(variants, repeats=3, inner=1)
    warm, timed = calls[:12], calls[12:]
    assert [n for n, _ in warm] == ["x"] * 4 + ["y"] * 4 + ["z"] * 4  # one untimed pass over every set each
    firsts = [timed[i][0] for i in range(0, len(timed), 2)]  # each sample: one untimed call, one timed
    assert firsts == ["x", "y", "z", "y", "z", "x", "z", "x", "y"]  # the order rotates by one each round
    assert [item for _, item in calls] == ["a", "b", "c", "d"] * 7 + ["a", "b"]  # one counter, shared
    assert all(len(v.samples) == 3 and all(s >= 0 for s in v.samples) for v in variants)
    assert gc.isenabled()

    seen = []

    def fails_when_timed(item):  # the warm-up's two calls pass; the first timed round's fail
        seen.append(item)
        if len(seen) > 2:
            assert not gc.isenabled()  # the samples are timed with the collector off
            raise RuntimeError("a variant failed")
    with pytest.raises(RuntimeError, match="a variant failed"):
        t.run_rounds([t.Variant("fails", t.InputSets(["a", "b"], 1), fails_when_timed)], repeats=2, inner=1)
    assert len(seen) == 3 and gc.isenabled()  # it failed while timed, and the collector is back on


def test_interleaved_runs_each_once_untimed_then_in_turn(benchlib):
    order = []
    runs = {name: (lambda name=name: order.append(name) or len(order)) for name in ("a", "b")}
    got = benchlib.timing.interleaved(runs, 2)
    assert order == ["a", "b", "a", "b", "a", "b"] and got == {"a": [3, 5], "b": [4, 6]}
    assert benchlib.timing.medians([{"t": 1.0, "tokens": [1]}, {"t": 3.0, "tokens": [2]}, {"t": 2.0, "tokens": []}]) \
        == {"t": 2.0}


def test_bandwidth_is_the_best_kernel_on_at_most_n_threads(benchlib):
    samples = {"1": {"read": {"np.sum": [10e9, 30e9], "np.dot": [20e9]}, "copy": {"np.copyto": [15e9]}},
               "2": {"read": {"np.sum": [25e9], "np.dot": [28e9]}, "copy": {"np.copyto": [12e9, 22e9]}}}
    bw = benchlib.bandwidth.bandwidth(samples)
    assert (bw[1]["read"], bw[1]["read_by"]) == (30e9, "np.sum on 1 thread")
    assert (bw[2]["read"], bw[2]["read_by"]) == (30e9, "np.sum on 1 thread")  # two threads did worse than one
    assert (bw[2]["copy"], bw[2]["copy_by"]) == (22e9, "np.copyto on 2 threads")
    assert bw[1]["candidates"]["read np.sum"] == {"best": 30e9, "median": 20e9}
