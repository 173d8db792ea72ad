"""Processes that outlive `down` (issue 43), self-contained so that it runs on code from
before the testbed's cgroup too (tests/kernel/test_processes.py has the full set: runs,
rootless users, what down cannot end): a daemon that user code leaves in a node, moved into
a network namespace of its own in a new session and deaf to SIGTERM, ends with `down`."""

from __future__ import annotations

import os
import sys
import time

import yaml

from tests.helpers import dumbbell

from .conftest import cli
from .test_processes import _marked

LEAVE = r'''
import ctypes, os, sys
if os.fork() == 0:  # a daemon as daemon(3) makes one (fork, setsid, fork), then in a network namespace of its own
    os.setsid()
    if os.fork() == 0:
        if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:  # CLONE_NEWNET
            os._exit(1)
        fd = os.open(os.devnull, os.O_RDWR)
        for i in (0, 1, 2):
            os.dup2(fd, i)
        os.execv(sys.executable, [sys.executable, "-c", "import signal, time\n"
                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(3600)", sys.argv[1]])
    os._exit(0)
os.wait()
'''


def test_down_ends_a_daemon_that_moved_out_of_its_node(clean_kernel, tmp_path):
    mark = f"tbshared{os.getpid()}d"
    topo = tmp_path / "sp.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("sp", rate="1gbit")))
    assert cli("up", str(topo)).returncode == 0
    try:
        r = cli("exec", "-t", "sp", "w0", "--", sys.executable, "-c", LEAVE, mark)
        assert r.returncode == 0, r.stdout + r.stderr
        deadline = time.monotonic() + 20
        while not (left := _marked(mark)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(left) == 1, "the daemon runs"
        node = os.stat("/run/netns/sp.w0").st_ino
        assert os.stat(f"/proc/{left[0]}/ns/net").st_ino not in (node, os.stat("/proc/self/ns/net").st_ino)
    finally:
        down = cli("down", "sp")
        time.sleep(0.5)
        stray = _marked(mark)
        for pid in stray:
            os.kill(pid, 9)
    assert down.returncode == 0, down.stdout + down.stderr
    assert stray == [], f"left running after down, in a network namespace of its own: {stray}"
