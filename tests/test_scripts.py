"""The benchmark scripts run and print what they say: scripts/bench_k_layout.py, the C
microbenchmark of the in-place cache's Kᵀ layout, one row per run length and gap (tiny
sizes, so it takes a second); scripts/bench_matmul.py --quick, its tables well formed;
scripts/ab_passes.py, a row per variant (and thread count) with its ratio and bits."""
import re
import subprocess
import sys

import pytest

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


AB_ROW = re.compile(r"^(\S+(?:, \dT)?)\s+([\d.]+) (?:ms|us)\s+([\d.]+)x\s+(same bits|differ: \S+ of the largest)\s+\[(.*)\]\s+\((.*)\)$")


def ab_passes(*argv):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_passes.py"), *argv],
                          capture_output=True, text=True, timeout=600)
    return proc, {m.group(1): m.groups()[1:] for m in map(AB_ROW.match, proc.stdout.splitlines()) if m}


def check_ab_rows(rows: dict, rounds: int) -> None:
    """Each row's median is the median of its rounds, and its ratio that over the first row's
    (of the same thread count), within the rounding of the printed figures."""
    firsts = {}
    for name, (median, ratio, _, _, rounds_shown) in rows.items():
        ms = [float(x) for x in rounds_shown.split(", ")]
        assert len(ms) == rounds and abs(float(median) - sorted(ms)[rounds // 2]) < 1e-9, (name, median, ms)
        first = firsts.setdefault(name.rpartition(", ")[2] if ", " in name else "", float(median))
        assert abs(float(ratio) - float(median) / first) <= 0.001 + 0.002 * float(ratio), (name, ratio)


def test_ab_passes_model_shows_each_variant_with_its_bits():
    """A variant that changes the sums (fma) differs from the default build's logits (the
    row mode below shows a variant that keeps them: the same bits)."""
    proc, rows = ab_passes("model", "--shape", "tiny", "--dtype", "f32", "--rounds", "3", "--prompt", "4", "--new", "3",
                           "default=", "fma=matmul-loops{fma=true}")
    assert proc.returncode == 0, proc.stderr
    assert "StoryLM tiny" in proc.stdout and "medians of 3 interleaved rounds" in proc.stdout
    assert list(rows) == ["default", "fma"], proc.stdout
    assert rows["default"][1] == "1.000" and rows["default"][2] == "same bits"
    assert rows["fma"][2].startswith("differ: ") and rows["fma"][3] == "matmul-loops{fma=true}"
    assert rows["default"][3] == "the default build"
    check_ab_rows(rows, 3)


def test_ab_passes_row_times_one_and_more_threads():
    proc, rows = ab_passes("row", "--k", "64", "--n", "256", "--weights", "f32", "--rounds", "3",
                           "--working-set-mib", "2", "--threads", "2", "a=", "b=matmul-loops{unroll=4}")
    assert proc.returncode == 0, proc.stderr
    assert list(rows) == ["a, 1T", "a, 2T", "b, 1T", "b, 2T"], proc.stdout
    assert all(r[2] == "same bits" for r in rows.values())  # unroll keeps each sum's order
    check_ab_rows(rows, 3)


def test_ab_passes_row_takes_a_block_format():
    """A Q4_1 row in the tiled layout the builds read: block sums change the order of the sums
    (not the same bits as the exact build), more tiles a step do not."""
    proc, rows = ab_passes("row", "--k", "64", "--n", "128", "--weights", "q4_1", "--rounds", "3",
                           "--working-set-mib", "2", "--threads", "1", "exact=",
                           "tiles2=quantized-matmul-loops{tiles=2}", "sums=quantized-matmul-loops{block-sums=true}")
    assert proc.returncode == 0, proc.stderr
    assert list(rows) == ["exact, 1T", "tiles2, 1T", "sums, 1T"], proc.stdout
    assert rows["tiles2, 1T"][2] == "same bits" and rows["sums, 1T"][2].startswith("differ"), proc.stdout
    check_ab_rows(rows, 3)


@pytest.mark.parametrize("argv, says", [
    (["row", "--k", "100", "--weights", "q4_k", "a="], "--k 100, --weights q4_k: Q4_K is blocked along dim 0"),
    (["row", "x"], "expected NAME=PASS_OPTIONS (the options may be empty), got 'x'"),
    (["row", "a=", "a="], "variant names must differ, got a, a"),
    (["row", "a=threads{part=3}"], "variant a: pass_options: threads: unknown option 'part'"),
    (["model", "--rounds", "0", "a="], "--rounds: expected a positive integer, got 0"),
])
def test_ab_passes_refuses_bad_arguments(argv, says):
    proc, _ = ab_passes(*argv)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_bench_first_token_prints_the_breakdown(chat_folder):
    """scripts/bench_first_token.py on the tiny chat model, with the session's compile cache (warm
    runs): a row per run whose stages add up to about its total."""
    import os
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_first_token.py"), str(chat_folder),
                           "--runs", "2", "--cache-dir", os.environ["KINA_CACHE_DIR"]],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("warm")]
    assert len(rows) == 2 and proc.stdout.split("\n")[1].split()[1:] == ["start", "imports", "read", "build",
                                                                         "weights", "prefill", "first", "token",
                                                                         "total"]
    for r in rows:
        parts, total = [float(x) for x in r[1:-1]], float(r[-1])
        assert all(p >= 0 for p in parts) and abs(sum(parts) - total) < 0.1 + 0.1 * total, r


def test_bench_chat_turns_reuses_the_cache(chat_folder):
    """scripts/bench_chat_turns.py: from the second turn on, the kept cache prefills fewer tokens
    than the whole prompt (and the script checks that both choose the same first token)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_chat_turns.py"), str(chat_folder),
                           "--turns", "3", "--max-new-tokens", "8"], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'scripts'}"})
    assert proc.returncode == 0, proc.stderr
    rows = [line.replace("|", " ").split() for line in proc.stdout.splitlines() if re.match(r"\s+\d+\s+\d+ \|", line)]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    for r in rows[1:]:
        prompt, kept, again = int(r[1]), int(r[2]), int(r[4])
        assert kept < prompt == again, r
