"""`python -m kina ...` is `kinac ...`: the same arguments, output and exit status."""
import sys

from .cli import main

sys.exit(main())
