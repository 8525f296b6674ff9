"""The pictures and the progress bar: `--plot` in scripts/bench_decode.py and
scripts/bench_kv_step.py (matplotlib, skipped when it is missing) and the tqdm bar
of scripts/demo_generate.py. Small synthetic data, so nothing here measures for long."""
import importlib.util
import io
import json
import sys

import pytest

from conftest import ROOT

SCRIPTS = ROOT / "scripts"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIB = 1 << 20


@pytest.fixture
def scripts(monkeypatch):
    """Import a script by name, with scripts/ on sys.path as when it is run (for its own imports)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))

    def load(name):
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up while it runs
        spec.loader.exec_module(module)
        return module
    return load


def assert_png(path, width=900):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert 10_000 < len(data) < 200_000, f"{path}: {len(data)} bytes"
    assert int.from_bytes(data[16:20], "big") == width  # IHDR: the width it is meant to be read at


# -- bench_decode --plot -----------------------------------------------------------

def test_bench_decode_plot_writes_a_png(scripts, tmp_path):
    pytest.importorskip("matplotlib")
    bench = scripts("bench_decode")
    n = [2, 100, 200, 300, 400]
    cached = [1e-4 + 2e-8 * k for k in n]
    recompute = [2e-4 + 1e-6 * k + 1e-8 * k * k for k in n]
    out = bench.plot(tmp_path / "sub" / "decode.png", n, cached, recompute, "TinyDecoder d_model=8", 3)
    assert out == tmp_path / "sub" / "decode.png"
    assert_png(out)


def test_bench_decode_measures_and_plots(scripts, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "decode.png"
    assert scripts("bench_decode").main(["--tokens", "20", "--repeats", "1", "--d-model", "8", "--plot", str(png)]) == 0
    assert f"wrote {png}" in capsys.readouterr().out
    assert_png(png)


def test_bench_decode_refuses_a_plot_format_before_measuring(scripts, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit, match=r"--plot: expected a file name ending in one of .*\.png.*got '.*plot\.xyz'"):
        scripts("bench_decode").main(["--tokens", "20", "--plot", str(tmp_path / "plot.xyz")])
    assert "TinyDecoder" not in capsys.readouterr().out  # refused before anything ran


# -- bench_kv_step --plot ----------------------------------------------------------

VARIANTS = {"kina functional": ("functional", 1.0), "numpy": ("functional", 1.7), "torch 1T": ("functional", 1.9),
            "kina in place": ("in place", 1.2), "numpy in place": ("in place", 1.5)}


def tiny_report(shapes=((4, 16), (2, 8)), s_past=(127, 511, 2047)) -> dict:
    """A report shaped like the one bench_kv_step.py writes, with made-up numbers."""
    sizes = []
    for H, Dh in shapes:
        for S in s_past:
            cache = 2 * H * Dh * (S + 1) * 4
            floor = {"functional": cache / 15e9, "in place": cache / 33e9}
            sizes.append({"H": H, "Dh": Dh, "B": 1, "S_past": S, "cache_bytes": cache, "floor_s": floor,
                          "variants": {name: {"median_s": floor[kind] * x, "floor": kind}
                                       for name, (kind, x) in VARIANTS.items()}})
    return {"format": "kina-bench-kv-step-1", "date": "2026-01-01T00:00:00Z",
            "machine": {"cpu": "Test CPU", "cores": 2}, "versions": {"commit": "abc1234"},
            "args": {"repeats": 3, "shapes": ",".join(f"{h}x{d}" for h, d in shapes),
                     "s_past": ",".join(map(str, s_past))},
            "bandwidth": {"Bps": {"read": 33e9, "copy": 15e9}}, "sizes": sizes}


def test_bench_kv_step_plot_writes_a_png(scripts, tmp_path):
    pytest.importorskip("matplotlib")
    out = scripts("bench_kv_step").plot(tiny_report(), tmp_path / "kv.png")
    assert_png(out)


def test_bench_kv_step_plots_from_json_without_measuring(scripts, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    report, png = tmp_path / "report.json", tmp_path / "kv.png"
    report.write_text(json.dumps(tiny_report(shapes=((4, 16),), s_past=(127, 511))))
    assert scripts("bench_kv_step").main(["--plot", str(png), "--from-json", str(report)]) == 0
    assert capsys.readouterr().out == f"wrote {png}\n"  # drew, and measured nothing
    assert_png(png)


def test_bench_kv_step_from_json_errors(scripts, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    bench, png = scripts("bench_kv_step"), str(tmp_path / "kv.png")
    with pytest.raises(SystemExit) as e:
        bench.main(["--from-json", "x.json"])
    assert e.value.code == 2 and "--from-json reads a report: give --plot FILE.png or --markdown too" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--from-json: cannot read .*missing\.json"):
        bench.main(["--plot", png, "--from-json", str(tmp_path / "missing.json")])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"--from-json: .*bad\.json is not JSON"):
        bench.main(["--plot", png, "--from-json", str(tmp_path / "bad.json")])
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    with pytest.raises(SystemExit, match=r"expected a 'kina-bench-kv-step-1' report .*got format 'something-else'"):
        bench.main(["--plot", png, "--from-json", str(tmp_path / "other.json")])
    assert not (tmp_path / "kv.png").exists()


def test_bench_kv_step_markdown_table_from_json(scripts, tmp_path, capsys):
    """--markdown prints the performance table from a report (medians, and their ratios) and rewrites
    it between the markers of the doc, leaving the rest of the file as it was."""
    times = {"kina fn() 1T": 2.0, "kina fn() 2T": 1.5, "kina call_into 1T": 1.6, "kina call_into 2T": 1.5,
             "kina loop fn() 1T": 2.2, "kina loop call_into 1T": 2.0, "numpy": 5.0, "torch 1T": 6.0,
             "torch 2T": 4.0, "ort 1T": 5.5, "ort 2T": 3.0, "kina in place 1T": 1.25, "kina in place 2T": 1.0,
             "numpy in place": 2.5}
    cache = 2 * 32 * 128 * 2048 * 4  # 64 MiB
    report = tiny_report()
    report["args"].update(threads=[1, 2], default_threads=2)
    report["bandwidth"]["by_threads"] = {"1": {"read": 64e9}, "2": {"read": 80e9}}
    report["sizes"] = [{"H": 32, "Dh": 128, "B": 1, "S_past": 2047, "cache_bytes": cache,
                        "variants": {name: {"median_s": t * 1e-3} for name, t in times.items()}}]
    report["command"] = "python scripts/bench_kv_step.py --repeats 9"
    report["compile"] = {"cold_median_s": 0.193, "cold_s": [0.19, 0.232], "warm_median_s": 0.0001}
    report["checks"] = [{"pass": True}, {"pass": False}, {"pass": True}]
    path, doc = tmp_path / "report.json", tmp_path / "performance.md"
    path.write_text(json.dumps(report))
    bench = scripts("bench_kv_step")
    before, after = "# Performance\n\nProse before.\n\n", "\nProse after, kept.\n"
    doc.write_text(f"{before}{bench.rep.BEGIN}\nthe old table\n{bench.rep.END}\n{after}")
    assert bench.main(["--markdown", "--from-json", str(path), "--doc", str(doc)]) == 0
    header, rule, row, wrote = capsys.readouterr().out.splitlines()
    assert header.startswith("| H, Dh | S_past (cache) | Kina fn() 1T / 2T |") and rule.count("---") == 11
    assert row == ("| 32, 128 | 2047 (64 MiB) | 2.00 / 1.50 ms | 1.25, 1.10 | 0.30 | 5.00 ms | 4.00 ms | 3.00 ms "
                   "| 1.25 / 1.00 ms | 0.50 | 53.7 GB/s (84%) |")
    assert wrote == f"wrote the table into {doc}"
    text = doc.read_text()  # the table between the markers, with where it comes from; the rest untouched
    assert text.startswith(before) and text.endswith(f"{bench.rep.END}\n{after}") and "the old table" not in text
    inside = text[len(before):].split("\n")
    assert inside[0] == bench.rep.BEGIN and inside[-4] == bench.rep.END
    assert inside[1].startswith("From `python scripts/bench_kv_step.py --repeats 9` at commit abc1234, "
                                "2026-01-01T00:00:00Z, on 2 cores of Test CPU; medians.")
    assert "Cold compile 193.0 ms (190.0-232.0); a cache hit 0.100 ms." in inside
    assert "Targets (issues 6 and 11): 2 of 3 checks pass." in inside
    assert inside[-7:-4] == [header, rule, row]  # the table sits last, just above END

    # regenerating from the same report changes nothing; a file without the markers is refused, unchanged
    assert bench.main(["--markdown", "--from-json", str(path), "--doc", str(doc)]) == 0
    assert doc.read_text() == text
    doc.write_text("no markers here\n")
    with pytest.raises(SystemExit, match=r"--markdown: .*performance\.md needs one .*BEGIN bench_kv_step"):
        bench.main(["--markdown", "--from-json", str(path), "--doc", str(doc)])
    assert doc.read_text() == "no markers here\n"


def test_performance_doc_has_the_markers(scripts):
    """docs/performance.md holds the generated table between the markers --markdown rewrites."""
    rep = scripts("bench_kv_step").rep
    text = rep.DOC.read_text()
    assert text.count(rep.BEGIN) == 1 and text.count(rep.END) == 1 and text.index(rep.BEGIN) < text.index(rep.END)
    block = text[text.index(rep.BEGIN):text.index(rep.END)]
    assert "| H, Dh | S_past (cache) |" in block and "From `" in block


# -- demo_generate's progress bar --------------------------------------------------

class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_tqdm_bar_with_the_step_time(scripts):
    demo = scripts("demo_generate")
    term = Terminal()
    with demo.progress(3, stream=term) as on_step:
        for i, token in enumerate((7, 8, 9)):
            on_step(i, token, 0.00125)
    drawn = term.getvalue()
    assert "100%|" in drawn and "3/3" in drawn and "tok/s" in drawn  # tqdm's bar, counting tokens
    assert "step   1.250 ms, token     9" in drawn
    assert drawn.endswith("\n")  # closed: the next line starts clean


def test_progress_writes_nothing_when_not_on_a_terminal(scripts):
    demo = scripts("demo_generate")
    pipe = io.StringIO()
    with demo.progress(3, stream=pipe) as on_step:
        for i in range(3):
            on_step(i, 1, 0.001)
    assert pipe.getvalue() == ""


def test_demo_draws_the_bar_on_a_terminal_and_the_summary_on_stdout(scripts, monkeypatch, capsys):
    demo, term = scripts("demo_generate"), Terminal()
    monkeypatch.setattr(sys, "stderr", term)  # what tqdm asks (isatty) is all that makes a terminal here
    assert demo.main(["--tokens", "40", "--prompt", "4", "--d-model", "16", "--layers", "1"]) == 0
    bar, out = term.getvalue(), capsys.readouterr().out
    assert "100%|" in bar and "40/40" in bar and "tok/s" in bar and "ms, token" in bar
    assert "tokens/s" in out and "first step (prefill of 4 tokens)" in out and "40/40" not in out
