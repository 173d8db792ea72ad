"""Signals during work that must not be cut in half: build, run, cleanup."""

from __future__ import annotations

import signal


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
