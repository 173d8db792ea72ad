"""Signals during a run: SIGTERM and SIGHUP unwind like Ctrl-C, and the cleanup, once it has
begun, is not interrupted by a second one."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from testbed.common.errors import TestbedError
from testbed.common.signals import ignore_interrupts as _ignore, interrupt_on


class RunInterrupted(TestbedError):
    pass


def install_signals() -> Callable[[], None]:
    """SIGTERM (and SIGHUP) behave like Ctrl-C: unwind through the cleanup. Returns what
    puts every handler back (SIGINT's too, which the cleanup ignores)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {signal.SIGINT: signal.getsignal(signal.SIGINT), **interrupt_on()}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)
    return restore


def ignore_interrupts() -> None:
    """From here on Ctrl-C, SIGTERM and SIGHUP are ignored (until install_signals' undo)."""
    _ignore((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
