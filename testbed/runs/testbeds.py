"""The testbed a run runs on, and the run's hold on it.

    obtain_testbed   attach to a running testbed (left up afterwards), or bring one up from a
                     topology file (the run takes it down again)
    run_lock         one run at a time per testbed (an flock: a run that died holds nothing)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.engine.core import Testbed, list_testbeds
from testbed.model.topology import SHIPPED_DIR, load_topology
from testbed.plan.ledger import Ledger

DEFAULT_TOPOLOGY = SHIPPED_DIR / "three_switch.yaml"


def obtain_testbed(name: str | None, topology: Path | None, say: Callable[[str], None],
                   exporter: bool = True) -> tuple[Testbed, bool]:
    """The running testbed ``name``, or a new one from ``topology``; True when made here."""
    if name:
        return Testbed.attach(name), False
    topo = load_topology(topology or DEFAULT_TOPOLOGY)
    if any(t["name"] == topo.name for t in list_testbeds()):
        raise TestbedError(f"a testbed named '{topo.name}' is already up",
                           f"use it with --testbed {topo.name}, or take it down first")
    say(f"bringing up {topo.name} ({len(topo.workers)} workers)")
    return Testbed.up(topo, exporter="127.0.0.1:0" if exporter else None), True


def run_lock(tb: Testbed):
    """One run at a time per testbed: two would share the rendezvous port and each other's
    counters (testbed.common.locks: a killed run holds nothing)."""
    from testbed.common.locks import hold_now

    return hold_now(Ledger(tb.name).dir / "run.lock", lambda pid: TestbedError(
        f"testbed '{tb.name}' is busy with another run (pid {pid})", "wait for it to finish, or use another testbed"))
