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
    assert all(r[3] == "(100%)" for r in rows)  # each row's rates are shares of its contiguous read


def test_bench_k_layout_refuses_bad_counts():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_k_layout.py"), "--runs", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "expected positive integers, got '0'" in proc.stderr and "Traceback" not in proc.stderr
