"""scripts/bench_k_layout.py, the C microbenchmark of the in-place cache's Kᵀ layout: it
compiles, runs, and prints one row per run length and gap (tiny sizes, so it takes a second)."""
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
            # each share is its rate over the contiguous read's (both as printed, so within rounding)
            assert float(rate) > 0 and abs(float(share.strip("()%")) - 100 * float(rate) / contiguous) <= 1.5, r


def test_bench_k_layout_refuses_bad_counts():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_k_layout.py"), "--runs", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "expected positive integers, got '0'" in proc.stderr and "Traceback" not in proc.stderr
