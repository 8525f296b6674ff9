"""scripts/bench_model.py --shape tiny: every engine loads the one folder, the table is
well formed, and the engines' greedy tokens agree (not speed). llama.cpp's rows are
there when llama-cpp-python and gguf are (the [llama] extra), skipped with a note when not.
--gguf on a tiny Q4_1 file and the Q8_0 file llama.cpp's quantizer makes of it: the table,
issue 44's target lines, the report's fields, and the bytes a token reads, counted by hand."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from test_benchlib import benchlib  # noqa: F401 (the fixture: scripts/benchlib, importable while this module runs)

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
                           "--repeats", "1", "--prompt", "8", "--kinds", "F32,F32+F16w",
                           "--bw-passes", "1", "--folder", str(tmp_path / "tiny"), "--json", str(report)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    rows = [ROW.match(line) for line in proc.stdout.splitlines() if re.match(r"\| (Kina|transformers|llama)", line)]
    assert all(rows), proc.stdout
    names = [(m[1], m[2], m[3]) for m in rows]
    want = [("Kina", dt, n) for dt in ("F32", "F32+F16w") for n in ("1", "2")] + \
        [("transformers", "F32", "1"), ("transformers", "F32", "2")]
    if llama_cpp_installed():
        want += [("llama.cpp", dt, n) for dt in ("F32", "F16") for n in ("1", "2")]
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

    markdown_rewrites_its_table(tmp_path, report, "--shape tiny", ROW, len(rows))


def markdown_rewrites_its_table(tmp_path, report, which: str, row: re.Pattern, n_rows: int) -> None:
    """--markdown from the report rewrites only what is between the markers of `which` ("--shape
    tiny", "--gguf"): where the figures come from, then the table's n_rows rows."""
    doc = tmp_path / "performance.md"
    begin = f"<!-- BEGIN bench_model {which} --markdown: generated, edit the script rather than this table -->"
    end = f"<!-- END bench_model {which} --markdown -->"
    doc.write_text(f"before\n{begin}\nSTALE TABLE\n{end}\nafter\n")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_model.py"), "--from-json", str(report),
                           "--markdown", "--doc", str(doc)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = doc.read_text()
    assert text.startswith(f"before\n{begin}\nFrom `python scripts/bench_model.py {which}") and "STALE TABLE" not in text
    assert text.endswith(f"{end}\nafter\n") and len([ln for ln in text.splitlines() if row.match(ln)]) == n_rows


# -- --gguf: GGUF files ---------------------------------------------------------------------

GGUF_ROW = re.compile(r"^\| (Q4_1|Q8_0) \| (Kina|llama\.cpp) \| [\d.]+ / [\d.]+ ms \| [\d.]+ / [\d.]+ ms \| \d+ \| "
                      r"\d+% \| \d+ MB \| ([^|]+) \| ([-\d.e+]+)( \(\d+ steps?\))? \|$")
TARGET = re.compile(r"^(PASS|FAIL)  (Q4_1|Q8_0): Kina (decode [\d.]+ ms \(\dT\) reaches this share of the 2T floor"
                    r"|decode [\d.]+ ms \(\dT\) / llama\.cpp's best|prefill [\d.]+ ms \(\dT\) / llama\.cpp's best"
                    r"|peak memory \d+ MB / llama\.cpp's \d+ MB)")


def test_gguf_files_table_targets_and_tokens(tmp_path, benchlib):
    """A tiny Q4_1 file (its head a tied Q8_0 table, as SmolLM2's) and the Q8_0 file llama.cpp's
    quantizer makes from it: Kina and llama.cpp on both, against transformers on each."""
    pytest.importorskip("gguf")
    from benchlib import engines as bench_engines
    folder, _ = bench_engines.build_folder("tiny", 0, tmp_path / "tiny")
    source = bench_engines.write_gguf(folder, tmp_path / "tiny-q4_1.gguf", "Q4_1", embed_dtype="Q8_0")
    llama = llama_cpp_installed()
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_model.py"), "--gguf", str(source),
                           "--folder", str(tmp_path / "files"), "--quantize", "Q8_0", "--new", "4", "--repeats", "1",
                           "--prompt", "8", "--bw-passes", "1", "--json", str(report)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    rows = [GGUF_ROW.match(line) for line in out if re.match(r"\| (Q4_1|Q8_0) ", line)]
    assert all(rows), proc.stdout
    files = ["Q4_1", "Q8_0"] if llama else ["Q4_1"]
    engines = ["Kina", "llama.cpp"] if llama else ["Kina"]
    assert [(m[1], m[2]) for m in rows] == [(f, e) for f in files for e in engines]
    assert all(m[3] == "all agree" for m in rows if m[2] == "Kina"), proc.stdout
    if not llama:
        assert "llama.cpp rows and the targets against them are skipped" in proc.stdout

    # Kina's tokens and logits pass; each file has issue 44's four targets (one without llama.cpp)
    checks = [line for line in out if line.startswith(("PASS", "FAIL"))]
    assert all(line.startswith("PASS") for line in checks if re.match(r"^\w+  (tokens|logits):", line)), proc.stdout
    targets = [TARGET.match(line) for line in checks if not re.match(r"^\w+  (tokens|logits):", line)]
    assert all(targets) and len(targets) == len(files) * (4 if llama else 1), proc.stdout
    assert f"targets: {sum(line.startswith('PASS') for line in checks)} of {len(checks)} pass" in out

    r = json.loads(report.read_text())
    assert r["format"] == "kina-bench-model-gguf-1" and list(r["files"]) == files
    # the bytes a token reads (by hand): a layer's Q4_1 matrices (32-element blocks of 20 bytes, rows
    # of 32 or 64) q 32x1x20 + k 16x20 + v 16x20 + o 32x20 + gate 64x20 + up 64x20 + down 32x2x20 = 5760
    # and two F32 gains 2x32x4 = 256; two layers, the final gain 128, the tied head (the Q8_0 table,
    # 320 rows of one 34-byte block) 10880: 2 x 6016 + 128 + 10880
    assert r["files"]["Q4_1"]["bytes_per_token"] == 2 * 6016 + 128 + 10880 == 23040
    if llama:  # every matrix Q8_0: a layer 10048 with its gains
        assert r["files"]["Q8_0"]["bytes_per_token"] == 2 * 10048 + 128 + 10880
    for label, f in r["files"].items():
        assert set(f["floor_s"]) == {"1", "2"} and f["floor_s"]["1"] == f["bytes_per_token"] / r["read_bw"]["1"]
        assert f["same_answer"]["Kina"] and set(f["peak"]) == set(engines)
        for engine, p in f["peak"].items():  # a process of its own loaded the file and generated the same tokens
            assert p["peak_bytes"] > p["baseline_bytes"] > 0 and p["tokens"] == r["rows"][f"{label} {engine} 2T"]["tokens"]
    assert all(len(m["tokens"]) == 4 for m in r["rows"].values())
    assert all(len(c["rel_err_steps"]) == c["steps_compared"] for c in r["compared"])

    markdown_rewrites_its_table(tmp_path, report, "--gguf", GGUF_ROW, len(rows))


def test_bytes_a_token_reads_of_a_gguf_file(tmp_path, benchlib):
    """Every layer's tensors and the final norm at their stored sizes, and the head: output.weight
    when the file has one (the embedding table is then not read), else the embedding table."""
    gguf_files = pytest.importorskip("gguf_files")
    from benchlib import ggufs
    config = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-5)
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (64, 32), "model.norm.weight": (32,), "lm_head.weight": (64, 32),
              "model.layers.0.input_layernorm.weight": (32,), "model.layers.0.post_attention_layernorm.weight": (32,),
              "model.layers.0.self_attn.q_proj.weight": (32, 32), "model.layers.0.self_attn.k_proj.weight": (16, 32),
              "model.layers.0.self_attn.v_proj.weight": (16, 32), "model.layers.0.self_attn.o_proj.weight": (32, 32),
              "model.layers.0.mlp.gate_proj.weight": (64, 32), "model.layers.0.mlp.up_proj.weight": (64, 32),
              "model.layers.0.mlp.down_proj.weight": (32, 64)}
    tensors = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    # Q8_0 rows: 34 bytes per 32 values. The layer: q 32x34 + k 16x34 + v 16x34 + o 32x34 + gate 64x34
    # + up 64x34 + down 32x2x34 = 9792, its gains 2x32x4 = 256; the final gain 128
    body = 9792 + 256 + 128
    untied = tmp_path / "untied.gguf"  # the head output.weight (Q8_0, 64x34); the F32 table is not read
    gguf_files.write(untied, tensors, {**config, "tie_word_embeddings": False}, "Q8_0", embed_type="F32")
    tied = tmp_path / "tied.gguf"  # no output.weight: the head is the F32 table, 64x32x4
    gguf_files.write(tied, {k: v for k, v in tensors.items() if k != "lm_head.weight"},
                     {**config, "tie_word_embeddings": True}, "Q8_0", embed_type="F32")
    assert ggufs.bytes_per_token(untied) == body + 64 * 34
    assert ggufs.bytes_per_token(tied) == body + 64 * 32 * 4
    assert ggufs.file_label(untied) == "Q8_0"  # gguf_files writes no file type: the commonest matrix type
