"""Find and stop host processes that testbed started, by an argument only they carry.

A process testbed starts outside the namespaces (an exporter, Prometheus) gets one
argument that names its target or config file; that argument is written to the ledger
or state file *before* the process exists. So ``down`` finds it also when the pid was
never recorded (a crash between start and record) and never mistakes a reused pid for it.
"""

from __future__ import annotations

import os
import signal
import time


def argv_of(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def with_arg(arg: str) -> list[int]:
    """Pids of the processes one of whose arguments is exactly ``arg``."""
    me = os.getpid()
    out = []
    for e in os.scandir("/proc"):
        if e.name.isdigit() and int(e.name) != me and arg in argv_of(int(e.name)):
            out.append(int(e.name))
    return out


def terminate(pids: list[int], grace: float = 5.0) -> list[int]:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; returns the pids signalled."""
    sent = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            sent.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for pid in sent:
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _running(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return sent


def _running(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap our own child, if it is one
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
