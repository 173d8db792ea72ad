"""The kernel tests' two lanes under pytest-xdist (``--dist loadgroup``, the README's command).

Most kernel tests are one work unit that one worker runs in file order (the main lane: they
share the kernel, fixed names, users, module fixtures and the CPU-bound ones their timing).
The files in :data:`WAITING` are a second unit, which another worker runs beside it, tests
that share nothing with the main lane and mostly wait (Slurm's time limit and node checks,
Prometheus scrapes, a disk filling, a process that will not exit: about a third of a CPU
each, ``benchmarks/suite_cpu.py``). What they share with nobody:

* testbed names, users and ports of their own (free ports are asked of the kernel;
  ``tests/unit/test_lanes.py`` checks the names);
* on the host's namespace only the Slurm lab's bridge, veths and namespaces
  (:func:`waiting_host_name`); every other namespace they make is a testbed's, tagged with
  their own state directory;
* processes counted by a marker the main lane's also carry (an iperf3 flow's ``--logfile=``,
  a replay's ``--replay-id=``, a rank's ``workloads.train``) are counted through
  ``tests.helpers.started_here``: only what this worker started (testbed passes its
  environment on; a user's run under ``env -i`` names no worker).

Tests that measure goodput near a CPU's limit (the self-test's 1 Gbit/s, fidelity) or time
(dilation, the netem tests inside a TCG guest) stay in the main lane, as do the sshd lab's
tests (one bridge for the lab) and the VM fault tests: beside the main lane's VM tests a
hung-guest run ended before training, its guests too slow for the test's 10 s silence (at
4d10402, when that test still waited for training; not tried since it faults at the rank's start).
"""

from __future__ import annotations

import re

MAIN = "tests/kernel"
WAITING_UNIT = "tests/kernel:waiting"
WAITING = frozenset({"test_slurm.py", "test_monitor.py", "test_monitor_faults.py", "test_full_disk.py",
                     "test_stragglers.py", "test_tunnel.py", "test_cross_traffic.py", "test_replay.py",
                     "test_processes.py", "test_shared_machine.py", "test_graph.py", "test_slurm_sweep.py"})

# the Slurm lab (tests/kernel/slurm_lab.py): its bridge, its nodes' host-side veths, its nodes
_SLURM_LAB = re.compile(r"tbsl0|tbs\d+|tbslurm\d+")


def unit(nodeid: str) -> str | None:
    """The kernel lane (xdist work unit) of a test id, or None for a test outside tests/kernel."""
    if not nodeid.startswith("tests/kernel/"):
        return None
    return WAITING_UNIT if nodeid.split("::")[0].rsplit("/", 1)[-1] in WAITING else MAIN


def waiting_host_name(name: str) -> bool:
    """Whether a link or namespace in the host's view belongs to the waiting lane's Slurm lab."""
    return _SLURM_LAB.fullmatch(name) is not None

