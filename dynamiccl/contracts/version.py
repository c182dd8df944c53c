"""The package version: one definition (pyproject reads it through ``[tool.hatch.version]``; the CLI, the
collector's self-metrics and the records' producers report it)."""
from __future__ import annotations

__version__ = "0.1.0"
