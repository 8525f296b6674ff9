"""`python -m kina ...` is `kinac ...`, and `main` is the kinac console script.

The first statements take over Ctrl-C, before anything else is imported: a tiny
handler from builtins only, then `kina.driver.interrupts`, which undoes what is in
flight. From here on an interrupt is `kinac: interrupted` and exit status 130, never
a traceback. (Only the interpreter's own start, before this file runs, is not ours.)
Library code never imports this module, so `import kina` installs no handler.
"""
import _signal
import os


def _interrupted(signum, frame):  # nothing to undo yet: only imports have run
    os.write(2, b"kinac: interrupted\n")
    os._exit(130)


_signal.signal(_signal.SIGINT, _interrupted)

from .driver import interrupts  # noqa: E402  (after the handler, on purpose)

interrupts.install()


def main() -> int:
    from .driver.cli import main as kinac
    return kinac()


if __name__ == "__main__":
    import sys
    sys.exit(main())
