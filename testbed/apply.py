"""Apply a plan: every action recorded in the ledger before it runs; on failure, undo all.

Signals (SIGINT, SIGTERM, SIGHUP) only set a flag while building, checked between
actions; the failure path removes everything the ledger lists (:mod:`testbed.teardown`)
with interrupts ignored, then re-raises.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

from .actions import ApplyContext, StartExporter
from .errors import TestbedError
from .ledger import Ledger
from .plan import Plan

Progress = Callable[[int, int, str], None]
FAULT_ENV = "TESTBED_FAULT_STEP"  # test hook: SIGKILL ourselves before executing plan step N
LEDGER_CHUNK = 64  # actions recorded per fsync; down treats recorded-but-never-made as already gone


class Signals:
    """While building: SIGINT, SIGTERM and SIGHUP only set a flag, checked between actions.

    Raising KeyboardInterrupt asynchronously could land inside a pyroute2 call and leave
    its event loop half-run (a noisy "Event loop is closed" at exit); an action takes a few
    milliseconds, so checking between actions is just as prompt.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self.received: int | None = None
        self._old = {}
        for sig in self.SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._note)
            except ValueError:  # not the main thread: signals cannot be caught here anyway
                pass
        return self

    def _note(self, signum, frame):
        self.received = signum

    def check(self) -> None:
        if self.received is not None:
            raise KeyboardInterrupt(f"signal {self.received}")

    def __exit__(self, *exc):
        for sig, h in self._old.items():
            signal.signal(sig, h)


def interrupt_on(signals=(signal.SIGTERM, signal.SIGHUP)) -> dict:
    """Make ``signals`` raise KeyboardInterrupt (so they unwind through the same cleanup as
    Ctrl-C); returns the previous handlers. Off the main thread nothing changes."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        return {s: signal.signal(s, interrupt) for s in signals}
    except ValueError:
        return {}


def ignore_interrupts(signals=(signal.SIGINT, signal.SIGTERM)) -> dict:
    """Ignore ``signals`` (for a cleanup that must finish); returns the previous handlers.
    Off the main thread signals cannot be set, and nothing changes."""
    try:
        return {s: signal.signal(s, signal.SIG_IGN) for s in signals}
    except ValueError:
        return {}


def apply_plan(plan: Plan, ledger: Ledger, state: dict, progress: Progress | None = None,
               exporter: str | None = None, schedules: bool = True, ctx: ApplyContext | None = None) -> None:
    """Run the plan's actions (then start the exporter and the links' schedules), recording
    each ahead in ``ledger``.

    ``state`` is written with ``ready: True`` once the network is complete, and with the
    exporter's URL once it listens. On any failure or interrupt, everything recorded is
    removed and the error re-raised (an interrupt as a TestbedError saying so)."""
    from .teardown import teardown

    name = plan.topology.name
    ctx = ctx or ApplyContext(name)
    fault = int(os.environ.get(FAULT_ENV, "-1"))
    ctx.fault_after_exporter = fault == len(plan.actions)
    total = len(plan.actions)
    recorded = 0
    try:
        with Signals() as signals:
            ctx.check = signals.check
            for i, action in enumerate(plan.actions):
                signals.check()
                if i >= recorded:  # write ahead in chunks: one fsync per LEDGER_CHUNK actions
                    recorded = min(total, i + LEDGER_CHUNK)
                    ledger.record(*(a.to_dict() for a in plan.actions[i:recorded]))
                if i == fault:
                    os.kill(os.getpid(), signal.SIGKILL)
                action.apply(ctx)
                if progress:
                    progress(i + 1, total, action.describe())
            state["ready"] = True
            ledger.write_state(state)
            if exporter is not None:
                signals.check()
                from .sd import testbed_target

                target = testbed_target(name)
                start = StartExporter(f"--sd-file={target}", str(target), exporter, str(ledger.dir / "exporter.log"))
                ledger.record(start.to_dict())
                start.apply(ctx)
                state["exporter"] = ctx.results["exporter"]
                ledger.write_state(state)
            for link in plan.topology.links:  # schedules: a background replay per link, from now on
                if schedules and link.schedule is not None:
                    signals.check()
                    from .replay import start_background

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
