"""The step that holds a host's share of a Slurm job (``testbed _host apply NAME --hold``):
it stays while the share is up, and at the job's end (SIGTERM or SIGHUP, before Slurm's
SIGKILL) removes the share itself, so that the job's end leaves nothing on the node."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from testbed.hosts import agentns

    flag, removed, fail = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "fail"
    agentns.HOLD_POLL_S = 0.05

    class Ledger:  # the share is up while the flag file exists
        def __init__(self, name):
            pass

        def exists(self):
            return flag.exists()

    agentns.Ledger = Ledger

    def down():
        if fail:
            raise RuntimeError("a namespace is busy")
        removed.write_text("down")

    print("holding", flush=True)
    sys.exit(agentns.hold("slm", on_end=down))
""")


def _hold(tmp_path: Path, fail: bool = False) -> subprocess.Popen:
    (tmp_path / "up").touch()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "up"), str(tmp_path / "removed"),
                             "fail" if fail else "ok"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
    time.sleep(0.3)  # into hold(), its handlers set
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_the_jobs_end_removes_the_share_before_the_step_exits(tmp_path, sig):
    proc = _hold(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert (tmp_path / "removed").read_text() == "down"


def test_a_share_removed_by_down_ends_the_step_without_a_second_down(tmp_path):
    proc = _hold(tmp_path)
    (tmp_path / "up").unlink()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert not (tmp_path / "removed").exists()


def test_a_failed_removal_at_the_jobs_end_says_why_in_one_line(tmp_path):
    proc = _hold(tmp_path, fail=True)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert err.strip().splitlines() == ["error: removing testbed 'slm' at the job's end (signal 15): "
                                        "a namespace is busy"]
