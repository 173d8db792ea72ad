"""A VM worker's QEMU process on the host: found again by its marker, judged stopped or gone.

QEMU runs with ``-name testbed-vm:NETNS`` (:func:`marker`): that argument is how the
process is found again, and only it. Kept apart from the relay and the backend, which
both ask it (:mod:`testbed.nodes.vm.relay` when a guest goes silent, :mod:`testbed.nodes.vm.proc`
when a guest does not answer after boot or a rank died); with them, how long a silent
guest is given (:func:`hang_timeout`). Imports nothing of the backend: the relay, started
as ``python -m testbed.nodes.vm.relay``, must not import itself through ``testbed.nodes``.
"""

from __future__ import annotations

import os
from pathlib import Path

from testbed.common import procs
from testbed.common.errors import TestbedError
from testbed.nodes.vm.accel import QEMU

HANG_ENV, HANG_DEFAULT_S = "TESTBED_VM_HANG_TIMEOUT", 60.0

STOPPED = {"T": "stopped (state T: SIGSTOP?)", "t": "stopped by a debugger (state t)"}


def marker(ns: str) -> str:
    """QEMU's ``-name`` argument: how a VM's process is found again (and only that one)."""
    return f"testbed-vm:{ns}"


def qemu_pids(ns: str) -> list[int]:
    return [p for p in procs.with_arg(marker(ns)) if Path(next(iter(procs.argv_of(p)), "")).name == QEMU]


def hang_timeout() -> float:
    """Seconds without a word from a guest's agent, while a command runs there, after which
    the guest is taken for hung (``TESTBED_VM_HANG_TIMEOUT``; 0: never)."""
    raw = os.environ.get(HANG_ENV, "")
    try:
        value = float(raw) if raw.strip() else HANG_DEFAULT_S
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise TestbedError(f"{HANG_ENV}={raw!r} is not a number of seconds",
                           f"e.g. {HANG_ENV}=120, or 0 never to take a silent guest for hung")
    return value


def node_of(ns: str) -> str:
    """The node a VM worker's namespace belongs to (``NAME.NODE``)."""
    return ns.split(".", 1)[1] if "." in ns else ns


def qemu_trouble(ns: str) -> str | None:
    """Why the VM of ``ns`` cannot answer, when the host can tell: its QEMU exited or is
    stopped. None when QEMU is there and running."""
    pids = qemu_pids(ns)
    if not pids:
        return "its QEMU exited"
    for pid in pids:
        st = procs.state(pid)
        if st in STOPPED:
            return f"its QEMU (pid {pid}) is {STOPPED[st]}"
    return None
