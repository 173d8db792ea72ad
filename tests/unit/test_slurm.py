"""Slurm hosts without a cluster: the hostlist expander, the documented order of hosts onto
the job's nodes, the ``hosts:`` entries of Slurm nodes, the registry, the step's argv, the
file step's operations and the CLI's one-line errors outside a job."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from testbed.common.errors import StateError, TopologyError
from testbed.hosts import kinds
from testbed.hosts.slurm import files as slurmfiles, job as slurmjob, step as slurmstep
from testbed.common.hostlist import expand as expand_hostlist
from testbed.hosts.slurm.job import assign, from_job, guard_here, host_names
from testbed.hosts.slurm.step import step_argv
from testbed.model.hosts import host_from_json, parse_hosts
from testbed.model.topology import load_topology_dict

TOPO = {"name": "slm",
        "nodes": {"s1": {"kind": "switch", "host": "b"}, "s2": {"kind": "switch", "host": "a"},
                  "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
        "links": [{"endpoints": ["w0", "s1"]}, {"endpoints": ["w1", "s2"]}, {"endpoints": ["s1", "s2"]}]}
ADDRS = {"n1": "192.0.2.1", "n2": "192.0.2.2", "n3": "192.0.2.3"}


@pytest.mark.parametrize("text,nodes", [
    ("n1", ["n1"]),
    ("n[1-3,5],m7", ["n1", "n2", "n3", "n5", "m7"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
    ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
    ("a,b[2],c", ["a", "b2", "c"]),
])
def test_hostlists_expand_as_scontrol_show_hostnames_does(text, nodes):
    assert expand_hostlist(text) == nodes


@pytest.mark.parametrize("text", ["", "n[1-", "n1]", "n[3-1]", "n[a]", "n[[1]]", "n,,m", "n[1-99999999]", "x;rm"])
def test_a_malformed_hostlist_is_a_value_error(text):
    with pytest.raises(ValueError):
        expand_hostlist(text)


def test_host_names_in_the_documented_order():
    assert host_names(TOPO) == ["b", "a"]  # nodes' host:, in file order
    listed = {**TOPO, "hosts": [{"name": "a", "address": "192.0.2.9"}]}
    assert host_names(listed) == ["a", "b"]  # hosts: first


def test_hosts_take_the_jobs_nodes_in_order_and_load():
    data = assign(TOPO, 42, ["n1", "n2", "n3"], ADDRS, None, "/opt/tb/bin/testbed")
    topo = load_topology_dict(data)
    assert [(h.name, h.slurm, h.slurm_job, h.underlay, h.kind) for h in topo.hosts] == [
        ("b", "n1", 42, "192.0.2.1", "slurm"), ("a", "n2", 42, "192.0.2.2", "slurm")]
    assert load_topology_dict(topo.to_dict()) == topo  # the state's round trip


def test_the_host_on_the_controllers_own_node_is_local():
    data = assign(TOPO, 42, ["n1", "n2"], ADDRS, "n1", "testbed")  # a batch script runs on n1
    topo = load_topology_dict(data)
    assert [h.name for h in topo.hosts] == ["a"]
    assert topo.node("s1").host == "local" and topo.node("w0").host == "local"


def test_too_few_nodes_and_no_hosts_are_one_line_errors():
    with pytest.raises(StateError, match=r"needs 2 hosts \(b, a\), but Slurm job 42 has 1 node"):
        assign(TOPO, 42, ["n1"], ADDRS, None, "testbed")
    local = {**TOPO, "nodes": {k: {kk: vv for kk, vv in v.items() if kk != "host"} for k, v in TOPO["nodes"].items()}}
    with pytest.raises(TopologyError, match="places no node on another host"):
        assign(local, 42, ["n1"], ADDRS, None, "testbed")


def test_outside_a_job_and_bad_variables():
    with pytest.raises(StateError, match="not inside a Slurm job"):
        from_job(TOPO, {})
    with pytest.raises(StateError, match="SLURM_JOB_NODELIST"):
        from_job(TOPO, {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-"})
    with pytest.raises(StateError, match="not a job id"):
        from_job(TOPO, {"SLURM_JOB_ID": "7;x", "SLURM_JOB_NODELIST": "n1"})


def test_slurm_entries_are_checked():
    ok = {"name": "h1", "address": "192.0.2.1", "slurm": "gpu1", "slurm_job": 5}
    h = parse_hosts([ok])[0]
    assert h.kind == "slurm" and host_from_json(json.dumps(h.to_dict())) == h
    assert parse_hosts([{"name": "h1", "address": "192.0.2.1"}])[0].kind == "ssh"
    for bad, where in (({**ok, "slurm": "a b"}, "slurm"), ({**ok, "slurm_job": 0}, "slurm_job"),
                       ({**ok, "slurm_job": "5"}, "slurm_job"), ({**ok, "key": "/k"}, "key"),
                       ({**ok, "user": "root"}, "user"), ({"name": "h1", "address": "192.0.2.1", "slurm_job": 5},
                                                          "slurm")):
        with pytest.raises(TopologyError) as e:
            parse_hosts([bad])
        assert e.value.path == f"hosts[0].{where}"


def test_the_registry_gives_each_kind_its_remote_and_site():
    from testbed.hosts.site import SshSite
    from testbed.hosts.slurm.host import SlurmRemote, SlurmSite
    from testbed.hosts.ssh.client import Remote

    slurm = parse_hosts([{"name": "h1", "address": "192.0.2.1", "slurm": "gpu1"}])[0]
    ssh = parse_hosts([{"name": "h2", "address": "192.0.2.2"}])[0]
    assert isinstance(kinds.remote(slurm), SlurmRemote) and isinstance(kinds.remote(ssh), Remote)
    assert kinds.site_class(slurm) is SlurmSite and kinds.site_class(ssh) is SshSite


def test_a_step_is_srun_overlap_on_its_node_with_few_variables(monkeypatch):
    h = parse_hosts([{"name": "h1", "address": "192.0.2.1", "slurm": "gpu1", "slurm_job": 9}])[0]
    argv = step_argv(h, ["x;y", "$(z)"])
    assert argv[:6] == ["srun", "--jobid=9", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu1"]
    assert argv[-3:] == ["--", "x;y", "$(z)"]  # words, never a shell line
    assert any(a.startswith("--export=") and "TESTBED" not in a for a in argv)
    anyjob = parse_hosts([{"name": "h1", "address": "192.0.2.1", "slurm": "gpu1"}])[0]
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert "--jobid=77" in step_argv(anyjob, ["true"])
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(StateError, match="no job is known"):
        step_argv(anyjob, ["true"])


def test_the_guard_of_the_controllers_own_node_is_a_step_there_in_its_state_dir(monkeypatch):
    """As root on a node of a job, `up --hosts slurm` starts `_host guard NAME` on this node,
    with this process's TESTBED_STATE_DIR; as an ordinary user or outside a job, nothing."""
    started: list[list[str]] = []
    monkeypatch.setattr(slurmstep, "start", lambda argv, **kw: started.append(argv))
    monkeypatch.setattr(slurmjob, "own_program", lambda: "/opt/tb/bin/testbed")
    job = {"SLURMD_NODENAME": "gpu08", "SLURM_JOB_ID": "42", "TESTBED_STATE_DIR": "/tmp/st"}
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert not guard_here("slm", job) and started == []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert not guard_here("slm", {}) and not guard_here("slm", {**job, "SLURMD_NODENAME": "-x"})
    assert guard_here("slm", job)
    [argv] = started
    assert argv[:6] == ["srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu08"]
    assert f"--export={slurmstep.EXPORT},TESTBED_STATE_DIR" in argv
    assert argv[-2:] == ["guard", "slm"]
    assert argv[argv.index("--") + 1:argv.index("--") + 3] == ["/opt/tb/bin/testbed", "_host"]


def test_the_file_step_serves_what_the_run_copies(tmp_path):
    d = tmp_path / "run"
    reqs = [{"op": "mkdir", "path": str(d)},
            {"op": "put", "path": f"{d}/a.jsonl", "data": "aGVsbG8="},
            {"op": "list", "path": str(d)},
            {"op": "read", "path": f"{d}/a.jsonl", "offset": 2},
            {"op": "stat", "path": f"{d}/missing"},
            {"op": "read", "path": "relative"},
            {"op": "read", "path": f"{d}/../x"},
            "not an object"]
    out = io.BytesIO()  # the protocol's lines are bytes (testbed.common.lines)
    assert slurmfiles.serve(io.BytesIO("".join(json.dumps(r) + "\n" for r in reqs).encode()), out) == 0
    got = [json.loads(line) for line in out.getvalue().splitlines()]
    assert got[0] == {} and got[1] == {} and (d / "a.jsonl").read_bytes() == b"hello"
    assert [e[0] for e in got[2]["entries"]] == ["a.jsonl"] and got[2]["entries"][0][2] == 5
    assert got[3] == {"data": "bGxv"}
    assert got[4]["errno"] == 2
    assert all("error" in g for g in got[5:])
    assert oct((d / "a.jsonl").stat().st_mode & 0o777) == "0o600"


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          env={**e, **env}, timeout=120)


def test_the_cli_outside_a_job_says_so_in_one_line(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text(json.dumps(TOPO))
    r = _cli("validate", str(f), "--hosts", "slurm", env={})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[0] == ("error: --hosts slurm: this is not inside a Slurm job "
                                        "(no SLURM_JOB_ID / SLURM_JOB_NODELIST)")
    r = _cli("up", str(f), "--hosts", "ssh", env={})
    assert r.returncode == 2 and "--hosts takes slurm" in r.stderr and "Traceback" not in r.stderr


def test_hosts_sources_are_a_registry_and_slurms_guards_only_a_part_on_this_node(monkeypatch):
    """`up --hosts SOURCE` asks :mod:`testbed.hosts.sources`, never which source it is: slurm's
    module fills the hosts and, once up, guards this node's part only when the topology has one
    (a topology whose nodes are all on other nodes of the job leaves nothing here)."""
    from testbed.hosts import sources
    from testbed.model.topology import load_topology_dict

    assert sources.names() == ["slurm"] and sources.source("ssh") is None
    slurm = sources.source("slurm")
    assert slurm is slurmjob and slurm.assign_hosts(["not", "a", "mapping"]) == ["not", "a", "mapping"]
    guarded: list[str] = []
    monkeypatch.setattr(slurmjob, "guard_here", lambda name, env=None: guarded.append(name) or True)
    slurm.after_up("slm", load_topology_dict(assign(TOPO, 42, ["n1", "n2"], ADDRS, None, "testbed")))
    assert guarded == []  # every node of the topology on a node of the job other than this one
    slurm.after_up("slm", load_topology_dict(assign(TOPO, 42, ["n1", "n2"], ADDRS, "n1", "testbed")))
    assert guarded == ["slm"]  # a batch script on n1: s1 and w0 are built here
