"""Kina's version, in a leaf module: the package face (`kina.__version__`), the driver's
sidecars and the compile cache's key all read it from here, so none imports another for it.

Guarantees: imports nothing (from `kina` or anywhere else)."""
__version__ = "0.1.0"
