"""Marks from the folder a test lives in, so that ``-m "not kernel and not slow"`` never
reaches a test that needs root, whatever marks its file remembered to set:
tests/kernel/** gets ``kernel``, tests/workloads/** gets ``workloads``. Marks set in the
files (``slow``, ``kernel``, skips) are kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers set COLUMNS=80, which the CLI obeys (testbed.cli.render): its
    # tables would wrap where a plain pytest run, whose output is a pipe, prints them whole
    os.environ.pop("COLUMNS", None)

_HERE = Path(__file__).resolve().parent
_BY_FOLDER = {"kernel": pytest.mark.kernel, "workloads": pytest.mark.workloads}


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            folder = Path(str(item.path)).resolve().relative_to(_HERE).parts[0]
        except ValueError:  # not under tests/
            continue
        mark = _BY_FOLDER.get(folder)
        if mark is not None and item.get_closest_marker(mark.name) is None:
            item.add_marker(mark)
