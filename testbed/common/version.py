"""The package version (one place; pyproject and `testbed --version` agree with it)."""

__version__ = "0.1.0"
