"""testbed's locks through one helper (testbed.common.locks, issue 57 item 3): a run's lock
names its holder, is not inherited by what the holder starts (run_lock's own flock code
opened its file without O_CLOEXEC; Python's os.open made it close-on-exec anyway, PEP 446,
so this held before too: the flag is now explicit, in one place), and never follows a link
planted at its path."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from testbed.common import locks
from testbed.common.errors import StateError, TestbedError


def _busy(pid: str) -> TestbedError:
    return TestbedError(f"busy with pid {pid}")


def test_a_second_holder_is_told_the_first_ones_pid(tmp_path):
    path = tmp_path / "run.lock"
    with locks.hold_now(path, _busy):
        with pytest.raises(TestbedError, match=f"busy with pid {os.getpid()}"):
            with locks.hold_now(path, _busy):
                pass
    with locks.hold_now(path, _busy):  # released when the block ended
        pass


def test_what_the_holder_starts_does_not_keep_the_lock(tmp_path):
    path = tmp_path / "run.lock"
    with locks.hold_now(path, _busy):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], close_fds=False)
    try:
        # The child lives on (30 s), holding nothing. Taken within 5 s, not at once: Popen
        # returns when the vfork'd child has exec'd, which is before the kernel closed its
        # close-on-exec descriptors (run alone, 24 of 30 tries at once said "busy with pid ...").
        deadline = time.monotonic() + 5
        while True:
            try:
                with locks.hold_now(path, _busy):
                    break
            except TestbedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        child.kill()
        child.wait()


def test_a_link_at_the_locks_path_is_not_followed(tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep")
    (tmp_path / ".lock").symlink_to(target)
    with pytest.raises(OSError):
        with locks.held(locks.open_lock(tmp_path / ".lock"), 1, "busy"):
            pass
    assert target.read_text() == "keep"


def test_a_held_lock_waits_then_says_who_is_busy(tmp_path):
    with locks.held(locks.open_lock(tmp_path / ".lock"), 1, "busy"):
        with pytest.raises(StateError, match="another"):
            with locks.held(locks.open_lock(tmp_path / ".lock"), 0.1, "another holds it"):
                pass
