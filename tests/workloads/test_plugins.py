"""Schemes and link types installed as packages (entry points), without root: the toy plugin
(examples/plugin) and a broken one pip-installed from source into a fresh venv. Its scheme
trains under plain torchrun (the ranks find it through the venv's own installation), its
link type validates, a broken plugin is one warning line, and a plugin scheme whose module is
gone is refused before a run. The same across hosts, as root: tests/kernel/test_multihost.py."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from tests.helpers import venv_with_plugins

pytestmark = pytest.mark.slow

TOPOLOGY = {"name": "plug", "nodes": {"s0": {"kind": "switch"}, "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s0"], "type": "jumbo", "mtu": 4000}, {"endpoints": ["w1", "s0"]}]}
WARNING = ("warning: plugin backend 'broken' of package 'testbed-broken-plugin' is skipped: ImportError: this "
           "plugin is broken on purpose")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    return venv_with_plugins(tmp_path_factory.mktemp("plugins"))


def _run(*argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_the_link_type_validates_and_the_broken_plugin_is_one_warning(venv, tmp_path):
    import sys

    topo = tmp_path / "plug.yaml"
    topo.write_text(yaml.safe_dump(TOPOLOGY))
    r = _run(venv, "validate", topo, "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [WARNING] and json.loads(r.stdout)["valid"] is True, r.stdout
    # in Python, one call: the plan makes the link with the plugin's own action
    plan = ("import ipaddress, sys, testbed\n"
            "assert testbed.load_plugins() == [sys.argv[2]]\n"
            "from testbed.engine.planner import make_plan\n"
            "plan = make_plan(testbed.load_topology(sys.argv[1]), ipaddress.ip_network('10.9.0.0/24'))\n"
            "print([(a.to_dict()['action'], a.mtu) for a in plan.actions if hasattr(a, 'mtu')])")
    r = _run(venv.parent / "python", "-c", plan, topo, WARNING.removeprefix("warning: "))
    assert r.returncode == 0 and r.stdout.strip() == "[('JumboVeth', 4000), ('CreateVeth', None)]", r.stderr
    help_ = _run(venv, "run", "--help")
    assert "toyscheme" in help_.stdout and help_.stderr.splitlines() == [WARNING]
    without = _run(sys.executable, "-m", "testbed.cli", "validate", topo)  # this venv has no plugins
    assert without.returncode == 1 and without.stderr.startswith("error: links[0].mtu: unknown key 'mtu'")


def test_a_plugin_scheme_whose_module_is_gone_is_refused_before_the_run(venv, tmp_path):
    r = _run(venv, "run", "brokenscheme", "--out", tmp_path / "runs")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "scheme 'brokenscheme' of package 'testbed-broken-plugin': no module broken_testbed_gone" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_the_scheme_trains_under_plain_torchrun(venv, tmp_path):
    python = venv.parent / "python"
    r = _run(python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "workloads.train",
             "--scheme", "toyscheme", "--max-iters", "4", "--eval-every", "4", "--out", tmp_path / "run")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    # the toy hook hands every gradient to its all-reduce, and counts it
    assert s["scheme"] == "toyscheme" and s["iterations"] == 4 and s["mean_payload_bytes"] == s["dense_bytes"]
    records = [json.loads(x) for x in (tmp_path / "run" / "rank1.jsonl").read_text().splitlines()]
    assert [r["payload_bytes"] for r in records] == [s["dense_bytes"]] * 4
