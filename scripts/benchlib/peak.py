"""Peak memory of one engine on one model, each measured in a fresh process.

    python -m benchlib.peak ENGINE PATH PROMPT N_NEW THREADS    (ENGINE one of ENGINES; PROMPT "1,2,3")

In:  an engine name, a model (a GGUF file or a folder), the prompt's ids, the tokens to
     generate and the threads; measure() runs the child from the benchmark's process.
Out: measure() -> {"peak_bytes": the child's VmHWM (its resident high-water mark) after it
     loaded the model and generated, "baseline_bytes": its VmRSS after the imports, before the
     load, "anon_bytes" and "file_bytes": its resident anonymous and file-backed pages at the end
     (RssAnon, RssFile: shared libraries and mapped weights are file-backed), "tokens": what it
     generated, "seconds": the child's wall time}.

Guarantees: the child imports only NumPy, this package's engines module and the engine's own
library (no torch, no transformers: the imports the benchmark's process holds never count), loads
the model exactly as the timed engine does (benchlib.engines) and generates greedily without
keeping the logits. A benchmark's own process cannot measure this: it holds every engine at
once. Resident memory counts the pages of a memory-mapped file the engine touched, so an engine
that maps its weights (Kina) and one that copies them (llama.cpp, use_mmap=False) both count them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ENGINES = ("Kina", "Kina exact", "llama.cpp")


def status_bytes(field: str) -> int:
    """A `VmHWM`-style field of /proc/self/status, in bytes (0 where /proc has none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child(engine: str, path: str, prompt: list[int], n_new: int, threads: int) -> dict:
    from . import engines
    t = time.perf_counter()
    baseline = status_bytes("VmRSS")
    n_ctx = len(prompt) + n_new
    if engine == "llama.cpp":
        e = engines.LlamaCppEngine(Path(path), n_ctx)
    else:
        e = engines.KinaEngine(Path(path), None, n_ctx, fma=engine != "Kina exact")
    tokens = e.generate(prompt, n_new, threads)
    peak = status_bytes("VmHWM")
    if not peak:  # no /proc: the kernel's own maximum (KiB on Linux)
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_bytes": peak, "baseline_bytes": baseline, "anon_bytes": status_bytes("RssAnon"),
            "file_bytes": status_bytes("RssFile"), "tokens": tokens, "seconds": time.perf_counter() - t}


def measure(engine: str, path: Path, prompt: list[int], n_new: int, threads: int, timeout: float = 900) -> dict:
    """Run the child (see the module docstring) and return what it reports."""
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    scripts = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([scripts, *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, "-m", "benchlib.peak", engine, str(path), ",".join(map(str, prompt)), str(n_new), str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the peak-memory child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}\n"
                           f"to repeat it: PYTHONPATH={env['PYTHONPATH']} {' '.join(cmd)}")
    return json.loads(lines[-1])


def main(argv: list[str]) -> int:
    engine, path, prompt, n_new, threads = argv
    print(json.dumps(child(engine, path, [int(x) for x in prompt.split(",")], int(n_new), int(threads))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
