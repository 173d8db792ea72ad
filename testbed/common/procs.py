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

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> None:
    """Get ``sig`` when this process's parent ends (PR_SET_PDEATHSIG; not inherited by children)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


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


KILL_WAIT_S = 3.0
"""How long :func:`terminate` waits for processes to exit after SIGKILL."""


def terminate(pids: list[int], grace: float = 5.0, kill_wait: float = KILL_WAIT_S) -> list[int]:
    """SIGTERM (and SIGCONT: a stopped process must run to act on it), wait up to ``grace``
    seconds, SIGKILL what still runs, then wait up to ``kill_wait`` seconds for that to exit.
    Returns the pids signalled; :func:`stop` also fails naming any that still run."""
    return _terminate(pids, grace, kill_wait)[0]


def stop(pids: list[int], what: str, grace: float = 5.0, kill_wait: float = KILL_WAIT_S) -> list[int]:
    """:func:`terminate`, then a TestbedError naming (pid, command, state) every process that
    SIGKILL did not end within ``kill_wait`` (frozen by a cgroup freezer, stuck in the kernel):
    a caller never reports stopped what still runs. ``what`` names them: "node w0's QEMU".
    (One line, no hint: teardown gathers such errors into one message.)"""
    sent, left = _terminate(pids, grace, kill_wait)
    if left:
        raise TestbedError(f"{what} did not exit: {'; '.join(describe(p) for p in left)} still running "
                           f"{kill_wait:g} s after SIGKILL (frozen, or stuck in the kernel?)")
    return sent


def _terminate(pids: list[int], grace: float, kill_wait: float) -> tuple[list[int], list[int]]:
    """(pids signalled, those still running ``kill_wait`` s after SIGKILL). A pid is followed
    by its start time: one reused by a new process meanwhile does not count as running."""
    sent: list[int] = []
    started: dict[int, int] = {}
    for pid in pids:
        t = start_time(pid)
        try:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)  # a stopped process must run to act on SIGTERM
        except ProcessLookupError:
            continue
        sent.append(pid)
        if t is not None:
            started[pid] = t
    left = _wait_exit(started, grace)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return sent, list(_wait_exit(left, kill_wait))


def _wait_exit(pids: dict[int, int], timeout: float) -> dict[int, int]:
    """Wait up to ``timeout`` seconds for ``pids`` (pid: start time) to exit; those still running."""
    deadline = time.monotonic() + timeout
    left = {p: t for p, t in pids.items() if _same_running(p, t)}
    pause = 0.002  # most exit within milliseconds of SIGTERM: look again soon, then every 50 ms
    while left and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        left = {p: t for p, t in left.items() if _same_running(p, t)}
    return left


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def state(pid: int) -> str | None:
    """The process's state letter (R, S, D, T, t, Z, ...), None when it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else None


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks after boot): with the pid, its identity."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def _same_running(pid: int, started: int) -> bool:
    return running(pid) and start_time(pid) == started


def describe(pid: int) -> str:
    """``pid N (COMMAND ARGS...; state S)`` for messages: which process, and what it is."""
    cmd = " ".join(argv_of(pid)[:3])
    cmd = cmd if len(cmd) <= 120 else cmd[:117] + "..."
    cmd = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cmd)  # its own line, whatever its argv holds
    return f"pid {pid} ({cmd or '?'}; state {state(pid) or 'gone'})"


def running(pid: int) -> bool:
    """Alive and not a zombie. Our own children are not reaped here: their Popen keeps
    the exit status (a zombie already counts as stopped)."""
    return state(pid) not in (None, "Z")


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
