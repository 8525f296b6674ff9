"""The kv_step benchmark's report: targets, the JSON file, the printed tables, --markdown, --plot.

In:  the run's per-size results (kvstep.run_size, with floor.add_floors applied), the
     bandwidth (bandwidth.bandwidth, fitted by floor.fit_floors), the compile times and notes;
     or a report written earlier (load_report).
Out: checks() gives each target as {issue, check, value, op, limit, pass, best_vs_best};
     make_report() the JSON-able report (format REPORT_FORMAT, read back by load_report);
     markdown_block() the performance table with where it comes from, and update_doc()
     writes it between the BEGIN/END markers of docs/performance.md; plot() the figure.
Guarantees: load_report and update_doc fail with one line (SystemExit) saying what is wrong
with the file, never a traceback; update_doc changes nothing outside its markers.

Targets, judged on the medians at caches (K+V of S_past+1 positions) of 4 MiB and up:
  issue 11: the public call, one-off and in the host loop, <= 1.1x the same kernel through
    call_into (each thread count); kina fn() at the default thread count <= 0.6x NumPy;
    KVCache.step on one thread reads K+V at >= 85% of read_bw[1] at caches >= 16 MiB, and is no
    slower than NumPy in place below 16 MiB; on two threads >= 1.25x faster than on one at
    caches >= 64 MiB; kina fn() at the default thread count faster than torch and ort, each at
    its best thread count; cold compile <= 200 ms (goal 150), cache hit <= 1 ms.
  issue 6: kina call_unchecked 1T <= 0.6x NumPy and <= 1.5x its floor, faster than every torch
    row; kina in place 1T <= 0.75x NumPy in place and <= 1.3x its floor.
Ratios are of medians; "best vs best" divides the two variants' fastest samples, the steadier
figure when a neighbour is busy.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

from .machine import ROOT

MIB = 1 << 20
REPORT_FORMAT = "kina-bench-kv-step-1"
TARGET_MIN_CACHE = 4 * MIB
DOC = ROOT / "docs" / "performance.md"
BEGIN = "<!-- BEGIN bench_kv_step --markdown: generated, edit the script rather than this table -->"
END = "<!-- END bench_kv_step --markdown -->"


def positive_ints(text: str) -> list[int]:
    """An argparse type: "1,2" -> [1, 2], sorted and without repeats; at least one, all >= 1."""
    try:
        values = {int(t) for t in text.split(",") if t.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return sorted(values)


def fmt_t(s: float) -> str:
    """Seconds as milliseconds with three significant-ish figures: 0.123, 1.23, 12.34, 123.4."""
    ms = s * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


# -- targets -----------------------------------------------------------------------

OPS = {"<=": lambda v, lim: v <= lim, "<": lambda v, lim: v < lim, ">=": lambda v, lim: v >= lim}


def checks(results: list[dict], compile_t: dict | None, bw: dict[int, dict], default_threads: int) -> list[dict]:
    """The targets of issues 11 and 6 (see the module docstring), each with its value and verdict."""
    out = []

    def check(issue, what, value, op, limit, best=None):
        if value is not None:  # None: a variant that was skipped or could not run
            out.append({"issue": issue, "check": what, "value": value, "op": op, "limit": limit,
                        "pass": OPS[op](value, limit), "best_vs_best": best})

    def ratio(v, a, b, stat="median_s"):
        return v[a][stat] / v[b][stat] if a in v and b in v else None

    threads = sorted(bw)
    one, most, D = min(threads), max(threads), default_threads
    for r in results:
        if r["cache_bytes"] < TARGET_MIN_CACHE:
            continue
        v, tag = r["variants"], f"{r['cache_bytes'] / MIB:g} MiB (H={r['H']} Dh={r['Dh']} S={r['S_past']})"
        for n in threads:
            for pub, ref in ((f"kina fn() {n}T", f"kina call_into {n}T"), (f"kina loop fn() {n}T", f"kina loop call_into {n}T")):
                check(11, f"{tag}: {pub} / {ref}", ratio(v, pub, ref), "<=", 1.1, ratio(v, pub, ref, "min_s"))
        public = f"kina fn() {D}T"
        check(11, f"{tag}: {public} (default threads) / numpy", ratio(v, public, "numpy"), "<=", 0.6,
              ratio(v, public, "numpy", "min_s"))
        ip1 = v.get(f"kina in place {one}T")
        if ip1 and r["cache_bytes"] >= 16 * MIB:
            share = lambda t: r["cache_bytes"] / t / bw[one]["read"]  # noqa: E731
            check(11, f"{tag}: kina in place {one}T reads K+V at this share of read_bw[{one}] "
                      f"({bw[one]['read'] / 1e9:.1f} GB/s)", share(ip1["median_s"]), ">=", 0.85, share(ip1["min_s"]))
        elif ip1:
            check(11, f"{tag}: kina in place {one}T / numpy in place", ip1["ratio_vs"], "<=", 1.0, ip1["ratio_vs_best"])
        if r["cache_bytes"] >= 64 * MIB and most > one:
            a, b = f"kina in place {one}T", f"kina in place {most}T"
            check(11, f"{tag}: speed-up of {b} over {a}", ratio(v, a, b), ">=", 1.25, ratio(v, a, b, "min_s"))
        for lib in ("torch", "ort"):
            rows = [name for name in v if name.startswith(f"{lib} ")]
            if rows and public in v:
                fastest = min(rows, key=lambda name: v[name]["median_s"])
                check(11, f"{tag}: {public} / {fastest} (its best thread count)", ratio(v, public, fastest), "<", 1.0,
                      ratio(v, public, min(rows, key=lambda name: v[name]["min_s"]), "min_s"))
        kernel = "kina call_unchecked 1T"
        if kernel in v:
            check(6, f"{tag}: {kernel} / numpy", v[kernel]["ratio_vs"], "<=", 0.6, v[kernel]["ratio_vs_best"])
            check(6, f"{tag}: {kernel} / floor", v[kernel]["ratio_floor"], "<=", 1.5)
            for name in (n for n in v if n.startswith("torch ")):
                check(6, f"{tag}: {kernel} / {name}", ratio(v, kernel, name), "<", 1.0, ratio(v, kernel, name, "min_s"))
        if ip1:
            check(6, f"{tag}: kina in place {one}T / numpy in place", ip1["ratio_vs"], "<=", 0.75, ip1["ratio_vs_best"])
            check(6, f"{tag}: kina in place {one}T / floor", ip1["ratio_floor"], "<=", 1.3)
    if compile_t:
        check(11, "cold compile (s)", compile_t["cold_median_s"], "<=", 0.200)
        check(11, "cache hit (s)", compile_t["warm_median_s"], "<=", 0.001)
    return out


# -- printed -----------------------------------------------------------------------

def print_compile(c: dict) -> None:
    print(f"compile {c['file']}: cold {fmt_t(c['cold_median_s'])} ms median "
          f"({fmt_t(min(c['cold_s']))}-{fmt_t(max(c['cold_s']))}, first in process "
          f"{fmt_t(c['first_s'])}); warm (cache hit) {fmt_t(c['warm_median_s'])} ms, "
          f"compile_file+load {fmt_t(c['warm_compile_file_and_load_s'])} ms")


def print_bandwidth(bw: dict[int, dict], passes: int) -> None:
    print(f"bandwidth (GB/s, best of {passes} passes of each kernel on 256 MiB; median in brackets):")
    for n, b in bw.items():
        kernels = ", ".join(f"{name} {c['best'] / 1e9:.1f} [{c['median'] / 1e9:.1f}]" for name, c in b["candidates"].items())
        print(f"  {n} thread{'s' * (n > 1)}: read {b['read'] / 1e9:.1f} ({b['read_by']}), "
              f"copy {b['copy'] / 1e9:.1f} ({b['copy_by']}, bytes copied per second)\n    kernels: {kernels}")


def print_size(r: dict) -> None:
    fl = r["floor_s_threads"]
    floors = "; ".join(f"{n}T functional {fmt_t(f['functional'])}, in place {fmt_t(f['in place'])}" for n, f in fl.items())
    a = r["allocator"]
    print(f"\nH={r['H']} Dh={r['Dh']} S_past={r['S_past']}  cache {r['cache_bytes'] / MIB:.2f} MiB  "
          f"sets {r['sets']['functional']}/{r['sets']['in_place']} "
          f"(working set {r['working_set_bytes']['functional'] / MIB:.0f}/{r['working_set_bytes']['in_place'] / MIB:.0f} MiB)"
          f"  results allocator: {a['allocated']} allocated, {a['reused']} reused\n  floor ms: {floors}")
    print(f"  {'variant':<23} {'median (min-max) ms':>27} {'x ref':>6} {'(best)':>7}  {'ref':<23} {'x floor':>7} "
          f"{'K+V GB/s':>8}")
    for name, v in r["variants"].items():
        span = f"{fmt_t(v['median_s'])} ({fmt_t(v['min_s'])}-{fmt_t(v['max_s'])})"
        ratio = f"{v['ratio_vs']:.2f}" if v["ratio_vs"] is not None else "-"
        best = f"({v['ratio_vs_best']:.2f})" if v["ratio_vs_best"] is not None else "-"
        print(f"  {name:<23} {span:>27} {ratio:>6} {best:>7}  {v['vs']:<23} {v['ratio_floor']:>7.2f} "
              f"{r['cache_bytes'] / v['median_s'] / 1e9:>8.1f}")


def print_checks(results_checks: list[dict]) -> None:
    for issue in (11, 6):
        mine = [c for c in results_checks if c["issue"] == issue]
        print(f"\nissue {issue} targets: {sum(c['pass'] for c in mine)} of {len(mine)} pass")
        for c in mine:
            best = f"; best vs best {c['best_vs_best']:.3f}" if c["best_vs_best"] is not None else ""
            print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['check']}: {c['value']:.3f} (limit {c['op']} {c['limit']}{best})")


# -- the JSON ----------------------------------------------------------------------

def make_report(*, machine: dict, versions: dict, args: dict, bw: dict[int, dict], measured: dict,
                bw_samples: dict, compile_t: dict | None, results: list[dict], results_checks: list[dict],
                notes: list[str]) -> dict:
    """The report as --json writes it: every figure, the samples, the checks and the notes."""
    return {
        "format": REPORT_FORMAT, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": machine, "versions": {**versions, "python": platform.python_version()},
        "args": {k: sorted(v) if isinstance(v, set) else v for k, v in args.items() if k != "sizes"},
        "bandwidth": {"Bps": {k: v for k, v in bw[min(bw)].items() if k != "candidates"},
                      "by_threads": {str(n): b for n, b in bw.items()}, "kernels_Bps": measured,
                      "samples_Bps": bw_samples},
        "compile": compile_t, "sizes": results, "checks": results_checks, "notes": notes,
    }


def write_report(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def load_report(path: str, fmt: str | tuple[str, ...] = REPORT_FORMAT) -> dict:
    """A report of format `fmt` (default make_report's, --json; or any of a tuple of formats),
    or SystemExit saying what is wrong with the file."""
    formats = (fmt,) if isinstance(fmt, str) else fmt
    try:
        report = json.loads(Path(path).read_text())
    except OSError as e:
        raise SystemExit(f"error: --from-json: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise SystemExit(f"error: --from-json: {path} is not JSON: {e}") from None
    if not isinstance(report, dict) or report.get("format") not in formats:
        got = report.get("format") if isinstance(report, dict) else type(report).__name__
        raise SystemExit(f"error: --from-json: expected a {' or '.join(map(repr, formats))} report (from --json), "
                         f"got format {got!r} in {path}")
    return report


# -- markdown ----------------------------------------------------------------------

def markdown_table(report: dict) -> str:
    """The performance table: one row per size, from a report (medians)."""
    try:
        D = report["args"]["default_threads"]
        one, most = min(report["args"]["threads"]), max(report["args"]["threads"])
        bw = report["bandwidth"]["by_threads"][str(one)]["read"]
    except (KeyError, TypeError, ValueError) as e:
        raise SystemExit(f"--markdown: the report lacks {e} (it predates --markdown: run the benchmark again)")

    def ms(v):
        return f"{fmt_t(v['median_s'])} ms" if v else "-"

    def best_of(v, lib):
        rows = [x for name, x in v.items() if name.startswith(f"{lib} ")]
        return ms(min(rows, key=lambda x: x["median_s"])) if rows else "-"

    def ratio(v, a, b):
        return f"{v[a]['median_s'] / v[b]['median_s']:.2f}" if a in v and b in v else "-"
    lines = [f"| H, Dh | S_past (cache) | Kina fn() {one}T / {most}T | vs call_into ({one}T, loop {one}T) | "
             f"{D}T vs NumPy | NumPy | torch best | ort best | in place {one}T / {most}T | "
             f"vs NumPy in place ({one}T) | in place {one}T reads K+V at |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["sizes"]:
        v, c = r["variants"], r["cache_bytes"]
        ip = v.get(f"kina in place {one}T")
        reads = f"{c / ip['median_s'] / 1e9:.1f} GB/s ({c / ip['median_s'] / bw:.0%})" if ip else "-"
        lines.append(
            f"| {r['H']}, {r['Dh']} | {r['S_past']} ({c / MIB:g} MiB) | "
            f"{ms(v.get(f'kina fn() {one}T'))[:-3]} / {ms(v.get(f'kina fn() {most}T'))} | "
            f"{ratio(v, f'kina fn() {one}T', f'kina call_into {one}T')}, "
            f"{ratio(v, f'kina loop fn() {one}T', f'kina loop call_into {one}T')} | "
            f"{ratio(v, f'kina fn() {D}T', 'numpy')} | {ms(v.get('numpy'))} | {best_of(v, 'torch')} | "
            f"{best_of(v, 'ort')} | {fmt_t(ip['median_s']) if ip else '-'} / {ms(v.get(f'kina in place {most}T'))} | "
            f"{ratio(v, f'kina in place {one}T', 'numpy in place')} | {reads} |")
    return "\n".join(lines)


def provenance(report: dict) -> str:
    """Where the table's figures come from: the command, commit, date, machine, bandwidth, compile."""
    m, versions = report.get("machine", {}), report.get("versions", {})
    parts = [f"From `{report.get('command', 'scripts/bench_kv_step.py')}` at commit {versions.get('commit', '?')}, "
             f"{report.get('date', '?')}, on {m.get('cores', '?')} cores of {m.get('cpu', 'an unknown CPU')}"]
    load = m.get("load_average_start_end")
    if load:
        parts[0] += f" (load average {load[0]:.2f} at the start, {load[1]:.2f} at the end)"
    parts[0] += "; medians."
    c = report.get("compile")
    if c:
        parts.append(f"Cold compile {fmt_t(c['cold_median_s'])} ms ({fmt_t(min(c['cold_s']))}-"
                     f"{fmt_t(max(c['cold_s']))}); a cache hit {fmt_t(c['warm_median_s'])} ms.")
    by = report.get("bandwidth", {}).get("by_threads", {})
    bws = [f"{n} thread{'s' * (n != '1')}: read {b['read'] / 1e9:.1f}, copy {b['copy'] / 1e9:.1f} GB/s"
           for n, b in by.items() if "read" in b and "copy" in b]
    if bws:
        parts.append("Bandwidth, " + "; ".join(bws) + ".")
    ch = report.get("checks")
    if ch:
        parts.append(f"Targets (issues 6 and 11): {sum(x['pass'] for x in ch)} of {len(ch)} checks pass.")
    return "\n".join(parts)


def markdown_block(report: dict) -> str:
    """What goes between the markers: the provenance, a blank line, the table."""
    return f"{provenance(report)}\n\n{markdown_table(report)}"


def update_doc(path: str | Path, block: str, begin: str = BEGIN, end: str = END) -> Path:
    """Replace what is between the `begin` and `end` lines in `path` with `block` (the
    markers stay); by default bench_kv_step's markers."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SystemExit(f"error: --markdown: cannot read {path}: {e.strerror}") from None
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"error: --markdown: {path} needs one {begin!r} line and, after it, one {end!r} line")
    path.write_text(pattern.sub(lambda _: f"{begin}\n{block}\n{end}", text))
    return path


# -- the figure --------------------------------------------------------------------

# Colour by implementation (the first prefix that matches), marker by thread count, line by
# group: solid one-off, dash-dot host loop, dashed in place. Reports from before the groups
# existed give the line by floor instead. Anything else gets the next default colour.
COLOURS = (("kina loop fn()", "tab:pink"), ("kina loop", "tab:cyan"), ("kina fn()", "tab:purple"),
           ("kina call_into", "tab:brown"), ("kina", "tab:blue"), ("numpy", "tab:orange"), ("torch", "tab:green"), ("ort", "tab:red"))
MARKERS = {"1T": "o", "2T": "^"}
GROUP_LINES = {"one-off": "-", "host loop": "-.", "in place": "--"}
FLOOR_LINES = {"functional": "-", "in place": "--"}


def look(name: str, v: dict) -> tuple[str | None, str, str]:
    """(colour, marker, line style) of a variant's curve."""
    colour = next((c for prefix, c in COLOURS if name.startswith(prefix)), None)
    marker = MARKERS.get(name.rsplit(" ", 1)[-1], "s")
    line = GROUP_LINES[v["group"]] if "group" in v else FLOOR_LINES.get(v["floor"], ":")
    return colour, marker, line


def plot(report: dict, path: str | Path, defaults: dict) -> Path:
    """Each variant's median time per cache size, with the floors: one panel per HxDh.
    `defaults` (the CLI's) says whether the sizes were limited, for the title."""
    import plotting  # scripts/plotting.py; only --plot needs it (and matplotlib)
    shapes = list(dict.fromkeys((r["H"], r["Dh"]) for r in report["sizes"]))
    fig, axes = plotting.figure(640, ncols=len(shapes), layout="constrained", squeeze=False)
    for ax, (H, Dh) in zip(axes[0], shapes):
        rows = sorted((r for r in report["sizes"] if (r["H"], r["Dh"]) == (H, Dh)), key=lambda r: r["cache_bytes"])
        mib = [r["cache_bytes"] / MIB for r in rows]
        for name in dict.fromkeys(n for r in rows for n in r["variants"]):
            have = [(m, r["variants"][name]) for m, r in zip(mib, rows) if name in r["variants"]]
            colour, marker, line = look(name, have[0][1])
            ax.plot([m for m, _ in have], [v["median_s"] * 1e3 for _, v in have], line, marker=marker, ms=4,
                    lw=1.2, color=colour, label=name)
        floors = rows[0].get("floor_s_threads", {"1": rows[0]["floor_s"]})
        for i, n in enumerate(floors):  # one thread's floors thick, more threads' thinner
            for kind, style in FLOOR_LINES.items():
                ax.plot(mib, [r.get("floor_s_threads", {n: r["floor_s"]})[n][kind] * 1e3 for r in rows], style,
                        color="black", lw=3 if i == 0 else 1.5, alpha=0.3, label=f"floor, {kind}, {n}T")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(mib, [f"{m:g}\nS={r['S_past']}" for m, r in zip(mib, rows)])
        ax.set_xticks([], minor=True)  # the sizes measured, and no others
        plotting.plain_log_ticks(ax.yaxis)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"H={H} heads, Dh={Dh}")
        ax.set_xlabel("K+V cache attended, MiB (S = S_past)")
    axes[0][0].set_ylabel("time per step, ms (median, log scale)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=8)

    m, bw, args = report["machine"], report["bandwidth"]["Bps"], report["args"]
    subset = [f"--{k.replace('_', '-')} {args[k]}" for k in ("shapes", "s_past") if args.get(k) != defaults[k]]
    fig.suptitle(f"kv_step decode step (F32, B=1): median of {args['repeats']} samples per variant"
                 + (f" (sizes limited: {' '.join(subset)})" if subset else "")
                 + f"\n{m['cores']} cores, {m['cpu']}, shared with other work (noisy); NumPy on one thread, nT = n threads"
                 f"\nfloor = bytes the step moves at the best one-thread read {bw['read'] / 1e9:.1f} GB/s and "
                 f"copy {bw['copy'] / 1e9:.1f} GB/s seen; kina @ {report['versions']['commit']}", fontsize=10.5)
    return plotting.save(fig, path)
