"""CLI behaviour that needs no root: help everywhere, dry runs, clean errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [[], ["up"], ["down"], ["status"], ["exec"], ["doctor"], ["version"], ["link"], ["link", "show"], ["link", "set"]]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "testbed")
def test_help_everywhere(cmd):
    r = cli(*cmd, "--help")
    assert r.returncode == 0 and "Usage:" in r.stdout


def test_dry_run_prints_the_plan_and_creates_nothing():
    r = cli("up", str(ROOT / "topologies" / "three_switch.yaml"), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    kinds = [a["action"] for a in plan["actions"]]
    assert kinds.count("CreateNetns") == 9 and kinds.count("CreateBridge") == 3
    assert kinds.count("CreateVeth") == 10 and kinds.count("ShapeEgress") == 20
    r = cli("up", str(ROOT / "topologies" / "dumbbell.yaml"), "--dry-run")
    assert r.returncode == 0 and "tc htb on l2a: 100mbit" in r.stdout


def test_bad_topology_is_one_clean_error(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("name: t\nnodes: {w0: {kind: worker}, w1: {kind: worker}}\nlinks:\n  - endpoints: [w0, w2]\n")
    r = cli("up", str(p), "--dry-run")
    assert r.returncode == 1
    assert "links[0].endpoints[1]: node 'w2' is not defined" in r.stderr and "Traceback" not in r.stderr
    r = cli("up", str(p), "--dry-run", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"].startswith("links[0].endpoints[1]")


def test_usage_errors_exit_2():
    assert cli("up").returncode == 2
    assert cli("frobnicate").returncode == 2
