"""The package version, in a module of its own so code that prints it never imports the package's `__init__` (which
would bring in the Python API)."""

__version__ = "0.1.0"
