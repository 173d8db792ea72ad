"""`kill -9` of `testbed up` at any point, Ctrl-C and SIGTERM: nothing may be left behind."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed.engine.core import FAULT_ENV
from tests.helpers import star
from tests.kernel.conftest import cli, cli_json, run

ROOT = Path(__file__).resolve().parents[2]
THREE = str(ROOT / "topologies" / "three_switch.yaml")


def ours() -> list[str]:
    return [n for n in run(["ip", "netns", "list"]).stdout.split() if n.startswith("three_switch")]


def wait_for_target(state: Path) -> Path:
    """The orphaned link exporter's file-SD target, once it has announced itself."""
    target = state / "targets" / "testbed-three_switch.json"
    deadline = time.monotonic() + 20
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert target.exists()
    return target


# three_switch's plan has 59 steps: 0 fabric netns, 1-3 bridges, 4-51 workers (6 each), 52-57 uplinks,
# 58 the testbed's cgroup; step 59 starts the link exporter.
@pytest.mark.parametrize("step", [0, 1, 4, 5, 6, 7, 23, 44, 57])
def test_kill9_during_up_then_down_all(clean_kernel, step):
    r = cli("up", THREE, env={FAULT_ENV: str(step)})
    assert r.returncode == -signal.SIGKILL
    if step > 0:
        assert ours(), "the crash should have left objects for down to find"
    st = cli_json("status")["testbeds"]
    assert st[0]["name"] == "three_switch" and not st[0]["ready"]
    again = cli("up", THREE)
    assert again.returncode == 1 and "did not finish" in again.stderr
    assert cli_json("down", "--all")["removed"] == ["three_switch"]
    assert ours() == []


def test_kill9_after_the_exporter_started_then_down_stops_it(clean_kernel):
    """The step after the plan starts the link exporter: `up` dies with it running, known only to the ledger."""
    steps = len(cli_json("up", THREE, "--dry-run")["actions"])
    r = cli("up", THREE, env={FAULT_ENV: str(steps)})
    assert r.returncode == -signal.SIGKILL
    target = wait_for_target(Path(os.environ["TESTBED_STATE_DIR"]))  # the orphan still announces itself
    assert cli_json("down", "three_switch") == {"removed": ["three_switch"]}
    assert not target.exists() and ours() == []
    # no exporter left: checked by clean_kernel (no process naming the state dir)


def test_kill9_at_a_random_moment_of_a_big_up(clean_kernel, tmp_path):
    topo = tmp_path / "big.yaml"
    topo.write_text(json.dumps(star(200, name="big")))
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "up", str(topo)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len([n for n in os.listdir("/run/netns") if n.startswith("big")]) < 40:
        time.sleep(0.01)
    p.kill()
    p.wait()
    assert [n for n in os.listdir("/run/netns") if n.startswith("big")], "killed before it started"
    cli_json("down", "--all")


def test_lost_ledger_with_a_running_exporter_is_recovered(clean_kernel):
    steps = len(cli_json("up", THREE, "--dry-run")["actions"])
    assert cli("up", THREE, env={FAULT_ENV: str(steps)}).returncode == -signal.SIGKILL
    state = Path(os.environ["TESTBED_STATE_DIR"])
    target = wait_for_target(state)
    shutil.rmtree(state / "three_switch")  # the ledger is gone; the namespaces' tags and the target remain
    assert cli_json("down", "--all")["removed"] == ["three_switch"]
    assert ours() == [] and not target.exists()  # and clean_kernel: no exporter process left


def test_lost_ledger_is_recovered_from_ownership_tags(clean_kernel):
    r = cli("up", THREE, env={FAULT_ENV: "30"})
    assert r.returncode == -signal.SIGKILL and ours()
    # the exporter starts before the build (45717cc) and outlives the kill: let it announce
    # itself first, or it may write its target into the state directory while it is removed
    wait_for_target(Path(os.environ["TESTBED_STATE_DIR"]))
    shutil.rmtree(os.environ["TESTBED_STATE_DIR"])
    assert cli_json("down", "--all")["removed"] == ["three_switch"]
    assert ours() == []


DUMBBELL = str(ROOT / "topologies" / "dumbbell.yaml")


@pytest.mark.parametrize("damage", ["emptied", "garbage only", "truncated", "garbage line", "deep nesting",
                                    "huge integer"])
def test_down_removes_what_a_damaged_ledger_no_longer_lists(clean_kernel, damage):
    """`down NAME` (not only `down --all`) removes the testbed's tagged namespaces when its
    ledger was emptied, overwritten, cut short or holds lines JSON cannot read; exit 0, a
    warning, nothing left (clean_kernel checks the kernel as before)."""
    cli_json("up", DUMBBELL, "--no-exporter")
    name = yaml.safe_load(Path(DUMBBELL).read_text())["name"]
    ledger = Path(os.environ["TESTBED_STATE_DIR"]) / name / "ledger.jsonl"
    lines = ledger.read_text().splitlines(keepends=True)
    bad = {"garbage line": "{garbage\n", "deep nesting": "[" * 100_000 + "]" * 100_000 + "\n",
           "huge integer": "1" * 5000 + "\n"}.get(damage)
    ledger.write_text({"emptied": "", "garbage only": "{garbage\n", "truncated": "".join(lines)[:150]}.get(
        damage, "".join(lines[:2]) + (bad or "") + "".join(lines[2:])))
    r = cli("down", name)
    assert r.returncode == 0 and f"removed: {name}" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "warning:" in r.stderr, r.stderr
    assert [n for n in run(["ip", "netns", "list"]).stdout.split() if n.startswith(name)] == []
    assert not ledger.exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_during_up_rolls_back_by_itself(clean_kernel, tmp_path, sig):
    topo = tmp_path / "big.yaml"
    topo.write_text(json.dumps(star(300, name="intr")))
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "up", str(topo)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len([n for n in os.listdir("/run/netns") if n.startswith("intr")]) < 30:
        time.sleep(0.01)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "interrupted" in err and "removed" in err and "Traceback" not in err
    assert not [n for n in os.listdir("/run/netns") if n.startswith("intr")]


def test_down_during_a_run_says_the_testbed_was_taken_down(clean_kernel, tmp_path):
    """`testbed down` of the testbed a run trains on: the run ends saying so (not only that a
    rank was killed by signal 15), and nothing is left."""
    from tests.helpers import dumbbell
    import yaml

    topo = tmp_path / "dr.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("dr", rate="1gbit")))
    runs = tmp_path / "runs"
    assert cli("up", str(topo)).returncode == 0
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "-t", "dr", "--out", str(runs),
                          "--max-iters", "100000", "--eval-every", "100000"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(f.stat().st_size > 0 for f in runs.glob("*/rank1.jsonl")):
            assert time.monotonic() < deadline and p.poll() is None, "the run never started training"
            time.sleep(0.2)
        assert cli_json("down", "dr") == {"removed": ["dr"]}
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, err
    assert "testbed 'dr' was taken down during the run (`testbed down`)" in err, err
    assert "Traceback" not in err
