"""Marks from the folder a test lives in, so that ``-m "not kernel and not slow"`` never
reaches a test that needs root, whatever marks its file remembered to set:
tests/kernel/** gets ``kernel``, tests/workloads/** gets ``workloads``. Marks set in the
files (``slow``, ``kernel``, skips) are kept.

Under pytest-xdist with ``--dist loadgroup`` (the README's full-suite command) the kernel
tests are two work units, two lanes (tests/lanes.py): one worker runs the main lane, one
test after another in file order, as a plain run would (they share the kernel, fixed testbed
names, users they make, module fixtures), while another runs the waiting lane beside it
(tests that share nothing with the main lane, most of them waiting), then the unit and
workload tests. A worker running those at the same time as kernel tests lowers its priority (nice
19, its children inherit it): the kernel tests, the longest part, and their goodput, timing
and QEMU guests get the CPU first, the others what is left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import lanes

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers set COLUMNS=80, which the CLI obeys (testbed.cli.render): its
    # tables would wrap where a plain pytest run, whose output is a pipe, prints them whole
    os.environ.pop("COLUMNS", None)

_HERE = Path(__file__).resolve().parent
_BY_FOLDER = {"kernel": pytest.mark.kernel, "workloads": pytest.mark.workloads}


_NICE_BESIDE_KERNEL = 19
_kernel_in_session = False


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            folder = Path(str(item.path)).resolve().relative_to(_HERE).parts[0]
        except ValueError:  # not under tests/
            continue
        mark = _BY_FOLDER.get(folder)
        if mark is not None and item.get_closest_marker(mark.name) is None:
            item.add_marker(mark)


def pytest_collection_finish(session):
    """Whether the session runs kernel tests: those left after ``-m`` and ``-k``."""
    global _kernel_in_session
    _kernel_in_session = any(item.get_closest_marker("kernel") is not None for item in session.items)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which a venv may lack
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: the tests under tests/kernel are two work units (tests/lanes.py),
    each sent whole to one worker (the largest units go first, one to each worker), the
    others are shared out one by one. Done here
    rather than with ``xdist_group`` marks: pytest-xdist 3.8 groups by a suffix it writes to
    ``item._nodeid``, which pytest 9.2 no longer reads, so the marks group nothing (measured:
    a file's kernel tests ran on both workers)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class KernelTestsOnOneWorker(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lanes.unit(nodeid) or super()._split_scope(nodeid)

    return KernelTestsOnOneWorker(config, log)


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start anything
def pytest_runtest_setup(item):
    """On an xdist worker, as root, in a session with kernel tests: nice 19 for any other
    test (another worker may be running the kernel tests now), back to 0 for a kernel test."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and _kernel_in_session and os.geteuid() == 0):
        return
    want = 0 if item.get_closest_marker("kernel") is not None else _NICE_BESIDE_KERNEL
    if os.getpriority(os.PRIO_PROCESS, 0) != want:
        os.setpriority(os.PRIO_PROCESS, 0, want)
