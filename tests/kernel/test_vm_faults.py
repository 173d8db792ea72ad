"""VM workers under real faults: a guest that hangs during a run, a guest agent that never
answers during ``up``, a QEMU killed during ``up``, and a QEMU that cannot exit at ``down``.

Every fault is made for real on real QEMU processes: SIGSTOP (the guest stops dead, its
agent with it), SIGKILL, and the cgroup-v1 freezer (a frozen process cannot act on any
signal, SIGKILL included, until it is thawed). Every case ends with nothing left behind
(``clean_kernel``: no namespace, link, qdisc, process naming the state directory, ledger).
Guests run under TCG here (slow): the training is tiny and the timeouts short.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import FREEZER, Frozen, finish, has_freezer, running as _running
from tests.kernel.conftest import cli, cli_json, run
from tests.kernel.test_vm import _qemus, _vm_dumbbell, _wait_for_rank_in_guest, _write, guest  # noqa: F401  (guest: autouse)

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
LONG = ["--max-iters", "100000", "--eval-every", "100000"]


def _cli_argv() -> list[str]:
    return [sys.executable, "-m", "testbed.cli"]


def _pid_of(ns: str, p: subprocess.Popen, timeout: float = 60) -> int:
    """The pid of the QEMU of namespace ``ns`` once it exists (``p`` is the `up` making it)."""
    from testbed.nodes.vm.backend import qemu_pids

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        pids = qemu_pids(ns)
        if pids:
            return pids[0]
        time.sleep(0.02)
    p.kill()
    raise AssertionError(f"no QEMU appeared for {ns}: {p.communicate()[1][-2000:]}")


def _error_line(rc: int, err: str) -> str:
    """The one line saying what went wrong (checked: exit 1, no traceback)."""
    assert rc == 1, err
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert lines, err
    print(lines[0])
    return lines[0]


# ---------------------------------------------------------------------- during a run
def test_a_hung_guest_ends_the_run_naming_its_node_then_down_removes_it(clean_kernel, tmp_path):
    """QEMU of w1 stopped (SIGSTOP) while the run's rank runs there: its guest, agent and
    all, stops answering. The run ends with one line naming w1 and why, and down removes the
    stopped QEMU (it needs SIGCONT or SIGKILL to act on anything)."""
    from testbed.nodes.vm.backend import qemu_pids

    cli_json("up", str(_write(tmp_path, _vm_dumbbell("vmh", rate="1gbit"))), "--no-exporter")
    runs = tmp_path / "runs"
    try:
        env = {**os.environ, "TESTBED_VM_HANG_TIMEOUT": "10"}
        p = subprocess.Popen([*_cli_argv(), "run", "allreduce", "--testbed", "vmh", "--out", str(runs),
                              "--no-exporter", "--timeout", "120", *LONG], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for_rank_in_guest("vmh", "w1", p)
            os.kill(qemu_pids("vmh.w1")[0], signal.SIGSTOP)
        finally:
            err, took = finish(p, 120)
        line = _error_line(p.returncode, err)
        print(f"the run ended {took:.1f} s after SIGSTOP")
        assert "node w1" in line and "node w0" not in line, err
        assert "not answering" in line and "stopped" in line, err
        assert took < 40, took  # the guest's silence (10 s), not --timeout (120 s), ended it
    finally:
        t0 = time.monotonic()
        r = cli("down", "vmh", "--json")
        print(f"down took {time.monotonic() - t0:.1f} s")
        assert r.returncode == 0, r.stdout + r.stderr
    assert _qemus("vmh") == []


# ---------------------------------------------------------------------- during up
def test_a_guest_agent_that_never_answers_fails_up_naming_the_node(clean_kernel, tmp_path):
    """QEMU of w1 stopped right after it started: its agent never answers. `up` gives up after
    TESTBED_VM_READY_TIMEOUT, naming w1 and the stopped QEMU, and removes everything."""
    topo = _write(tmp_path, _vm_dumbbell("vma"))
    p = subprocess.Popen([*_cli_argv(), "up", str(topo), "--no-exporter"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "TESTBED_VM_READY_TIMEOUT": "25"})
    t0 = time.monotonic()
    os.kill(_pid_of("vma.w1", p), signal.SIGSTOP)
    err, _ = finish(p, 120)
    took = time.monotonic() - t0
    line = _error_line(p.returncode, err)
    print(f"up failed {took:.1f} s after it started")
    assert "node w1" in line and "guest agent did not answer within 25 s" in line, err
    assert "QEMU" in line and "stopped" in line, err
    assert "console" in line, err
    assert "cleanup also failed" not in err, err
    assert took < 60, took
    assert _qemus("vma") == []
    assert "vma" not in run(["ip", "netns", "list"]).stdout


def test_a_vm_killed_during_up_fails_up_naming_the_node(clean_kernel, tmp_path):
    """QEMU of w1 killed (SIGKILL) while its guest boots: `up` fails at once naming w1 and
    removes everything."""
    topo = _write(tmp_path, _vm_dumbbell("vmq"))
    p = subprocess.Popen([*_cli_argv(), "up", str(topo), "--no-exporter"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    pid = _pid_of("vmq.w1", p)
    console = Path(clean_kernel["state_dir"]) / "vm" / "vmq.w1" / "console.log"
    deadline = time.monotonic() + 30  # booting: the guest kernel has written to its console
    while time.monotonic() < deadline and p.poll() is None and not (console.exists() and console.stat().st_size):
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    err, took = finish(p, 120)
    line = _error_line(p.returncode, err)
    print(f"up failed {took:.1f} s after SIGKILL")
    assert "node w1" in line and "QEMU" in line and "exited while booting" in line, err
    assert took < 30, took
    assert _qemus("vmq") == []
    assert "vmq" not in run(["ip", "netns", "list"]).stdout


# ---------------------------------------------------------------------- down
def test_down_returns_only_after_qemu_exited(clean_kernel, tmp_path):
    cli_json("up", str(_write(tmp_path, _vm_dumbbell("vmd"))), "--no-exporter")
    pids = _qemus("vmd")
    assert len(pids) == 2
    t0 = time.monotonic()
    r = cli("down", "vmd", "--json")
    took = time.monotonic() - t0
    gone = [p for p in pids if not _running(p)]  # at once: no sleep
    print(f"down took {took:.2f} s; QEMU gone on return: {gone == pids}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert gone == pids and _qemus("vmd") == []


def test_down_names_a_qemu_that_does_not_exit_and_a_second_down_finishes(clean_kernel, tmp_path):
    """w0's QEMU frozen (cgroup-v1 freezer): SIGTERM and SIGKILL wait until it is thawed.
    `down` waits a bounded time, then fails naming that process (pid and what it is) and
    keeps the ledger; thawed, the process dies and a second `down` finishes."""
    if not has_freezer():
        pytest.skip(f"no cgroup-v1 freezer at {FREEZER}: cannot make a process that SIGKILL does not end")
    cli_json("up", str(_write(tmp_path, _vm_dumbbell("vmz"))), "--no-exporter")
    from testbed.nodes.vm.backend import qemu_pids

    frozen, other = qemu_pids("vmz.w0")[0], qemu_pids("vmz.w1")[0]
    ice = Frozen(frozen)
    try:
        t0 = time.monotonic()
        r = cli("down", "vmz")
        took = time.monotonic() - t0
        print(f"down with a frozen QEMU took {took:.1f} s (exit {r.returncode})")
        line = _error_line(r.returncode, r.stderr)
        assert f"pid {frozen}" in line and "qemu-system-x86_64" in line and "testbed-vm:vmz.w0" in line, r.stderr
        assert "after SIGKILL" in line, r.stderr
        assert f"pid {other}" not in line and not _running(other), r.stderr
        assert took < 30, took
    finally:
        ice.thaw()
    r = cli("down", "vmz", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not _running(frozen) and _qemus("vmz") == []
