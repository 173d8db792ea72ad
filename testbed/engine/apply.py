"""Apply a plan: every action recorded in the ledger before it runs; on failure, undo all.

Signals (SIGINT, SIGTERM, SIGHUP) only set a flag while building, checked between
actions; the failure path removes everything the ledger lists (:mod:`testbed.engine.teardown`)
with interrupts ignored, then re-raises.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Callable

from testbed.common.digits import ascii_int
from testbed.common.errors import TestbedError
from testbed.common.signals import Signals, ignore_interrupts
from testbed.engine.replay import start_background
from testbed.engine.teardown import teardown
from testbed.hosts.local import LocalHost
from testbed.monitor.sd import testbed_target
from testbed.plan.actions import ApplyContext, StartExporter
from testbed.plan.ledger import Ledger
from testbed.plan.plan import Plan

Progress = Callable[[int, int, str], None]
FAULT_ENV = "TESTBED_FAULT_STEP"  # test hook: SIGKILL ourselves before executing plan step N
FAULT_SIGNAL_ENV = "TESTBED_FAULT_SIGNAL"  # ... or SIGSTOP (a build stopped halfway, its locks held)
LEDGER_CHUNK = 64  # actions recorded per fsync; down treats recorded-but-never-made as already gone


def apply_plan(plan: Plan, ledger: Ledger, state: dict, progress: Progress | None = None,
               exporter: str | None = None, schedules: bool = True, ctx: ApplyContext | None = None) -> None:
    """Run the plan's actions (then start the exporter and the links' schedules), recording
    each ahead in ``ledger``.

    ``state`` is written with ``ready: True`` once the network is complete, and with the
    exporter's URL once it listens. On any failure or interrupt, everything recorded is
    removed and the error re-raised (an interrupt as a TestbedError saying so)."""
    name = plan.topology.name
    ctx = ctx or ApplyContext(name, LocalHost())
    fault = ascii_int(os.environ.get(FAULT_ENV, ""), 6)  # a test's hook; any other value: none
    fault = -1 if fault is None else fault
    ctx.fault_after_exporter = fault == len(plan.actions)
    total = len(plan.actions)
    recorded = 0
    try:
        with Signals() as signals:
            ctx.check = signals.check
            started = exporter_started(name, ledger, exporter, ctx)  # its start overlaps the build
            for i, action in enumerate(plan.actions):
                signals.check()
                if i >= recorded:  # write ahead in chunks: one fsync per LEDGER_CHUNK actions
                    recorded = min(total, i + LEDGER_CHUNK)
                    ledger.record(*(a.to_dict() for a in plan.actions[i:recorded]))
                if i == fault:
                    os.kill(os.getpid(), signal.SIGSTOP if os.environ.get(FAULT_SIGNAL_ENV) == "SIGSTOP"
                            else signal.SIGKILL)
                action.apply(ctx)
                if progress:
                    progress(i + 1, total, action.describe())
            state["ready"] = True
            ledger.write_state(state)
            if started is not None:
                signals.check()
                action, proc = started
                action.wait(proc, ctx)
                state["exporter"] = ctx.results["exporter"]
                ledger.write_state(state)
            for link in plan.topology.links:  # schedules: a background replay per link, from now on
                if schedules and link.schedule is not None:
                    signals.check()
                    start_background(name, None, link=link.name, locked=True)
    except BaseException as e:
        ctx.close()
        old = ignore_interrupts()
        try:
            problems = teardown(name)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        if isinstance(e, KeyboardInterrupt):
            raise TestbedError(f"interrupted while building '{name}'; everything created was removed"
                               + (f" except: {'; '.join(problems)}" if problems else "")) from None
        if problems and isinstance(e, TestbedError):
            e.message += f" (cleanup also failed: {'; '.join(problems)})"
        raise
    finally:
        ctx.close()
        ledger.close()


def exporter_started(name: str, ledger: Ledger, listen: str | None,
                     ctx: ApplyContext) -> tuple[StartExporter, subprocess.Popen] | None:
    """The link exporter (recorded, then started, not yet waited for) and its process; None
    when ``listen`` is None."""
    if listen is None:
        return None
    target = testbed_target(name)
    start = StartExporter(f"--sd-file={target}", str(target), listen, str(ledger.dir / "exporter.log"))
    ledger.record(start.to_dict())
    return start, start.spawn(ctx)
