"""`python -m kina ...` is `kinac ...`; `main` is the kinac console script and
`kina` the `kina` one (`kina generate|chat|serve MODEL ...`, kina.apps.cli).

The first statements take over Ctrl-C, before anything else is imported: a tiny
handler from builtins only, then `kina.driver.interrupts`, which undoes what is in
flight. From here on an interrupt is `kinac: interrupted` and exit status 130, never
a traceback. (Only the interpreter's own start, before this file runs, is not ours.)
Library code never imports this module, so `import kina` installs no handler.
"""
import _signal
import os
import sys

_KINA = os.path.basename(sys.argv[0]) == "kina" or sys.argv[0].endswith(os.path.join("apps", "__main__.py"))
_COMMAND = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in ("generate", "chat", "serve") else ""
_PROGRAM = f"kina {_COMMAND}".strip() if _KINA else "kinac"

def _interrupted(signum, frame):  # nothing to undo yet: only imports have run
    os.write(2, f"{_PROGRAM}: interrupted\n".encode())
    os._exit(130)


_signal.signal(_signal.SIGINT, _interrupted)

from .driver import interrupts  # noqa: E402  (after the handler, on purpose)

interrupts.install(_PROGRAM)


def main() -> int:
    from .driver.cli import main as kinac
    return kinac()


def kina() -> int:
    """`kina generate|chat|serve MODEL ...` (kina.apps.cli), Ctrl-C taken over as for kinac (`kina chat`
    then takes it back while a reply runs, to stop the reply rather than the session)."""
    interrupts.install(f"kina {_COMMAND}".strip())
    from .apps.cli import main as run
    return run()


if __name__ == "__main__":
    sys.exit(main())
