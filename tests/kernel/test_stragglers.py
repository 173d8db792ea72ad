"""`down` never reports removed what still runs: a process in a node, or a testbed's link
exporter, that SIGKILL does not end (frozen by the cgroup-v1 freezer, as a process stuck in
the kernel is) is named with its pid and command, the ledger is kept, and once it is thawed
a second `down` finishes. The same for a lost ledger (`down --all`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import FREEZER, Frozen, dumbbell, has_freezer, running
from tests.kernel.conftest import cli, cli_json

pytestmark = pytest.mark.kernel


@pytest.fixture(autouse=True)
def _freezer():
    if not has_freezer():
        pytest.skip(f"no cgroup-v1 freezer at {FREEZER}: cannot make a process that SIGKILL does not end")


def _sleeper(name: str, node: str) -> tuple[subprocess.Popen, int]:
    """``sleep 600`` inside ``node``: the relay here and the pid of the sleep in the node."""
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "exec", "--testbed", name, node, "--",
                          "sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = subprocess.run(["ip", "netns", "pids", f"{name}.{node}"], capture_output=True, text=True).stdout.split()
        sleeps = [int(x) for x in pids if Path(f"/proc/{x}/comm").read_text().strip() == "sleep"]
        if sleeps:
            return p, sleeps[0]
        time.sleep(0.05)
    p.kill()
    raise AssertionError("sleep never started in the node")


def _error(r) -> str:
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    return r.stderr


def test_down_names_a_process_in_a_node_that_does_not_exit_and_a_second_down_finishes(clean_kernel, tmp_path):
    topo = tmp_path / "sz.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("sz")))
    cli_json("up", str(topo), "--no-exporter")
    relay, pid = _sleeper("sz", "w0")
    ice = Frozen(pid)
    try:
        t0 = time.monotonic()
        err = _error(cli("down", "sz"))
        assert f"pid {pid}" in err and "sleep 600" in err and "after SIGKILL" in err, err
        assert "testbed down sz" in err and time.monotonic() - t0 < 30, err
        assert "sz" in [t["name"] for t in cli_json("status")["testbeds"]]  # the ledger is kept
    finally:
        ice.thaw()
    assert cli("down", "sz").returncode == 0
    assert not running(pid)
    relay.wait(10)


def test_down_names_a_link_exporter_that_does_not_exit(clean_kernel, tmp_path):
    topo = tmp_path / "se.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("se")))
    cli_json("up", str(topo))
    marker = f"--sd-file={Path(clean_kernel['state_dir']) / 'targets' / 'testbed-se.json'}"
    [pid] = [int(p) for p in subprocess.run(["pgrep", "-f", "--", marker], capture_output=True,
                                            text=True).stdout.split()]
    ice = Frozen(pid)
    try:
        err = _error(cli("down", "se"))
        assert "testbed se's link exporter did not exit" in err and f"pid {pid}" in err, err
    finally:
        ice.thaw()
    assert cli("down", "se").returncode == 0 and not running(pid)


def test_down_all_after_a_lost_ledger_names_a_process_that_does_not_exit(clean_kernel, tmp_path):
    topo = tmp_path / "sl.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("sl")))
    cli_json("up", str(topo), "--no-exporter")
    relay, pid = _sleeper("sl", "w1")
    shutil.rmtree(Path(clean_kernel["state_dir"]) / "sl")  # the ledger is lost
    ice = Frozen(pid)
    try:
        r = cli("down", "--all", "--json")
        assert r.returncode == 1, r.stdout + r.stderr
        msg = json.loads(r.stdout)["error"]
        assert f"pid {pid}" in msg and "testbed sl's nodes" in msg, msg
    finally:
        ice.thaw()
    r = cli("down", "--all", "--json")
    assert r.returncode == 0 and "sl" in json.loads(r.stdout)["removed"], r.stdout + r.stderr
    relay.wait(10)
