"""The CPU a .so was built for, and the one it runs on.

In:  /proc/cpuinfo, and a target CPU name as `kinac --cpu` takes it.
Out: `cpu_flags()`, this CPU's ISA extensions; `target_flags(cpu)`, those a build for
     `cpu` may use (stamped into the sidecar, checked by `runtime.load`).

Guarantees: a leaf (imports nothing from kina); reading /proc/cpuinfo never raises.
"""
from __future__ import annotations

from pathlib import Path


def cpu_flags() -> list[str]:
    """The ISA extensions this CPU has (from /proc/cpuinfo), to stamp into a sidecar."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(f for f in line.split(":", 1)[1].split() if f in ISA_FLAGS)
    except OSError:
        pass
    return []


# The x86 extensions a build may use, by their /proc/cpuinfo names: a .so needs all
# that its target has. For -mcpu=native that is this CPU's set; the x86-64
# micro-architecture levels have documented sets. Other CPU names are refused,
# because their sets could not be checked when a .so is loaded.
ISA_FLAGS = {"ssse3", "sse4_1", "sse4_2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm",
             "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_bf16", "avx512_fp16",
             "avx512vnni", "avx_vnni", "amx_tile"}
_V2 = {"ssse3", "sse4_1", "sse4_2", "popcnt"}
_V3 = _V2 | {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"}
CPU_LEVELS = {"x86-64": set(), "x86-64-v2": _V2, "x86-64-v3": _V3,
              "x86-64-v4": _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}}


def target_flags(cpu: str) -> list[str]:
    """The ISA extensions code built with `-mcpu=cpu` may use (see CPU_LEVELS)."""
    return cpu_flags() if cpu == "native" else sorted(CPU_LEVELS[cpu])
