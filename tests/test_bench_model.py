"""scripts/bench_model.py --shape tiny: every engine loads the one folder, the table is
well formed, and the engines' greedy tokens agree (not speed). llama.cpp's rows are
there when llama-cpp-python and gguf are (the [llama] extra), skipped with a note when not."""
import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROW = re.compile(r"^\| (Kina|transformers|llama\.cpp) (F32|F16|BF16|F32\+F16w|F32\+BF16w) \| (\d) \| ([\d.]+) ms \| ([\d.]+) ms \| (\d+) \| "
                 r"([\d.]+) ms \| (\d+)% \| (reference|all agree|differ from step \d+ of \d+) \| ([-\d.e+]+)( \(\d+ steps\))? \|$")


def llama_cpp_installed() -> bool:
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def test_tiny_shape_table_and_tokens(tmp_path):
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_model.py"), "--shape", "tiny", "--new", "4",
                           "--repeats", "1", "--prompt", "8",
                           "--bw-passes", "1", "--folder", str(tmp_path / "tiny"), "--json", str(report)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    rows = [ROW.match(line) for line in proc.stdout.splitlines() if re.match(r"\| (Kina|transformers|llama)", line)]
    assert all(rows), proc.stdout
    names = [(m[1], m[2], m[3]) for m in rows]
    want = [("Kina", dt, n) for dt in ("F32", "F16", "BF16", "F32+F16w", "F32+BF16w") for n in ("1", "2")] + \
        [("transformers", "F32", "1"), ("transformers", "F32", "2")]
    if llama_cpp_installed():
        want += [("llama.cpp", dt, n) for dt in ("F32", "F16", "BF16") for n in ("1", "2")]
    else:
        assert "llama.cpp rows are skipped" in proc.stdout
    assert names == want
    for m in rows:  # the F32 engines give transformers' tokens (F16 ones may part at a near tie)
        if m[2] == "F32":
            assert m[9] in ("reference", "all agree"), m[0]
    assert "FAIL" not in proc.stdout, proc.stdout
    r = json.loads(report.read_text())
    assert set(r["read_bw"]) == {"1", "2"} and r["weight_bytes_per_token"]["F32"] == 2 * r["weight_bytes_per_token"]["F16"]
    assert all(len(row["tokens"]) == 4 for row in r["rows"].values())

    # --markdown from the report rewrites only what is between this shape's markers
    doc = tmp_path / "performance.md"
    begin = "<!-- BEGIN bench_model --shape tiny --markdown: generated, edit the script rather than this table -->"
    end = "<!-- END bench_model --shape tiny --markdown -->"
    doc.write_text(f"before\n{begin}\nSTALE TABLE\n{end}\nafter\n")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_model.py"), "--from-json", str(report),
                           "--markdown", "--doc", str(doc)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = doc.read_text()
    assert text.startswith(f"before\n{begin}\nFrom `python scripts/bench_model.py --shape tiny") and "STALE TABLE" not in text
    assert text.endswith(f"{end}\nafter\n") and len([ln for ln in text.splitlines() if ROW.match(ln)]) == len(rows)
