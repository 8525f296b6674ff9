"""`python -m kina ...` is `kinac ...`; `main` is the kinac console script and
`generate` the `kina` one (`kina generate MODEL_DIR ...`).

The first statements take over Ctrl-C, before anything else is imported: a tiny
handler from builtins only, then `kina.driver.interrupts`, which undoes what is in
flight. From here on an interrupt is `kinac: interrupted` and exit status 130, never
a traceback. (Only the interpreter's own start, before this file runs, is not ours.)
Library code never imports this module, so `import kina` installs no handler.
"""
import _signal
import os
import sys

_PROGRAM = "kina generate" if os.path.basename(sys.argv[0]) == "kina" else "kinac"


def _interrupted(signum, frame):  # nothing to undo yet: only imports have run
    os.write(2, f"{_PROGRAM}: interrupted\n".encode())
    os._exit(130)


_signal.signal(_signal.SIGINT, _interrupted)

from .driver import interrupts  # noqa: E402  (after the handler, on purpose)

interrupts.install(_PROGRAM)


def main() -> int:
    from .driver.cli import main as kinac
    return kinac()


def generate() -> int:
    """`kina generate MODEL_DIR ...` (kina.models.generate), Ctrl-C taken over as for kinac."""
    interrupts.install("kina generate")
    from .models.generate import main as kina
    return kina()


if __name__ == "__main__":
    sys.exit(main())
