"""Processes a testbed's user code leaves behind end with `down`, wherever they moved.

A rank of `testbed run --script` leaves two daemons (fork, setsid, fork; SIGTERM ignored):
one moves into a network namespace of its own (``unshare -n``; rootless ``unshare -Urn``),
one stays in its node. As root they are found by the testbed's cgroup, rootless by the
holder's PID namespace; after `down` none is left, and rootless the holder is gone too.
`down` says, one line each, what it could not end (a process frozen by a v1 freezer) and
keeps the testbed for another try. A state directory an ordinary user cannot use is one
line, exit 1, and leaves no holder behind.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from testbed.common import cgroups
from testbed.plan import naming
from tests.helpers import dumbbell, ordinary_user, user_processes, user_processes_left

from .conftest import cli, cli_json

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
USER = "tbprocs1"
TESTBED = str(Path(sys.executable).with_name("testbed"))
FREEZER = Path("/sys/fs/cgroup/freezer")

DAEMON = r'''
import ctypes, os, sys


def leave_daemon(mark, flags):
    # a daemon as daemon(3) makes one (fork, setsid, fork), moved by unshare(flags)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if flags and ctypes.CDLL(None, use_errno=True).unshare(flags) != 0:
                os._exit(1)
            fd = os.open(os.devnull, os.O_RDWR)
            for i in (0, 1, 2):
                os.dup2(fd, i)
            os.execv(sys.executable, [sys.executable, "-c", "import signal, time\n"
                     "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(3600)", mark])
        os._exit(0)
    os.wait()
'''
SCRIPT = DAEMON + r'''
import torch, torch.distributed as dist
from workloads.records import record

mark, flags = sys.argv[1], int(sys.argv[2], 0)
leave_daemon(mark + "-moved", flags)
leave_daemon(mark + "-setsid", 0)
dist.init_process_group("gloo")
t = torch.ones(1000)
dist.all_reduce(t)
record(iter=1, loss=0.0, payload_bytes=t.numel() * 4)
dist.destroy_process_group()
'''


def _marked(mark: str) -> list[int]:
    """Live processes with ``mark`` in an argument."""
    out = []
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            with open(f"{e.path}/cmdline", "rb") as f:
                if not any(a.startswith(mark.encode()) for a in f.read().split(b"\0")):
                    continue
            with open(f"{e.path}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(int(e.name))
        except (OSError, IndexError):
            continue
    return out


def _await(what, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (got := what()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def _netns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _kill(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, 9)
        except ProcessLookupError:
            pass


def _daemons_left_by_a_run(run, tmp_path: Path, mark: str, flags: int) -> dict[str, list[int]]:
    """`run` (a function running `testbed ARGS`) a script that leaves the daemons; their pids."""
    script = tmp_path / "leaves_daemons.py"
    script.write_text(SCRIPT)
    r = run("run", "-t", "pd", "--script", str(script), "--out", str(tmp_path / "runs"), "--", mark, hex(flags))
    assert r.returncode == 0, r.stdout + r.stderr
    moved = _await(lambda: _marked(mark + "-moved"))
    assert len(moved) == 2, "each rank's daemon that left its node outlives the run"
    return {"moved": moved, "setsid": _marked(mark + "-setsid")}


# ---------------------------------------------------------------------------------------- root
def test_down_ends_what_a_run_left_running_wherever_it_moved(clean_kernel, tmp_path):
    mark = f"tbstray{os.getpid()}r"
    topo = tmp_path / "pd.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("pd", rate="1gbit")))
    group = cgroups.path_for("pd", naming.state_id())
    assert cli("up", str(topo)).returncode == 0
    try:
        left = _daemons_left_by_a_run(cli, tmp_path, mark, CLONE_NEWNET)
        nodes = {os.stat(f"/run/netns/pd.{w}").st_ino for w in ("w0", "w1")}
        assert not {_netns(p) for p in left["moved"]} & nodes  # they did leave the nodes
        if group is not None and group.is_dir():
            assert set(left["moved"]) <= set(cgroups.members(group))
    finally:
        down = cli("down", "pd")
        stray = _marked(mark)
        _kill(stray)
    assert down.returncode == 0, down.stdout + down.stderr
    assert stray == [], f"left running after down: {stray}"
    assert group is None or not group.exists(), f"{group} left behind"


def test_down_says_what_it_could_not_end_and_keeps_the_testbed(clean_kernel, tmp_path):
    """A process frozen by a v1 freezer cannot die: `down` names it on a line of its own, exits
    1 and keeps the testbed (its ledger) for `down` to finish once it is thawed."""
    group = cgroups.path_for("pd", naming.state_id())
    if not (FREEZER / "tasks").exists() or group is None:
        pytest.skip("needs a cgroup v1 freezer beside cgroup2 (a hybrid hierarchy) to make a process unkillable")
    mark = f"tbstray{os.getpid()}f"
    topo = tmp_path / "pd.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("pd", rate="1gbit")))
    assert cli("up", str(topo)).returncode == 0
    ice = FREEZER / f"testbed-test-{os.getpid()}"
    ice.mkdir()
    try:
        (tmp_path / "d.py").write_text(DAEMON + f"\nleave_daemon({mark!r}, {CLONE_NEWNET})\n")
        assert cli("exec", "-t", "pd", "w0", "--", sys.executable, str(tmp_path / "d.py")).returncode == 0
        [pid] = _await(lambda: _marked(mark))
        (ice / "cgroup.procs").write_text(str(pid))
        (ice / "freezer.state").write_text("FROZEN")
        r = cli("down", "pd")
        assert r.returncode == 1, r.stdout + r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith(f"could not end pid {pid} ")]
        assert len(lines) == 1 and "testbed pd" in lines[0], r.stderr
        assert "Traceback" not in r.stderr
        assert [t["name"] for t in cli_json("status")["testbeds"]] == ["pd"]
        (ice / "freezer.state").write_text("THAWED")
        r = cli("down", "pd")
        assert r.returncode == 0, r.stdout + r.stderr
        assert _marked(mark) == [] and not group.exists()
    finally:
        (ice / "freezer.state").write_text("THAWED")
        cli("down", "pd")
        _kill(_marked(mark))
        _await(lambda: not (ice / "cgroup.procs").read_text().strip(), 5)
        ice.rmdir()


# ------------------------------------------------------------------------------------ rootless
@pytest.fixture(scope="module")
def user():
    if shutil.which("runuser") is None or shutil.which("useradd") is None:
        pytest.skip("runuser/useradd missing: cannot act as an ordinary user here")
    with ordinary_user(USER) as pw:
        yield Path(pw.pw_dir)


def as_user(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    home = pwd.getpwnam(USER).pw_dir
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    argv = ["runuser", "-u", USER, "--", "env", "-i", f"HOME={home}", f"USER={USER}", "LANG=C.UTF-8",
            f"PATH={Path(TESTBED).parent}:/usr/sbin:/usr/bin:/sbin:/bin", *extra, TESTBED, *args]
    return subprocess.run(argv, cwd=home, capture_output=True, text=True, timeout=timeout)


def _processes() -> list[str]:
    """The user's live processes, as ``pid args``."""
    return user_processes(USER)


def _nothing_left(timeout: float = 15.0) -> list[str]:
    return user_processes_left(USER, timeout)


def test_rootless_down_ends_what_a_run_left_and_the_holder_stops(user, tmp_path):
    home = user
    assert _processes() == [], "the user should have nothing running before the test"
    work = home / "procs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "pd.yaml").write_text(yaml.safe_dump(dumbbell("pd", rate="1gbit")))
    shutil.chown(work, USER)
    shutil.chown(work / "pd.yaml", USER)
    mark = f"tbstray{os.getpid()}u"
    up = as_user("up", str(work / "pd.yaml"))
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        _daemons_left_by_a_run(as_user, work, mark, CLONE_NEWUSER | CLONE_NEWNET)
    finally:
        down = as_user("down", "pd")
        left = _nothing_left()
        subprocess.run(["pkill", "-9", "-u", USER], capture_output=True)
    assert down.returncode == 0, down.stdout + down.stderr
    assert left == [], f"left running after down (the holder, or what the run left): {left}"


@pytest.mark.parametrize("case", ["0500", "0300", "0000", "under-a-file"])
def test_a_state_directory_the_user_cannot_use_is_one_line_and_no_holder(user, case):
    home = user
    base = home / "statecase"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    shutil.chown(base, USER)
    if case == "under-a-file":
        (base / "file").write_text("")
        shutil.chown(base / "file", USER)
        state = base / "file" / "state"
    else:
        state = base / "state"
        state.mkdir()
        shutil.chown(state, USER)
        state.chmod(int(case, 8))
    topo = base / "pd.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("pd")))
    try:
        for args in (["up", str(topo)], ["status"], ["down", "pd"], ["exec", "-t", "pd", "w0", "--", "true"]):
            r = as_user(*args, env={"TESTBED_STATE_DIR": str(state)})
            assert r.returncode == 1, (args, r.stdout + r.stderr)
            lines = r.stderr.strip().splitlines()
            assert lines[0].startswith("error: ") and str(state) in lines[0], (args, r.stderr)
            assert len(lines) == 2 and lines[1].strip().startswith("hint: "), (args, r.stderr)
            assert (left := _nothing_left(5)) == [], (args, left)
    finally:
        subprocess.run(["pkill", "-9", "-u", USER], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


# ----------------------------------------------------------------------------- after a crash
def test_the_cgroup_of_an_up_killed_by_sigkill_is_removed_by_down_and_by_down_all(clean_kernel, tmp_path):
    """`up` killed once everything is made (its cgroup too): `down` removes the cgroup from
    the ledger; with the ledger lost, `down --all` finds it by the state directory's id.
    (clean_kernel also checks, after every kernel test, that no cgroup of its state is left.)"""
    from testbed.engine.core import FAULT_ENV

    topo = tmp_path / "pd.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("pd", rate="1gbit")))
    group = cgroups.path_for("pd", naming.state_id())
    steps = len(cli_json("up", str(topo), "--dry-run")["actions"])
    for lose_ledger in (False, True):
        r = cli("up", str(topo), env={FAULT_ENV: str(steps)})
        assert r.returncode == -9, r.stdout + r.stderr
        if group is None or not group.is_dir():
            pytest.skip("cgroup2 cannot be written here: no cgroup is made")
        if lose_ledger:
            shutil.rmtree(Path(clean_kernel["state_dir"]) / "pd")  # ledger and state file lost
            assert "pd" in cli_json("down", "--all")["removed"]
        else:
            assert cli_json("down", "pd") == {"removed": ["pd"]}
        assert not group.exists()


def test_a_cgroup_with_cgroups_below_it_and_a_late_joiner_is_removed():
    """User code running as root may make cgroups inside its testbed's (a container engine, a
    `systemd-run --scope` does): their processes are ended and they are removed too. A process
    that joins after the cgroup was emptied (`testbed run` starting one more process in a node
    as `down` runs) is ended as well, not left to fail `down` with "busy" (stop 47's CI)."""
    if not cgroups.create(group := cgroups.path_for("zr", "0000test0000")):
        pytest.skip("no writable cgroup2 here")
    (inner := group / "inner" / "deeper").mkdir(parents=True)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    nested, late = subprocess.Popen(sleep), subprocess.Popen(sleep)
    joined = threading.Event()
    real_end = cgroups.end

    def end_then_one_joins(path, *args):
        left = real_end(path, *args)
        if not joined.is_set():
            (group / "cgroup.procs").write_text(str(late.pid))
            joined.set()
        return left

    try:
        (inner / "cgroup.procs").write_text(str(nested.pid))
        assert cgroups.members(group) == [nested.pid]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cgroups, "end", end_then_one_joins)
            assert cgroups.remove(group, grace=0.5) == []
        assert not group.exists() and joined.is_set()
        assert nested.wait(5) == -15 and late.wait(5) == -15
    finally:
        for p in (nested, late):
            p.kill()
            p.wait()
        if group.exists():
            cgroups.remove(group)
