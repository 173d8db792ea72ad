"""The CLI's grammar: the testbed named the same way everywhere (-t NAME|FILE, or NAME
positionally where it always was), choices from the library's registries refused at parse
time (exit 2, naming them), --json errors as one object, --version, and `up --dry-run`
failing exactly as `up` does. No testbed is built: a state file stands in for one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer
import yaml

from testbed.cli import app
from testbed.common.version import __version__
from tests.helpers import dumbbell


def cli(*args, state=None):
    env = dict(os.environ)
    if state is not None:
        env["TESTBED_STATE_DIR"] = str(state)
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def one_json(r) -> dict:
    """stdout holds exactly one JSON object (json.loads refuses anything after it)."""
    return json.loads(r.stdout)


@pytest.fixture
def state(tmp_path, monkeypatch):
    """An empty state directory: no testbed is up."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def fake_up(state, tmp_path):
    """A testbed 'gram' that `status` sees as up (its state file, written as up writes it;
    nothing in the kernel): (name, its topology file)."""
    from testbed import load_topology
    from testbed.engine.core import _initial_state
    from testbed.engine.planner import make_plan
    from testbed.plan.ledger import Ledger
    from testbed.plan.plan import choose_subnet

    topo_file = tmp_path / "gram.yaml"
    topo_file.write_text(yaml.safe_dump(dumbbell("gram")))
    topo = load_topology(topo_file)
    st = _initial_state(make_plan(topo, choose_subnet(topo, [])))
    ledger = Ledger("gram")
    ledger.create()
    ledger.write_state({**st, "ready": True})
    ledger.close()
    return "gram", topo_file


def test_version_as_an_option_and_as_a_command():
    for args in (("--version",), ("version",)):
        r = cli(*args)
        assert r.returncode == 0 and r.stdout.strip() == __version__, r


def test_status_takes_the_name_positionally_with_t_or_as_the_topology_file(fake_up, state):
    name, topo_file = fake_up
    by_name = one_json(cli("status", name, "--json", state=state))
    assert by_name["name"] == name and [n["name"] for n in by_name["nodes"] if n["kind"] == "worker"] == ["w0", "w1"]
    assert one_json(cli("status", "-t", name, "--json", state=state)) == by_name
    assert one_json(cli("status", "--testbed", name, "--json", state=state)) == by_name
    assert one_json(cli("status", "-t", str(topo_file), "--json", state=state)) == by_name
    assert one_json(cli("status", str(topo_file), "--json", state=state)) == by_name
    assert [t["name"] for t in one_json(cli("status", "--json", state=state))["testbeds"]] == [name]
    r = cli("status", name, "-t", "other", state=state)  # named twice, differently
    assert r.returncode == 2 and "named twice" in r.stderr


def test_t_file_uses_the_topologys_name(state, tmp_path):
    topo_file = tmp_path / "x.yaml"
    topo_file.write_text(yaml.safe_dump(dumbbell("fromfile")))
    for cmd in (("status", "-t", str(topo_file)), ("link", "show", "-t", str(topo_file)),
                ("down", "-t", str(topo_file)), ("exec", "-t", str(topo_file), "w0", "--", "true")):
        r = cli(*cmd, state=state)
        assert "fromfile" in r.stdout + r.stderr and "Traceback" not in r.stderr, (cmd, r.stdout, r.stderr)
    r = cli("link", "show", "-t", "a/b", state=state)  # neither a name nor a file
    assert r.returncode == 1 and "invalid testbed name 'a/b'" in r.stderr and "topology file" in r.stderr


def test_down_names_the_testbed_positionally_or_with_t(fake_up, state):
    name, _ = fake_up
    assert one_json(cli("down", "-t", "nonesuch", "--json", state=state)) == {"removed": []}
    r = cli("down", name, "--all", state=state)
    assert r.returncode == 2 and "--all" in r.stderr


def test_a_bad_direction_is_a_usage_error_naming_the_choices_before_any_testbed_is_looked_for(state):
    from testbed.engine.replay import DIRECTION_CHOICES

    for cmd in (("link", "set", "l0", "--bw", "1gbit"), ("link", "replay", "l0", "trace.csv")):
        r = cli(*cmd, "--direction", "sideways", state=state)
        assert r.returncode == 2, r
        assert "sideways" in r.stderr and all(d in r.stderr for d in ("forward", "reverse", "both")), r.stderr
        assert "no testbed is up" not in r.stderr and r.stdout == ""
    assert DIRECTION_CHOICES == ("forward", "reverse", "both")


def test_an_unknown_scheme_is_a_usage_error_naming_the_choices(state):
    from workloads.schemes import names

    r = cli("run", "topk2", state=state)
    assert r.returncode == 2 and "unknown scheme 'topk2'; choose one of: " + ", ".join(names()) in r.stderr, r.stderr
    r = cli("sweep", "--schemes", "allreduce,topk2", state=state)
    assert r.returncode == 2 and "unknown scheme 'topk2'" in r.stderr
    r = cli("run", "topk:frob=1", state=state)  # a variant naming a parameter topk does not have
    assert r.returncode == 2 and "topk has no parameter 'frob'" in r.stderr
    r = cli("run", "allreduce", "--backend", "mpi", state=state)  # the workload's own list, checked up front
    assert r.returncode == 2 and "unknown backend 'mpi'; choose one of: auto, gloo, nccl" in r.stderr, r.stderr


def test_other_choices_come_from_their_registries():
    from workloads.schemes import parameters

    from testbed.model.trace import TRACE_FORMATS

    r = cli("link", "replay", "l0", "t.csv", "--format", "json")
    assert r.returncode == 2 and all(f in r.stderr for f in TRACE_FORMATS)
    teams = next(p for p in parameters() if p.name == "spardl_teams")
    r = cli("run", "spardl", "--spardl-teams", "many")
    assert r.returncode == 2 and all(v in r.stderr for v in teams.check.values)
    r = cli("run", "topk", "--topk-ratio", "2")
    assert r.returncode == 2 and "--topk-ratio must be in (0, 1]" in r.stderr


def test_run_has_one_flag_per_declared_scheme_hyper_parameter():
    from workloads.schemes import parameters

    run = typer.main.get_command(app).commands["run"]
    flags = {o for p in run.params for o in p.opts}
    assert {p.flag for p in parameters()} <= flags
    assert len([o for p in run.params for o in p.opts]) == len(flags), "a flag declared twice"


def test_json_errors_are_one_object_with_error_and_hint(state):
    for cmd, code in ((("link", "set", "l0", "--direction", "sideways"), 2), (("run", "topk2"), 2),
                      (("status", "nonesuch"), 1), (("link", "show"), 1), (("report", str(state)), 1)):
        r = cli(*cmd, "--json", state=state)
        assert r.returncode == code, (cmd, r)
        obj = one_json(r)
        assert set(obj) >= {"error", "hint"} and obj["error"], (cmd, obj)
        assert "error" not in r.stderr.lower() or "warning" in r.stderr, (cmd, r.stderr)


def _netem_here() -> bool:
    if os.geteuid() != 0:
        return False
    from testbed.net.probe import probe

    return probe()["netem"][0]


def test_dry_run_of_a_delay_fails_as_up_does_on_a_kernel_without_netem(state, tmp_path):
    if _netem_here():
        pytest.skip("this kernel has netem: `up` would build the testbed (tests/kernel covers it)")
    topo = tmp_path / "gramdelay.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("gramdelay", delay="10ms")))
    dry = cli("up", str(topo), "--dry-run", "--json", state=state)
    valid = cli("validate", str(topo), "--json", state=state)
    real = cli("up", str(topo), "--no-exporter", "--json", state=state)
    assert dry.returncode == valid.returncode == real.returncode == 1, (dry, real)
    assert one_json(dry) == one_json(valid) == one_json(real), (dry.stdout, real.stdout)
    if os.geteuid() == 0:
        assert "netem" in one_json(dry)["error"] and one_json(dry)["error"].startswith("links[2].delay")
    assert not (state / "gramdelay").exists()


def test_host_requests_reach_the_agent_unparsed():
    """`testbed _host OP ARGS...` is the SSH contract: the arguments reach the host agent as
    they came, `--` and `--help` included."""
    r = cli("_host", "frob", "x", "--", "--help")
    assert r.returncode == 1
    assert one_json(r)["error"] == "unknown operation 'frob' or wrong arguments ['x', '--', '--help']"
