"""docs/results/training.md's benchmark tables (where a ternary exchange's time goes,
scheme costs), from benchmark results archived in
``docs/results/records/`` (``--record DIR`` of the benchmark, then ``benchmarks.archive``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

GENERATORS: dict[str, Callable[[Path], str]] = {}
"""This module's tables for ``benchmarks.regenerate``: name -> function(records folder) -> markdown."""
