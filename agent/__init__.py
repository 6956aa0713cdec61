"""The Proof node agent. Imports no Django (tests/test_import_boundary.py)."""

__version__ = "0.1.0"
