"""procs.terminate / procs.stop: SIGTERM, SIGKILL after the grace, then a bounded wait for
the processes to be gone; stop names those SIGKILL did not end. Real child processes;
only the "SIGKILL does nothing" case is simulated (a frozen process needs a cgroup and
root: tests/kernel/test_vm_faults.py makes one for real)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from testbed.common import procs
from testbed.common.errors import TestbedError

IGNORES_TERM = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def _child(code: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"  # its handler is in place
    return p


def test_terminate_returns_the_pids_signalled_once_they_are_gone():
    p = _child("import time; print('ready', flush=True); time.sleep(60)")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        assert procs.terminate([p.pid, gone.pid], grace=5.0) == [p.pid]  # a reaped pid: not signalled
        assert not procs.running(p.pid)  # a zombie (our child, not reaped here) counts as gone
        assert p.wait(1) == -signal.SIGTERM
    finally:
        p.kill()


def test_a_process_ignoring_sigterm_is_killed_and_waited_for():
    p = _child(IGNORES_TERM)
    t0 = time.monotonic()
    try:
        assert procs.terminate([p.pid], grace=0.3) == [p.pid]
        assert not procs.running(p.pid), "returned before the process had exited"
        assert time.monotonic() - t0 < 4.5  # the 0.3 s grace, not the default 5 s, nor the child's 60 s
        assert p.wait(1) == -signal.SIGKILL
    finally:
        p.kill()


def test_a_stopped_process_is_continued_to_act_on_sigterm():
    p = _child("import time; print('ready', flush=True); time.sleep(60)")
    os.kill(p.pid, signal.SIGSTOP)
    try:
        procs.terminate([p.pid], grace=5.0)
        assert p.wait(1) == -signal.SIGTERM
    finally:
        p.kill()


def test_a_process_sigkill_does_not_end_is_named_after_a_bounded_wait(monkeypatch):
    p = _child(IGNORES_TERM)
    real_kill = os.kill

    def kill(pid, sig):  # as for a frozen process: SIGKILL stays pending
        if not (pid == p.pid and sig == signal.SIGKILL):
            real_kill(pid, sig)

    monkeypatch.setattr(procs.os, "kill", kill)
    t0 = time.monotonic()
    try:
        assert procs.terminate([p.pid], grace=0.2, kill_wait=0.3) == [p.pid]  # tolerant, as before
        with pytest.raises(TestbedError) as e:
            procs.stop([p.pid], "the test child", grace=0.2, kill_wait=0.3)
        took = time.monotonic() - t0
    finally:
        monkeypatch.undo()
        p.kill()
        p.wait()
    msg = e.value.message
    assert msg.startswith("the test child did not exit: ") and f"pid {p.pid} ({sys.executable} -c " in msg, msg
    assert "still running 0.3 s after SIGKILL" in msg and "state S" in msg and "\n" not in msg, msg
    assert took < 6, took  # twice 0.2 + 0.3 s: not the default grace (5 s) nor kill wait (3 s)


def test_a_pid_reused_by_another_process_counts_as_exited(monkeypatch):
    """While waiting, a pid is followed with its start time: a new process under the same
    pid is not the one signalled."""
    p = _child(IGNORES_TERM)
    started = procs.start_time(p.pid)
    assert started is not None
    calls = {"n": 0}
    real = procs.start_time

    def start_time(pid):
        calls["n"] += 1
        return real(pid) if calls["n"] == 1 else started + 1  # after the signal: "another process"

    monkeypatch.setattr(procs, "start_time", start_time)
    try:
        t0 = time.monotonic()
        assert procs.stop([p.pid], "x", grace=5.0, kill_wait=5.0) == [p.pid]
        assert time.monotonic() - t0 < 4, "waited for a process that was no longer the one signalled"
    finally:
        monkeypatch.undo()
        p.kill()
        p.wait()


def test_describe_and_state_of_a_process_that_is_gone():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert procs.state(p.pid) is None and procs.start_time(p.pid) is None and not procs.running(p.pid)
    assert procs.describe(p.pid) == f"pid {p.pid} (?; state gone)"
    assert procs.state(os.getpid()) == "R" and procs.describe(os.getpid()).startswith(f"pid {os.getpid()} (")
