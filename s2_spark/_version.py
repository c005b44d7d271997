"""The package's version, in one place: pyproject.toml reads it for the distribution's
metadata, `s2_spark.__version__` re-exports it, and CHANGELOG.md has its section."""

__version__ = "0.2.0"
