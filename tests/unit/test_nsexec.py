"""testbed.nodes.nsexec's die-with-parent: real processes, no namespaces needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A "controller" that starts a child which asks to die with it, prints the child's pid, waits.
CONTROLLER = r"""
import os, subprocess, sys
env = dict(os.environ, TESTBED_DIE_WITH_PARENT=str(os.getpid()))
child = subprocess.Popen([sys.executable, "-c",
    "import sys, time\n"
    "from testbed.nodes.nsexec import _die_with_parent\n"
    "code = _die_with_parent()\n"
    "if code is not None: sys.exit(code)\n"
    "import os; print(os.environ.get('TESTBED_DIE_WITH_PARENT'), flush=True)\n"
    "time.sleep(60)"], env=env, stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
import time; time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_bound_child_dies_when_its_starter_is_killed_and_its_own_children_are_not_bound():
    p = subprocess.Popen([sys.executable, "-c", CONTROLLER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pid, seen = p.stdout.readline().split()
        pid = int(pid)
        assert seen == "None", "the variable is removed before the command runs"
        assert _alive(pid)
        p.send_signal(signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the child outlived the process that started it"
    finally:
        p.kill()


def test_a_child_whose_starter_is_already_gone_exits_at_once():
    # the variable names a pid that is not the parent: as if the parent died before prctl
    r = subprocess.run([sys.executable, "-m", "testbed.nodes.nsexec", "nons", "--", "true"], cwd=ROOT,
                       env=dict(os.environ, TESTBED_DIE_WITH_PARENT="1"), capture_output=True, text=True, timeout=30)
    assert r.returncode == 137 and "is gone" in r.stderr
