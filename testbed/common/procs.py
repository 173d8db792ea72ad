"""Find and stop host processes that testbed started, by an argument only they carry.

A process testbed starts outside the namespaces (an exporter, Prometheus) gets one
argument that names its target or config file; that argument is written to the ledger
or state file *before* the process exists. So ``down`` finds it also when the pid was
never recorded (a crash between start and record) and never mistakes a reused pid for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from testbed.common.errors import TestbedError



def python_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """``python -m MODULE ARGS`` for a child started as root: the directory it is started
    from never lands on its import path (``-P``; Python 3.10 drops sys.path[0] by hand), so
    a ``collectors/`` or ``workloads/`` folder there cannot run in its place."""
    exe = python or sys.executable
    if python is not None or sys.version_info >= (3, 11):
        return [exe, "-P", "-m", module, *args]
    return [exe, "-c", "import runpy, sys; del sys.path[0]; sys.argv[0] = %r; "
            "runpy.run_module(%r, run_name='__main__', alter_sys=True)" % (module, module), *args]


def argv_of(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


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
            os.kill(pid, signal.SIGCONT)  # a stopped process must run to act on SIGTERM
            sent.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for pid in sent:
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if running(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return sent


def running(pid: int) -> bool:
    """Alive and not a zombie. Our own children are not reaped here: their Popen keeps
    the exit status (a zombie already counts as stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def run_tool(argv: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    """Run a tool (no shell); a TestbedError with the tail of its output if it fails."""
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip()[-1500:]
        raise TestbedError(f"{what} failed (exit {r.returncode}): {tail}",
                           "see the message above; `testbed doctor` checks the tools")
    return r


def wait_forwarding(child: int, signals) -> int:
    """Wait for ``child`` (a pid this process forked), passing on each of ``signals`` that
    reaches this process meanwhile; returns its wait status."""
    def forward(signum, frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in signals:
        signal.signal(sig, forward)
    while True:
        try:
            return os.waitpid(child, 0)[1]
        except InterruptedError:
            continue
