"""testbed's locks, one design: an exclusive ``flock`` on a file in the state directory,
opened by :func:`open_lock` only (close-on-exec, never through a link) and taken by
:func:`held` (waiting) or :func:`hold_now` (not waiting), released when the block ends or
the holder dies, so a killed command holds nothing.

    the global lock    <state dir>/.lock         up and a host agent's share while they check
                                                 and reserve a name (its ledger made), down --all
    a testbed's lock   <state dir>/NAME/.lock    its build (taken before the global lock is
                                                 let go), down, links, ledger and state copies,
                                                 trace steps
    a testbed's runs   <state dir>/NAME/run.lock one run at a time (it names its pid)

Always in that order (a testbed's lock is never held while waiting for the global one), so
no two commands wait on each other; and the global lock is held only for what concerns every
testbed, never for a build: a second testbed comes up while a VM testbed boots.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from testbed.common.errors import StateError, TestbedError


def open_lock(path: Path) -> int:
    """The lock file's descriptor (made 0600), never through a link, not inherited."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


@contextlib.contextmanager
def held(fd: int, timeout: float, busy: str) -> Iterator[None]:
    """An exclusive flock on ``fd`` within ``timeout`` seconds (a StateError saying ``busy``
    otherwise); the descriptor is closed, which releases it, when the block ends."""
    start = time.monotonic()
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited > timeout:
                    raise StateError(busy, "wait for it to finish") from None
                time.sleep(0.005 if waited < 0.5 else 0.05)  # a trace step's holder is done in ms
        yield
    finally:
        os.close(fd)  # closing releases the flock


@contextlib.contextmanager
def hold_now(path: Path, busy: Callable[[str], TestbedError]) -> Iterator[None]:
    """``path``'s lock at once, or ``busy(holder's pid)`` raised; the holder writes its pid
    into the file for the next one's message."""
    fd = open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy(os.pread(fd, 32, 0).decode(errors="replace").strip() or "?") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
