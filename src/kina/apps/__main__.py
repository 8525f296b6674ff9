"""`python -m kina.apps generate|chat|serve ...` is the `kina` command (kina.__main__.kina)."""
import sys

from kina.__main__ import kina

sys.exit(kina())
