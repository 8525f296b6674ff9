"""What the benchmark scripts' `--plot FILE.png` pictures share: matplotlib, the machine, the file.

    from plotting import check_target, figure, machine, plain_log_ticks, save

`check_target(path)` runs when the arguments are parsed, before any measuring, so a
missing matplotlib (the [bench] extra) or a format it cannot write is a one-line error
rather than a traceback at the end of a long run. `figure(...)` gives a matplotlib
figure on the non-interactive Agg backend (no display needed), sized to be read at
900 px wide; `save(fig, path)` writes it, creating the parent directory.
"""
from __future__ import annotations

import os
from pathlib import Path

from benchlib.machine import cpu_model

WIDTH_PX = 900
DPI = 100  # figure inches * DPI = pixels, so text sizes in points stay readable at WIDTH_PX


def pyplot():
    """matplotlib.pyplot on the Agg backend, or SystemExit saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("error: --plot needs matplotlib, which is in the [bench] extra: "
                         "pip install -e '.[bench]'") from None
    matplotlib.use("Agg")  # files only: never open a window, never need a display
    import matplotlib.pyplot as plt
    return plt


def check_target(path: str) -> Path:
    """The plot's path, once matplotlib is known to be there and able to write its format."""
    plt = pyplot()
    suffix = Path(path).suffix.lstrip(".").lower()
    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if suffix not in formats:
        raise SystemExit(f"error: --plot: expected a file name ending in one of "
                         f"{', '.join('.' + f for f in sorted(formats))} (e.g. .png), got {path!r}")
    return Path(path)


def machine() -> str:
    """'2 cores, AMD EPYC': what a title needs to say where the numbers come from."""
    return f"{os.cpu_count()} cores, {cpu_model()}"


def figure(height_px: int = 540, ncols: int = 1, **kwargs):
    """A WIDTH_PX-wide figure and its axes (one per column), fonts sized for that width."""
    plt = pyplot()
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 10, "legend.fontsize": 9})
    return plt.subplots(1, ncols, figsize=(WIDTH_PX / DPI, height_px / DPI), dpi=DPI, **kwargs)


def plain_log_ticks(axis, minor=(2, 5)) -> None:
    """Label a log axis 0.1, 0.2, 0.5, 1, 2 ... rather than 10^-1, 10^0: read at a glance."""
    from matplotlib.ticker import FuncFormatter, LogLocator
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(plain)
    axis.set_minor_locator(LogLocator(base=10, subs=minor))
    axis.set_minor_formatter(plain)


def save(fig, path: str | Path) -> Path:
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
