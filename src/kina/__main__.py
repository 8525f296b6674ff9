"""`python -m kina ...` is `kinac ...`: the same arguments, output and exit status."""
import sys

from .driver.cli import main

sys.exit(main())
