"""The distribution's version (pyproject.toml says the same: tests/test_structure.py)."""

__version__ = "0.1.0"
