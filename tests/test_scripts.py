"""The benchmark scripts run and print what they say: scripts/bench_k_layout.py, the C
microbenchmark of the in-place cache's Kᵀ layout, one row per run length and gap (tiny
sizes, so it takes a second); scripts/bench_matmul.py --quick, its tables well formed."""
import re
import subprocess
import sys

from conftest import ROOT


def test_bench_k_layout_prints_a_row_per_run_and_gap():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_k_layout.py"), "--runs", "64,100",
                           "--gaps", "1,300", "--working-set-mib", "8", "--repeats", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s*\d+\s+\d+\s", line)]
    assert [(r[0], r[1]) for r in rows] == [("64", "1"), ("64", "300"), ("100", "1"), ("100", "300")]
    for r in rows:  # S, gap, the contiguous read in GB/s, then four "rate (share%)" pairs
        contiguous, rest = float(r[2]), r[3:]
        assert contiguous > 0 and len(rest) == 8, r
        for rate, share in zip(rest[0::2], rest[1::2]):
            # each share is its rate over the contiguous read's, within the rounding of the printed
            # figures: 0.5 points for the share, and 0.05 GB/s on each rate (which counts for more
            # when the contiguous read is slow, as on a busy machine, and the shares are large)
            rate, share = float(rate), float(share.strip("()%"))
            slack = 0.5 + 100 * rate / contiguous * (0.05 / rate + 0.05 / contiguous) + 0.01
            assert rate > 0 and abs(share - 100 * rate / contiguous) <= slack, r


def test_bench_k_layout_refuses_bad_counts():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_k_layout.py"), "--runs", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "expected positive integers, got '0'" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_matmul_quick_prints_well_formed_tables():
    """scripts/bench_matmul.py --quick: the read floor, then a decode row per dtype and shape
    (GB/s and its share of the floor) and a prefill row per dtype, shape and P (GFLOP/s
    against NumPy's sgemm, and their ratio); each share and ratio agrees with the figures
    printed beside it. Not its speed."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_matmul.py"), "--quick"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    floor = float(re.search(r"read floor, one thread: ([\d.]+) GB/s", proc.stdout).group(1))
    assert floor > 0
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"F(32|16)\s", line)]
    decode = [r for r in rows if len(r) == 11]
    prefill = [r for r in rows if len(r) == 7]
    assert len(decode) + len(prefill) == len(rows)
    assert [tuple(r[:3]) for r in decode] == [(t, K, N) for t in ("F32", "F16") for K, N in (("576", "576"), ("512", "1408"))]
    for dtype, K, N, mib, kina, share, numpy, np_share, read, read_share, speedup in decode:
        assert abs(float(mib) - int(K) * int(N) * (4 if dtype == "F32" else 2) / 2**20) < 0.01
        for rate, s, of in ((kina, share, floor), (numpy, np_share, floor), (kina, read_share, float(read))):
            # within the rounding of the printed figures
            assert float(rate) > 0 and abs(float(s) - float(rate) / of) <= 0.01 + 0.06 * float(s), (rate, s)
        assert speedup.endswith("x") and float(speedup[:-1]) > 0
    assert sorted({(r[0], r[1]) for r in prefill}) == [("F16", "256"), ("F16", "32"), ("F32", "256"), ("F32", "32")]
    for dtype, P, K, N, kina, sgemm, ratio in prefill:
        assert float(kina) > 0 and float(sgemm) > 0
        assert abs(float(ratio) - float(kina) / float(sgemm)) <= 0.01 + 0.01 * float(ratio)
