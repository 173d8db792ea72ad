"""Rootless mode, with real users this test makes (useradd): no sudo, no capabilities.

Each user's commands run through ``runuser`` with a clean environment, the same venv's
``testbed`` and their own home. What must hold: the main job trains across shaped links;
goodput across a 100mbit bottleneck; two users (and root) with testbeds of the same name
do not see or touch each other's; ``down`` and ``kill -9`` (of the holder, of ``up``, of
``run``) leave no process, namespace or file; what needs root is refused in one line.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import dumbbell, star, user_processes, user_processes_left

from .conftest import cli, kernel_snapshot

USERS = ("tbrootless1", "tbrootless2")
TESTBED = str(Path(sys.executable).with_name("testbed"))
THREE_SWITCH = Path(__file__).resolve().parents[2] / "topologies" / "three_switch.yaml"


def _readable_by_others(path: str) -> bool:
    """Every directory on the way to ``path`` lets others in (the venv's python, e.g. not under /root)."""
    p = Path(os.path.realpath(path))
    return all(os.stat(d).st_mode & 0o001 for d in [*reversed(p.parents)]) and os.stat(p).st_mode & 0o005


@pytest.fixture(scope="module")
def users():
    if shutil.which("runuser") is None or shutil.which("useradd") is None:
        pytest.skip("runuser/useradd missing: cannot act as an ordinary user here")
    import testbed

    for path in (sys.executable, testbed.__file__):
        if not _readable_by_others(path):
            pytest.skip(f"{os.path.realpath(path)} is not reachable by other users (make the venv from a system "
                        "python, as .ci/run does, in a checkout others may read)")
    made = []
    for u in USERS:
        try:
            pwd.getpwnam(u)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", u], check=True)
            made.append(u)
    yield {u: Path(pwd.getpwnam(u).pw_dir) for u in USERS}
    for u in USERS:
        _kill_all(u)
    for u in made:
        subprocess.run(["userdel", "--remove", u], capture_output=True)


def as_user(user: str, *args: str, timeout: float = 300, popen: bool = False):
    """``testbed ARGS`` as ``user``: no shell, a clean environment, their home as working directory."""
    home = pwd.getpwnam(user).pw_dir
    argv = ["runuser", "-u", user, "--", "env", "-i", f"HOME={home}", f"USER={user}", "LANG=C.UTF-8",
            f"PATH={Path(TESTBED).parent}:/usr/sbin:/usr/bin:/sbin:/bin", TESTBED, *args]
    if popen:
        return subprocess.Popen(argv, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, cwd=home, capture_output=True, text=True, timeout=timeout)


def _kill_all(user: str) -> None:
    subprocess.run(["pkill", "-9", "-u", user], capture_output=True)


def _await_nothing_left(user: str, home: Path, timeout: float = 30.0) -> None:
    left = user_processes_left(user, timeout)
    assert not left, left
    base = home / ".local" / "state" / "testbed"
    left = sorted(p.name for p in (base / "ns").iterdir()) if (base / "ns").exists() else []
    assert left == [], f"files left on the host side of {base / 'ns'}: {left}"  # the tmpfs went with the holder


def _write(home: Path, user: str, name: str, doc: dict) -> str:
    path = home / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    shutil.chown(path, user)
    return str(path)


def _ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _goodput(user: str, name: str, server: str, client: str, address: str) -> float:
    srv = as_user(user, "exec", "-t", name, server, "--", "iperf3", "-s", "-1", popen=True)
    try:
        for _ in range(50):
            r = as_user(user, "exec", "-t", name, client, "--", "iperf3", "-c", address, "-t", "3", "-J")
            try:
                return json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"]
            except (ValueError, KeyError):
                time.sleep(0.2)  # the server is not listening yet (iperf3 -J: an "error", maybe exit 0)
        raise AssertionError(r.stdout + r.stderr)
    finally:
        srv.kill()
        srv.wait()


def test_a_user_builds_shapes_measures_and_takes_down_three_switch(users):
    user, home = USERS[0], users[USERS[0]]
    before = kernel_snapshot()
    up = json.loads(_ok(as_user(user, "up", str(THREE_SWITCH), "--json")).stdout)
    try:
        nodes = {n["name"]: n for n in up["nodes"]}
        _ok(as_user(user, "link", "set", "-t", "three_switch", "--bottleneck", "--bw", "100mbit"))
        g = _goodput(user, "three_switch", "w4", "w0", nodes["w4"]["address"].split("/")[0])  # s1 -> s0 -> s2
        print(f"rootless goodput across the 100mbit bottleneck: {g / 1e6:.1f} Mbit/s")
        assert 0.93 * 100e6 <= g <= 1.0 * 100e6, g
        assert kernel_snapshot() == before  # root's view: none of it is in the host's namespaces
    finally:
        r = as_user(user, "down", "three_switch")
    _ok(r)
    _await_nothing_left(user, home)


README_EXAMPLE = """
import time

from testbed import Testbed, load_topology

with Testbed.up(load_topology({topo!r})) as tb:
    server = tb.spawn("w4", ["iperf3", "-s", "-1"])
    time.sleep(1)  # the server listens
    tb.exec("w0", ["iperf3", "-c", tb.address("w4"), "-t", "2"])
print("done")
"""
"""The README's example (a 2 s test instead of iperf3's default 10)."""


def test_the_readmes_python_example_and_validate_work_as_a_user(users):
    """Issue 57: the library entered no rootless namespaces itself, so the README's example
    (and `testbed validate`, which checks as `up` would) failed for an ordinary user with
    "building a testbed needs root"; it now enters them, and leaves nothing when it ends."""
    user, home = USERS[0], users[USERS[0]]
    before = kernel_snapshot()
    python = str(Path(TESTBED).with_name("python"))
    r = subprocess.run(["runuser", "-u", user, "--", "env", "-i", f"HOME={home}", f"USER={user}", "LANG=C.UTF-8",
                        f"PATH={Path(TESTBED).parent}:/usr/sbin:/usr/bin:/sbin:/bin", python, "-c",
                        README_EXAMPLE.format(topo=str(THREE_SWITCH))], cwd=home, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "receiver" in r.stdout, r.stdout + r.stderr  # iperf3's client report
    _ok(as_user(user, "validate", str(THREE_SWITCH)))
    assert kernel_snapshot() == before
    _await_nothing_left(user, home)


def test_the_main_job_trains_rootless_with_the_bottleneck_proof(users, tmp_path):
    user, home = USERS[0], users[USERS[0]]
    r = as_user(user, "run", "pactrain", "--bw", "100mbit", "--max-iters", "12", "--eval-every", "6",
                "--out", str(home / "runs"), "--json", timeout=600)
    _ok(r)
    summary = json.loads(r.stdout)
    assert summary["iterations"] == 12 and summary["bw"] == "100mbit", summary
    assert summary["bottleneck"]["bytes"] > 0
    _await_nothing_left(user, home)


def test_two_users_and_root_each_have_their_own_testbed_of_the_same_name(users, clean_kernel, tmp_path):
    (a, home_a), (b, home_b) = users.items()
    doc = star(2, name="twin", rate="1gbit")
    root_topo = tmp_path / "twin.yaml"
    root_topo.write_text(yaml.safe_dump(doc))
    assert cli("up", str(root_topo)).returncode == 0
    try:
        _ok(as_user(a, "up", _write(home_a, a, "twin", doc)))
        _ok(as_user(b, "up", _write(home_b, b, "twin", doc)))
        for u in (a, b):
            listed = json.loads(_ok(as_user(u, "status", "--json")).stdout)["testbeds"]
            assert [t["name"] for t in listed] == ["twin"] and listed[0]["source"].startswith(str(users[u]))
            _ok(as_user(u, "exec", "-t", "twin", "w0", "--", "ping", "-c1", "-W2", "10.200.0.2"))
        _ok(as_user(b, "down", "twin"))  # b's only: a's and root's stay up and working
        _ok(as_user(a, "exec", "-t", "twin", "w0", "--", "ping", "-c1", "-W2", "10.200.0.2"))
        assert cli("exec", "-t", "twin", "w0", "--", "ping", "-c1", "-W2", "10.200.0.2").returncode == 0
        r = as_user(b, "down", "twin")
        assert "not up" in r.stdout + r.stderr
        _await_nothing_left(b, home_b)
        # a's holder, namespaces and state are a's: b can neither enter nor read them
        holder = (home_a / ".local/state/testbed/holder.pid").read_text().strip()
        r = subprocess.run(["runuser", "-u", b, "--", "nsenter", "-U", "-m", "-t", holder, "true"],
                           capture_output=True, text=True)
        assert r.returncode != 0, r.stdout + r.stderr
    finally:
        as_user(a, "down", "twin")
        as_user(b, "down", "twin")
        cli("down", "twin")
    _await_nothing_left(a, home_a)


def _holder(home: Path) -> int:
    return int((home / ".local/state/testbed/holder.pid").read_text())


def _holder_or_none(home: Path) -> int | None:
    try:
        return _holder(home)
    except (OSError, ValueError):
        return None


def _command(runuser: int) -> int:
    """The pid of the command runuser started (what a user's `kill` would name)."""
    for _ in range(100):
        for e in os.scandir("/proc"):
            if e.name.isdigit():
                try:
                    with open(f"{e.path}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == runuser:
                            return int(e.name)
                except (OSError, IndexError, ValueError):
                    continue
        time.sleep(0.05)
    raise AssertionError(f"runuser {runuser} started nothing")


def test_kill_9_of_the_holder_of_up_and_of_run_leaves_nothing(users):
    user, home = USERS[0], users[USERS[0]]
    # the holder, with a testbed up (exporter running): the kernel takes everything
    _ok(as_user(user, "up", _write(home, user, "k9", star(4, name="k9"))))
    os.kill(_holder(home), signal.SIGKILL)
    _await_nothing_left(user, home)
    assert json.loads(_ok(as_user(user, "status", "--json")).stdout)["testbeds"] == []
    _await_nothing_left(user, home)
    # `up` itself, half-way through 64 workers: its child inside is told and removes what it made
    up = as_user(user, "up", _write(home, user, "k9big", star(64, name="k9big")), popen=True)
    ledger = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # root looks into the holder's mount namespace for the ledger
        holder = _holder_or_none(home)
        if holder and (p := Path(f"/proc/{holder}/root{home}/.local/state/testbed/ns/state/k9big/ledger.jsonl")).exists():
            ledger = p
            if len(p.read_text().splitlines()) > 20:
                break
        time.sleep(0.02)
    assert ledger is not None, "up never started"
    os.kill(_command(up.pid), signal.SIGKILL)  # the `testbed` the user started (runuser's child)
    up.wait()
    _await_nothing_left(user, home, timeout=60)
    # `run` on its own testbed, mid-training
    out = home / "runs-k9"
    r = as_user(user, "run", "allreduce", "--max-iters", "100000", "--out", str(out), popen=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("*/rank0.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(out.glob("*/rank0.jsonl")), "training never started"
    os.kill(_command(r.pid), signal.SIGKILL)
    r.wait()
    _await_nothing_left(user, home, timeout=60)


def test_what_needs_root_is_refused_in_one_line(users, tmp_path):
    user, home = USERS[1], users[USERS[1]]
    docker = star(2, name="needsroot")
    docker["defaults"] = {"backend": "docker"}
    multi = {"name": "needsroot2", "hosts": [{"name": "h1", "address": "192.0.2.11"}],
             "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch", "host": "h1"}, "w0": {"kind": "worker"},
                       "w1": {"kind": "worker"}},
             "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s1"]},
                       {"endpoints": ["s1", "s0"], "type": "vxlan"}]}  # across hosts rootless: a tunnel, not VXLAN
    for doc, words in ((docker, "backend docker, which needs root"), (multi, "has type vxlan, which needs root")):
        r = as_user(user, "up", _write(home, user, doc["name"], doc))
        assert r.returncode == 1, r.stdout + r.stderr
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        assert lines[0].startswith("error: ") and words in lines[0] and "Traceback" not in r.stderr, r.stderr
        assert lines[1].strip().startswith("hint: ") and "root" in lines[1], r.stderr
        _await_nothing_left(user, home)
    # user namespaces refused (a chroot may not make them): one line, the way out, nothing made
    jail = tmp_path / "jail"
    jail.mkdir()
    subprocess.run(["mount", "--rbind", "/", str(jail)], check=True)
    try:
        r = subprocess.run(["chroot", str(jail), "runuser", "-u", user, "--", "env", "-i", f"HOME={home}",
                            f"PATH={Path(TESTBED).parent}:/usr/bin:/bin", TESTBED, "up",
                            str(home / "needsroot.yaml")], capture_output=True, text=True, cwd="/", timeout=120)
    finally:
        subprocess.run(["umount", "-R", str(jail)], check=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: cannot make a user namespace for rootless testbeds"), r.stderr
    assert "run as root" in r.stderr
    _await_nothing_left(user, home)


def _bottleneck_rate(user: str, name: str) -> str:
    shown = json.loads(_ok(as_user(user, "link", "show", "-t", name, "--json")).stdout)
    return {l["name"]: l["forward"]["shape"]["rate"] for l in shown["links"]}["s0-s1"]


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary (apt-get install prometheus)")
def test_replay_sweep_report_and_monitor_work_as_a_user(users):
    """The rest of the workflow, as an ordinary user: a Prometheus of their own (its history in
    their home), a trace replayed in the foreground and in the background, a run following a
    trace, a sweep on the running testbed, the report; then nothing left."""
    from .test_monitor import _free_ports, _query

    user, home = USERS[1], users[USERS[1]]
    (port,) = _free_ports(1)
    prom = f"http://127.0.0.1:{port}"
    trace = home / "steps.csv"
    trace.write_text("time_s,rate\n0,200mbit\n0.5,100mbit\n1,200mbit\n")
    shutil.chown(trace, user)
    _ok(as_user(user, "monitor", "up", "--listen", f"127.0.0.1:{port}"))
    try:
        _ok(as_user(user, "up", _write(home, user, "flow", dumbbell(name="flow", rate="1gbit"))))
        _ok(as_user(user, "link", "replay", "-t", "flow", "--bottleneck", str(trace), "--restore",
                    "--log", str(home / "r.jsonl")))
        steps = [json.loads(l) for l in (home / "r.jsonl").read_text().splitlines()]
        assert [s["rate"] for s in steps if s["event"] == "step"] == ["200mbit", "100mbit", "200mbit"], steps
        assert _bottleneck_rate(user, "flow") == "1gbit"  # --restore
        _ok(as_user(user, "link", "replay", "-t", "flow", "--bottleneck", str(trace), "--loop", "--background"))
        assert any("link replay" in p for p in user_processes(user))
        assert "stopped 1 background replay" in _ok(as_user(user, "link", "replay", "-t", "flow", "--stop")).stdout
        assert _bottleneck_rate(user, "flow") == "1gbit"  # put back
        assert not any("link replay" in p for p in user_processes(user))

        run = json.loads(_ok(as_user(user, "run", "allreduce", "-t", "flow", "--bw-trace", str(trace),
                                     "--max-iters", "4", "--out", str(home / "runs"), "--json")).stdout)
        assert run["iterations"] == 4 and run["bottleneck"]["bytes"] > 0, run
        login = {"Authorization": "Basic " + base64.b64encode(
            b"testbed:" + (home / ".local/state/testbed/metrics.token").read_bytes().strip()).decode()}
        iters = _query(prom, f'max(max_over_time(testbed_train_iterations_total{{run_id="{run["run_id"]}"}}[10m]))',
                       login)
        links = _query(prom, 'count(max_over_time(testbed_link_transmit_bytes_total{testbed="flow"}[10m]))', login)
        assert iters and float(iters[0]["value"][1]) == 4, iters  # the run's exporter reached the user's Prometheus
        assert links and float(links[0]["value"][1]) > 0, links

        _ok(as_user(user, "sweep", "-t", "flow", "--schemes", "allreduce,topk:0.1", "--bw", "100mbit",
                    "--pretrain-epochs", "0.05", "--max-iters", "3", "--eval-every", "3", "--out", str(home / "sw")))
        (sweep,) = (home / "sw").glob("sweep-*")
        _ok(as_user(user, "report", str(sweep)))
        rows = json.loads((sweep / "report" / "report.json").read_text())
        assert sorted(r["base_scheme"] for r in rows["rows"]) == ["allreduce", "topk"], rows
        assert (sweep / "report" / "tta.png").stat().st_uid == pwd.getpwnam(user).pw_uid
    finally:
        as_user(user, "down", "flow")
        r = as_user(user, "monitor", "down")
    _ok(r)
    assert (home / ".local/state/testbed/monitor/data").is_dir()  # the history outlives the holder
    _await_nothing_left(user, home)
