"""Container workers on a real Docker engine: wiring, shaping, runs, failures, crash recovery.

Needs a running engine (`.ci/run` starts dockerd) and builds `testbed/worker:cpu` offline
once per session (cached by content). The FORWARD DROP policy dockerd installs is in force
the whole time (the forward_drop fixture makes it): the switches live in the testbed's
private namespace, so it must not matter.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from testbed.engine.core import FAULT_ENV
from tests.helpers import dumbbell, iperf3
from tests.kernel.conftest import cli, cli_json, run

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--max-iters", "12", "--eval-every", "6", "--target-acc", "0.3"]


@pytest.fixture(scope="session")
def engine():
    docker = pytest.importorskip("docker", reason="docker SDK not installed")
    try:
        dc = docker.from_env(timeout=30)
        dc.ping()
    except docker.errors.DockerException as e:
        pytest.skip(f"no Docker engine reachable ({e}); `.ci/run` starts dockerd")
    from testbed.nodes.images import DEFAULT_TAG, build

    res = build(DEFAULT_TAG)  # cached by content: seconds when nothing changed
    print(f"worker image {res['tag']} {'cached' if res['cached'] else 'built'} in {res['seconds']:.0f} s")
    yield dc
    dc.close()


@pytest.fixture
def docker_clean(engine, clean_kernel):
    """clean_kernel, plus: no container labelled with this test's state dir is left."""
    yield clean_kernel
    label = f"testbed.state={clean_kernel['state_dir']}"
    left = engine.containers.list(all=True, filters={"label": label})
    for c in left:
        c.remove(force=True)
    assert not left, f"containers left behind: {[c.name for c in left]}"


def _docker_dumbbell(name: str, rate: str = "100mbit") -> dict:
    d = dumbbell(name, rate=rate)
    d["defaults"] = {"backend": "docker", "sysctls": {"net.ipv4.tcp_congestion_control": "reno"}}
    return d


def _write(tmp_path: Path, d: dict) -> Path:
    p = tmp_path / f"{d['name']}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _containers(engine, name: str) -> list:
    return engine.containers.list(all=True, filters={"label": f"testbed={name}"})


@pytest.fixture(scope="module", autouse=True)
def forward_drop():
    """What dockerd does to a host when it turns ip_forward on itself: FORWARD policy DROP.
    Made here for this module, not assumed (an engine started where ip_forward was already
    on leaves ACCEPT), so every test below meets the strict case; the policy from before is
    put back after."""
    r = run(["iptables", "-S", "FORWARD"])
    if r.returncode != 0:
        yield None  # no iptables here: nothing can drop forwarded packets either
        return
    before = "DROP" if "-P FORWARD DROP" in r.stdout else "ACCEPT"
    run(["iptables", "-P", "FORWARD", "DROP"])
    try:
        yield before
    finally:
        run(["iptables", "-P", "FORWARD", before])


def test_three_switch_with_container_workers_all_pairs_ping(docker_clean, engine, tmp_path):
    d = yaml.safe_load((ROOT / "topologies" / "three_switch.yaml").read_text())
    d["name"] = "c3s"
    d.setdefault("defaults", {})["backend"] = "docker"
    topo = _write(tmp_path, d)
    up = cli_json("up", str(topo), "--no-exporter")
    try:
        workers = [n for n in up["nodes"] if n["kind"] == "worker"]
        assert len(workers) == 8 and all(n["backend"] == "docker" for n in workers)
        cs = {c.labels["testbed.node"]: c for c in _containers(engine, "c3s")}
        assert set(cs) == {n["name"] for n in workers}
        for c in cs.values():
            assert c.attrs["HostConfig"]["NetworkMode"] == "none" and c.status == "running"
            assert c.attrs["HostConfig"]["ShmSize"] == 2**30
        # inside a container: its own hostname, the image's Debian, eth0 shaped by the plan
        r = cli("exec", "w3", "--", "sh", "-c", "hostname; cat /etc/debian_version; ip -o -4 addr show eth0")
        assert r.returncode == 0, r.stderr
        host, deb, addr = r.stdout.splitlines()
        assert host == "w3" and deb.startswith("12") and next(n["address"] for n in workers if n["name"] == "w3") in addr
        assert "htb" in run(["tc", "-n", "c3s.w3", "qdisc", "show", "dev", "eth0"]).stdout
        failed = []
        lock = threading.Lock()

        def ping_all(src):
            for dst in workers:
                if dst["name"] != src["name"]:
                    r = cli("exec", src["name"], "--", "ping", "-c1", "-W3", dst["address"])
                    if r.returncode != 0:
                        with lock:
                            failed.append((src["name"], dst["name"], r.stdout[-200:] + r.stderr[-200:]))

        threads = [threading.Thread(target=ping_all, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failed, failed
        assert len(list(itertools.permutations(workers, 2))) == 56
    finally:
        assert cli_json("down", "c3s") == {"removed": ["c3s"]}
    assert _containers(engine, "c3s") == []


@pytest.mark.parametrize("rate, mbps", [("100mbit", 100), ("1gbit", 1000)])
def test_container_to_container_goodput_follows_the_shaped_rate(docker_clean, tmp_path, rate, mbps):
    from testbed import Testbed, load_topology_dict

    with Testbed.up(load_topology_dict(_docker_dumbbell(f"cg{mbps}", rate))) as tb:
        ratios = []
        # CPU noise on a 2-core machine can only lower goodput (1 Gbit: 0.83-0.96 seen for
        # netns and containers alike), so up to three tries; none may exceed the rate
        while len(ratios) < 3 and (not ratios or max(ratios) < 0.90):
            res = iperf3(tb, 4, "-O", "1")  # iperf3 of the image, inside the containers
            ratios.append(res["end"]["sum_received"]["bits_per_second"] / 1e6 / mbps)
        print(f"docker dumbbell {rate}: goodput/rate {', '.join(f'{r:.3f}' for r in ratios)}")
        assert 0.90 <= max(ratios) and max(ratios) <= 1.0


def test_mixed_netns_and_container_workers_train_across_the_bottleneck(docker_clean, tmp_path):
    """One rank in a namespace and one in a container; tc counters prove the path."""
    d = dumbbell("mixr", rate="1gbit")
    d["nodes"]["w1"]["backend"] = "docker"
    topo = _write(tmp_path, d)
    runs = tmp_path / "runs"
    cli_json("up", str(topo), "--no-exporter")
    try:
        for scheme in ("allreduce",):
            s = cli_json("run", scheme, "--testbed", "mixr", "--bw", "200mbit", "--out", str(runs), *SHORT,
                         "--no-exporter")
            assert s["status"] == "ok" and s["world_size"] == 2 and s["iterations"] == 12
            assert s["bottleneck"]["bytes"] >= 2 * s["mean_payload_bytes"] * s["iterations"]
            d = Path(s["run_dir"])
            # rank 1 ran in the container and wrote straight into the host's run directory
            assert (d / "rank1.jsonl").read_text().count("\n") == 12
    finally:
        cli_json("down", "mixr")


def test_runs_across_containers_and_a_killed_container_names_its_rank(docker_clean, engine, tmp_path):
    topo = _write(tmp_path, _docker_dumbbell("cr", "1gbit"))
    runs = tmp_path / "runs"
    for scheme in ("allreduce", "pactrain"):
        s = cli_json("run", scheme, "--topology", str(topo), "--bw", "200mbit", "--out", str(runs), *SHORT)
        assert s["status"] == "ok" and s["iterations"] == 12 and s["scheme"] == scheme
        # the tc counters of the shaped bottleneck carried every collective byte, both ways
        assert s["bottleneck"]["bytes"] >= 2 * s["mean_payload_bytes"] * s["iterations"]
        assert _containers(engine, "cr") == []  # the run brought the testbed up, and took it down
    # now a long run, and its rank-1 container killed under it
    before = set(runs.glob("*/rank1.jsonl"))
    p = subprocess.Popen([*cli_argv(), "run", "allreduce", "--topology", str(topo), "--out", str(runs),
                          "--max-iters", "100000", "--eval-every", "100000"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        rank1 = None
        while time.monotonic() < deadline:
            new = [x for x in runs.glob("*/rank1.jsonl") if x not in before and x.stat().st_size > 0]
            if new:
                rank1 = new[0]
                break
            time.sleep(0.2)
        assert rank1 is not None, "the run never started training"
        engine.containers.get("testbed-cr.w1").kill()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1
    assert "rank 1 (node w1) was killed by signal 9" in err and "container testbed-cr.w1 is exited" in err, err
    assert "Traceback" not in err
    assert _containers(engine, "cr") == []


def cli_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "testbed.cli"]


# the docker dumbbell's plan: 0 fabric netns, 1-2 bridges, 3 StartContainer w0, 4 sysctl, 5 veth, 6 addr,
# 7-8 shapes, 9 StartContainer w1, ...; len(plan) starts the exporter
@pytest.mark.parametrize("step", [3, 4, 9, 12, "exporter"])
def test_kill9_during_up_then_down_all_leaves_no_container(docker_clean, engine, tmp_path, step):
    topo = _write(tmp_path, _docker_dumbbell("ck"))
    if step == "exporter":
        step = len(cli_json("up", str(topo), "--dry-run")["actions"])
    r = cli("up", str(topo), env={FAULT_ENV: str(step)})
    assert r.returncode == -signal.SIGKILL
    if step > 3:
        assert _containers(engine, "ck"), "the crash should have left a container for down to find"
    assert cli_json("down", "--all")["removed"] == ["ck"]
    assert _containers(engine, "ck") == []


def test_a_lost_ledger_is_recovered_from_container_labels(docker_clean, engine, tmp_path):
    topo = _write(tmp_path, _docker_dumbbell("cl"))
    r = cli("up", str(topo), env={FAULT_ENV: "10"})
    assert r.returncode == -signal.SIGKILL and len(_containers(engine, "cl")) == 2
    state = Path(os.environ["TESTBED_STATE_DIR"])
    for f in (state / "cl").iterdir():
        f.unlink()
    (state / "cl").rmdir()
    assert "cl" in cli_json("down", "--all")["removed"]
    assert _containers(engine, "cl") == []


def test_missing_image_is_refused_before_anything_is_made(docker_clean, tmp_path):
    d = _docker_dumbbell("ci")
    d["defaults"]["image"] = "testbed/no-such-image:1"
    r = cli("up", str(_write(tmp_path, d)))
    assert r.returncode == 1 and "testbed/no-such-image:1" in r.stderr and "testbed image build" in r.stderr
    assert "Traceback" not in r.stderr


def _sleep_started(pid: int) -> bool:
    """Whether ``pid``, or a child of it, is a ``sleep`` now."""
    from testbed.common.procs import parent_of

    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (int(d.name) == pid or parent_of(int(d.name)) == pid):
            try:
                if (d / "comm").read_text().strip() == "sleep":
                    return True
            except OSError:  # gone meanwhile
                pass
    return False


def test_node_interface_put_get_and_stop_on_namespace_and_container_workers(docker_clean, tmp_path):
    """The parts of the backend interface runs do not need on one host (files cross by
    mounts there), used by backends without a shared file system."""
    from testbed import Testbed, load_topology_dict

    d = dumbbell("nif")
    d["nodes"]["w1"]["backend"] = "docker"
    src = tmp_path / "in.txt"
    src.write_text("payload\n")
    with Testbed.up(load_topology_dict(d)) as tb:
        for node in ("w0", "w1"):
            info, be = tb.node(node), tb.backend(node)
            be.put(info, src, f"/tmp/put-{node}.txt")
            be.get(info, f"/tmp/put-{node}.txt", tmp_path / f"back-{node}.txt")
            assert (tmp_path / f"back-{node}.txt").read_text() == "payload\n"
            p = tb.spawn(node, ["sleep", "300"])
            deadline = time.monotonic() + 30
            while not _sleep_started(p.pid):  # exec'd in the node (a container's: in a child of nsexec)
                assert p.poll() is None and time.monotonic() < deadline, "sleep never started in the node"
                time.sleep(0.05)
            assert p.poll() is None
            be.stop(info)
            assert p.wait(timeout=10) != 0
        # stopping a container's processes leaves the container itself running
        assert tb.exec("w1", ["true"]).returncode == 0
        (Path("/tmp") / "put-w0.txt").unlink()


def test_your_own_script_and_module_run_in_container_workers(docker_clean, tmp_path):
    """`run --script` / `-m` on container workers: the code's directory is mounted, so the
    script imports its sibling module; the proof passes and the records make the summary."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "sib.py").write_text("STEPS_SEEN = []\n")
    (code / "train.py").write_text("import sib  # a sibling module, found as python FILE finds it\n"
                                   + (ROOT / "examples" / "ddp_digits.py").read_text())
    topo = _write(tmp_path, _docker_dumbbell("uc", "1gbit"))
    runs = tmp_path / "runs"
    assert cli("up", str(topo)).returncode == 0
    try:
        s = cli_json("run", "--script", str(code / "train.py"), "-t", "uc", "--bw", "200mbit", "--out", str(runs),
                     "40")
        r = subprocess.run([*cli_argv(), "run", "-m", "train", "-t", "uc", "--out", str(runs), "--json", "20"],
                           cwd=code, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        m = json.loads(r.stdout)
    finally:
        cli("down", "uc")
    assert s["status"] == "ok" and s["proof"] == "passed" and s["iterations"] == 40, s
    assert s["final_accuracy"] > 0.5 and all(b > 0 for b in s["rank_tx_bytes"].values()), s
    assert (m["scheme"], m["proof"], m["iterations"]) == ("module:train", "passed", 20), m
