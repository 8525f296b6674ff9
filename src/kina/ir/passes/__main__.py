"""`python -m kina.ir.passes` prints the pass table as markdown, as docs/compiler.md holds it."""
from . import markdown

print(markdown(), end="")
