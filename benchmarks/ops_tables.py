"""docs/results/network.md's operational tables (soak, trace replay latency, exporter
scrape cost, cross-traffic), from benchmark results archived in
``docs/results/records/`` (``--record DIR`` of the benchmark, then ``benchmarks.archive``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

GENERATORS: dict[str, Callable[[Path], str]] = {}
"""This module's tables for ``benchmarks.regenerate``: name -> function(records folder) -> markdown."""
