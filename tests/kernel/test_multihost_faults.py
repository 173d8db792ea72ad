"""Hosts that fail under a multi-host testbed: one that stops answering (its underlay port
taken down: packets vanish, no reset) during `up`, a run and `down`; one whose testbed
version changed between `up` and `run`; a share left half-built when the controller and the
host's agent both died. Each ends in a clear error naming the host, leaves nothing on the
hosts that answer, and a later `down` (once the host is back) finishes the job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .conftest import cli, cli_json, kernel_snapshot
from tests.helpers import finish

pytest.importorskip("paramiko")
if shutil.which("sshd") is None and not os.path.exists("/usr/sbin/sshd"):
    pytest.skip("no sshd (apt-get install openssh-server): the multi-host tests need real SSH servers",
                allow_module_level=True)


QUICK = {"TESTBED_HOST_TIMEOUT": "6"}  # give up on a silent host after 6 s (default 30)


def _topology(lab, name: str, h1_testbed: str) -> dict:
    """w0 behind s1 on h1, w1 behind s0 here, w2 behind s2 on h2; s0-s1 (the bottleneck) and
    s0-s2 cross hosts."""
    hosts = lab.host_specs()
    hosts[0]["testbed"] = h1_testbed
    return {"name": name, "hosts": hosts,
            "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch", "host": "h1"},
                      "s2": {"kind": "switch", "host": "h2"},
                      "w0": {"kind": "worker"}, "w1": {"kind": "worker"}, "w2": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s1"]}, {"endpoints": ["w1", "s0"]}, {"endpoints": ["w2", "s2"]},
                      {"endpoints": ["s0", "s1"], "rate": "1gbit", "bottleneck": True},
                      {"endpoints": ["s0", "s2"], "rate": "1gbit"}]}


def _write(tmp_path, topo: dict):
    p = tmp_path / f"{topo['name']}.yaml"
    p.write_text(yaml.safe_dump(topo))
    return p


def _background(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **QUICK})


def _wait_for(path, p: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if p.poll() is not None or time.monotonic() > deadline:
            out, err = p.communicate() if p.poll() is not None else ("", "still running")
            raise AssertionError(f"{path.name} never appeared: {out}{err}")
        time.sleep(0.05)


def _nothing_here(name: str) -> None:
    assert not [ns for ns in kernel_snapshot()["netns"] if ns == name or ns.startswith(name + ".")]


def test_a_host_that_stops_answering_during_up_is_named_and_a_later_down_finishes(clean_lab, tmp_path):
    lab = clean_lab
    h1 = lab.hosts[0]
    topo = _write(tmp_path, _topology(lab, "fu", h1.wrapper(pause="apply", seconds=2)))
    p = _background("up", str(topo))
    try:
        _wait_for(h1.dir / "paused-apply", p)
        h1.cut()  # h1 goes silent while it builds its share
        err, took = finish(p, 120)
        assert p.returncode == 1 and "Traceback" not in err, err
        assert "host h1" in err and "stopped answering" in err and "testbed down fu" in err, err
        assert took < 60, took
        _nothing_here("fu")  # this host's share and h2's were removed; h1's is recorded for down
        assert "h2" not in lab.leftovers()
        assert "fu" in [t["name"] for t in cli_json("status")["testbeds"]]
    finally:
        h1.cut(False)
        r = cli("down", "fu", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert cli_json("status")["testbeds"] == []


def test_a_host_that_stops_answering_during_a_run_ends_it_naming_the_host(clean_lab, tmp_path):
    lab = clean_lab
    h1 = lab.hosts[0]
    topo = _write(tmp_path, _topology(lab, "fr", h1.wrapper()))
    runs = tmp_path / "runs"
    cli_json("up", str(topo))
    try:
        p = _background("run", "allreduce", "--testbed", "fr", "--bw", "500mbit", "--out", str(runs),
                        "--max-iters", "100000", "--json")
        deadline = time.monotonic() + 120
        while not any(f.stat().st_size for f in runs.glob("*/rank0.jsonl")):  # rank 0 (h1) iterates
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.3)
        h1.cut()
        t0 = time.monotonic()
        out, err = p.communicate(timeout=180)
        took = time.monotonic() - t0
        assert p.returncode == 1 and out.strip(), out + err
        msg = json.loads(out)["error"]
        assert "host h1" in msg and ("stopped answering" in msg or "lost the connection" in msg), msg
        assert took < 90, took
        # the rank here was stopped, and this host's shaping restored
        assert subprocess.run(["ip", "netns", "pids", "fr.w1"], capture_output=True, text=True).stdout.split() == []
        summary = json.loads(next(runs.glob("*/summary.json")).read_text())
        assert summary["status"] == "failed" and "host h1" in summary["error"], summary
    finally:
        h1.cut(False)
        r = cli("down", "fr", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr


def test_a_host_that_stops_answering_during_down_is_named_and_down_again_finishes(clean_lab, tmp_path):
    lab = clean_lab
    h1 = lab.hosts[0]
    topo = _write(tmp_path, _topology(lab, "fd", h1.wrapper(pause="down", seconds=2)))
    cli_json("up", str(topo))
    p = _background("down", "fd")
    _wait_for(h1.dir / "paused-down", p)
    h1.cut()
    err, took = finish(p, 120)
    assert p.returncode != 0 and "Traceback" not in err, err
    assert "host h1" in err and "testbed down fd" in err, err
    assert took < 60, took
    _nothing_here("fd")
    assert "h2" not in lab.leftovers()
    h1.cut(False)
    r = cli("down", "fd", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert cli_json("status")["testbeds"] == []


def test_a_host_whose_testbed_changed_version_since_up_is_refused_before_the_run(clean_lab, tmp_path):
    lab = clean_lab
    h1 = lab.hosts[0]
    topo = _write(tmp_path, _topology(lab, "fv", h1.wrapper()))
    cli_json("up", str(topo))
    try:
        h1.wrapper(version="9.9.9")  # upgraded behind the testbed's back
        r = cli("run", "allreduce", "--testbed", "fv", "--out", str(tmp_path / "runs"), "--max-iters", "2")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "host h1" in r.stderr and "9.9.9" in r.stderr and "install the same version" in r.stderr, r.stderr
        assert h1.in_mounts("ip", "netns", "pids", "fv.w0").stdout.split() == []  # no rank was started there
    finally:
        r = cli("down", "fv")  # down works across versions: it only reads the host's own ledger
        assert r.returncode == 0, r.stdout + r.stderr


def _agents_faulting() -> list[int]:
    """The pids of the host agents still running with TESTBED_FAULT_STEP set (h1's, until it
    kills itself at that step; a killed one is a zombie, whose environment reads empty)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if (d.name.isdigit() and b"TESTBED_FAULT_STEP=" in (d / "environ").read_bytes()
                    and b"\0_host\0" in (d / "cmdline").read_bytes()):
                pids.append(int(d.name))
        except OSError:  # gone meanwhile
            pass
    return pids


def test_a_half_built_share_after_the_controller_and_the_hosts_agent_died(clean_lab, tmp_path):
    """The controller is SIGKILLed while the hosts build, and h1's agent is SIGKILLed halfway
    through its share (its ledger lists part of it); h1 is silent meanwhile. Once h1 is back,
    `down --all` here removes every host's share."""
    lab = clean_lab
    h1 = lab.hosts[0]
    topo = _write(tmp_path, _topology(lab, "fh", h1.wrapper(pause="apply", seconds=1, env="TESTBED_FAULT_STEP=3")))
    p = _background("up", str(topo))
    _wait_for(h1.dir / "paused-apply", p)
    h1.cut()
    p.kill()  # the controller dies while h1 builds, unheard
    p.communicate()
    # h1's agent kills itself at its step 3: a half-built share, its ledger and the link
    # exporter it started before its first step (and announced in its target file)
    deadline = time.monotonic() + 30
    while _agents_faulting() or not (h1.ledgers() == ["fh", "targets/testbed-fh.json"] and h1.namespaces()):
        assert time.monotonic() < deadline, (_agents_faulting(), h1.ledgers(), h1.namespaces())
        time.sleep(0.2)
    r = cli("down", "--all", "--json", env=QUICK, timeout=120)
    assert r.returncode == 1 and "host h1" in json.loads(r.stdout)["error"], r.stdout + r.stderr
    assert "h2" not in lab.leftovers()
    h1.cut(False)
    r = cli("down", "--all", "--json", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert lab.leftovers() == {}
    exporters = subprocess.run(["pgrep", "-f", "-m collectors --testbed fh "], capture_output=True, text=True)
    assert exporters.stdout == "", "an exporter of fh (the controller's or h1's) survived down --all"


def _why_is_asked_where_the_node_lives() -> None:
    """A failed run asks why a rank's node stopped on the node's own host: w0's container
    runs on h1, in h1's namespace fc.w0, which this machine does not have (Docker's health
    asked here would call the container restarted into a new namespace); h1's agent, asked
    about a node that is not on h1, says so."""
    from testbed.engine.core import Testbed

    tb = Testbed.attach("fc")
    try:
        assert tb.why_stopped("w0") is None and tb.why_stopped("w1") is None
        wrong = tb.site("h1").why_stopped(tb.node("w1"))
        assert wrong.startswith("its host h1 did not say why") and "node w1 is on host" in wrong, wrong
    finally:
        tb.close()


def test_container_workers_on_another_host_carry_that_hosts_state_and_survive_a_lost_ledger(clean_lab, tmp_path):
    """A container worker on h1 is labelled with h1's own state directory (not the
    controller's), so a lost-ledger `down --all` typed on h1 finds and removes it."""
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.images.get("testbed/worker:cpu")
    except Exception as e:  # no engine, or no image: `testbed image build` makes it
        pytest.skip(f"needs a Docker engine with testbed/worker:cpu: {e}")
    lab = clean_lab
    h1 = lab.hosts[0]
    alt = "/run/testbed/h1state"  # the lab's hosts share this machine's engine: a state path of h1's own
    topo = _topology(lab, "fc", h1.wrapper(env=f"TESTBED_STATE_DIR={alt}"))
    topo["nodes"]["w0"].update(backend="docker", image="testbed/worker:cpu")
    path = _write(tmp_path, topo)
    try:
        up = cli_json("up", str(path))
        [c] = client.containers.list(all=True, filters={"label": "testbed=fc"})
        assert c.labels["testbed.state"] == alt and c.labels["testbed.node"] == "w0", c.labels
        w1 = next(n["address"] for n in up["nodes"] if n["name"] == "w1")
        r = cli("exec", "--testbed", "fc", "w0", "--", "ping", "-c1", "-W2", w1)  # across the VXLAN link
        assert r.returncode == 0, r.stdout + r.stderr
        _why_is_asked_where_the_node_lives()
        h1.in_mounts("rm", "-rf", f"{alt}/fc")  # h1 lost its ledger
        real = str(Path(sys.executable).parent / "testbed")
        r = h1.in_mounts("env", f"TESTBED_STATE_DIR={alt}", real, "down", "--all", "--json")
        assert r.returncode == 0 and "fc" in json.loads(r.stdout)["removed"], r.stdout + r.stderr
        assert client.containers.list(all=True, filters={"label": "testbed=fc"}) == []
    finally:
        cli("down", "fc", timeout=120)
        h1.in_mounts("rm", "-rf", alt)
        assert client.containers.list(all=True, filters={"label": "testbed=fc"}) == []
