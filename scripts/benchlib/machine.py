"""Where a figure comes from: the CPU, its last-level cache, NumPy's OpenBLAS and the commit.

In: nothing (reads /proc, /sys, NumPy's bundled OpenBLAS and `git`).
Out: plain values; every function answers something ("unknown", a 32 MiB guess for the
LLC) rather than raise, so a report can always be written.
"""
from __future__ import annotations

import ctypes
import glob
import os
import platform
import subprocess
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def llc_bytes() -> int:
    """The last-level cache's size (32 MiB where /sys does not say)."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        return int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]]
    except (OSError, ValueError, KeyError):
        return 32 * MIB


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    """HEAD's short hash, or "unknown" outside a checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def describe() -> str:
    """'AMD EPYC ..., 2 cores, LLC 32 MiB; commit abc1234': one line for a benchmark's header."""
    return f"{cpu_model()}, {os.cpu_count()} cores, LLC {llc_bytes() / MIB:.0f} MiB; commit {git_commit()}"


def openblas() -> tuple[str, Callable[[int], None] | None]:
    """NumPy's OpenBLAS core name and a function that sets its thread count (or None)."""
    import numpy as np
    for lib_path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*.so*")):
        lib = ctypes.CDLL(lib_path)  # already loaded by numpy: this returns the same handle
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_corename{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.restype = ctypes.c_char_p
                put.argtypes = [ctypes.c_int]
                return get().decode(), put
    return "unknown", None
