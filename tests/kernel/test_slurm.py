"""A testbed across the nodes of a Slurm job, on a real Slurm cluster made on this machine
(:mod:`tests.kernel.slurm_lab`: munged, slurmctld, one slurmd per namespace "node"): hosts
from the allocation (``testbed up --hosts slurm`` inside ``salloc -N 2``), every request to
the nodes a job step (``srun --overlap``), ranks started through Slurm, and ``scancel``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import environ_of, ordinary_user, user_processes_left
from tests.kernel import slurm_lab

pytestmark = [pytest.mark.kernel,
              pytest.mark.skipif(shutil.which("slurmctld") is None or shutil.which("munged") is None,
                                 reason="needs slurm-wlm and munge (apt-get install slurm-wlm munge)")]

TESTBED = str(Path(sys.executable).parent / "testbed")
TOPOLOGY = """\
name: slm
nodes:
  s1: {kind: switch, host: h1}
  s2: {kind: switch, host: h2}
  w0: {kind: worker}
  w1: {kind: worker}
links:
  - {endpoints: [w0, s1]}
  - {endpoints: [w1, s2]}
  - {endpoints: [s1, s2], rate: 100mbit, bottleneck: true}
"""


@pytest.fixture
def lab(clean_kernel):
    """Two idle Slurm nodes, removed (every job cancelled, daemons stopped) after the test.
    Its directory is one any user can read (its slurm.conf, munged's socket): pytest's are not."""
    root = Path(tempfile.mkdtemp(prefix="tbslurmlab-"))
    try:
        lab = slurm_lab.build(root, 2)
        try:
            yield lab
        finally:
            slurm_lab.destroy(lab)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _job(lab, tmp_path: Path, script: str, timeout: float = 420) -> subprocess.CompletedProcess:
    """``salloc -N 2`` running ``script`` (sh), from this (the controller's) namespace."""
    (tmp_path / "topo.yaml").write_text(TOPOLOGY)
    env = lab.env(TB=TESTBED, TOPO=str(tmp_path / "topo.yaml"), OUT=str(tmp_path / "runs"))
    return subprocess.run(["salloc", "-N", "2", "sh", "-c", script], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_a_run_across_two_slurm_nodes(lab, tmp_path):
    """up with the job's nodes as hosts, a short allreduce across both with the proof
    passing, then down: nothing left on either node or here."""
    r = _job(lab, tmp_path, 'set -e; "$TB" up "$TOPO" --hosts slurm > /dev/null; '
                            '"$TB" run allreduce -t slm --compute-time 0.05 --max-iters 3 --out "$OUT"; '
                            '"$TB" down slm')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = next((tmp_path / "runs").iterdir())
    hosts = {h["name"]: h["slurm"] for h in json.loads((run / "topology.json").read_text())["hosts"]}
    assert hosts == {"h1": "sn1", "h2": "sn2"}  # in SLURM_JOB_NODELIST's order
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok", summary
    assert summary["proof"] == "passed", summary
    assert (run / "rank1.jsonl").stat().st_size > 0  # written on sn2, copied back through a step
    assert lab.leftovers() == {}
    assert _stray_steps_left() == []


def test_a_batch_script_builds_its_own_nodes_share_itself(lab, tmp_path):
    """sbatch: the script runs on the job's first node, so the host that falls there is
    `local` (built by the controller itself, in that node) and the other is reached
    through a step; the run passes its proof and down leaves nothing on either node."""
    (tmp_path / "topo.yaml").write_text(TOPOLOGY)
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nset -e\n{TESTBED} up {tmp_path}/topo.yaml --hosts slurm > /dev/null\n"
                      f"{TESTBED} status slm --json > {tmp_path}/status.json\n"
                      f"{TESTBED} run allreduce -t slm --compute-time 0.05 --max-iters 3 --out {tmp_path}/runs\n"
                      f"{TESTBED} down slm\n")
    r = subprocess.run(["sbatch", "--wait", "-N", "2", "-o", str(tmp_path / "job.out"), str(script)],
                       capture_output=True, text=True, env=lab.env(), timeout=420)
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert r.returncode == 0, r.stderr + out[-3000:]
    hosts = {n["name"]: n["host"] for n in json.loads((tmp_path / "status.json").read_text())["nodes"]}
    assert hosts == {"w0": "local", "s1": "local", "w1": "h2", "s2": "h2"}
    summary = json.loads((next((tmp_path / "runs").iterdir()) / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["proof"] == "passed", summary
    assert lab.leftovers() == {}


@pytest.mark.parametrize("ended_by", ["scancel", "time limit"])
def test_a_batch_job_ended_by_slurm_removes_the_part_its_script_built_too(lab, tmp_path, ended_by):
    """sbatch as root, ended while the script runs a command in a node, by `scancel` or by
    its time limit (`--time 1`: slurmctld ends it within its 30 s check after the minute,
    SIGTERM to every step, SIGKILL KillWait later; its log says "DUE TO TIME LIMIT"): the
    part the script built itself on its own node (`local`: no step holds it) is removed by
    the step `up` started on that node (`_host guard`) on Slurm's SIGTERM, as the other
    node's share is by the step holding it: nothing is left on either node, no step
    survives. The testbed's record stays, as after `scancel` of an allocation (the other
    node's share cannot be asked once the job ended), and `testbed down` in a new
    allocation removes it."""
    (tmp_path / "topo.yaml").write_text(TOPOLOGY)
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nset -e\n{TESTBED} up {tmp_path}/topo.yaml --hosts slurm > /dev/null\n"
                      f"exec {TESTBED} exec w0 -- sleep 43" "43\n")
    log = tmp_path / "job.out"
    limit = ["--time", "1"] if ended_by == "time limit" else []
    r = subprocess.run(["sbatch", "--parsable", *limit, "-N", "2", "-o", str(log), str(script)],
                       capture_output=True, text=True, env=lab.env(), timeout=60)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    try:
        _until(lambda: bool(_pids("^sleep 4343")), 240)
        assert _pids("^sleep 4343"), log.read_text() if log.exists() else "the job never started"
        assert set(lab.leftovers()) == {"sn1", "sn2"}  # w0 and s1 on the script's node sn1
        if ended_by == "scancel":
            subprocess.run(["scancel", job], env=lab.env(), check=True)
        _until(lambda: not (lab.leftovers() or _stray_steps() or lab.jobs()), 60 if ended_by == "scancel" else 150)
        assert lab.leftovers() == {}, log.read_text()
        assert _stray_steps() == [] and _pids("^sleep 4343") == []
        assert ("DUE TO TIME LIMIT" in log.read_text()) == (ended_by == "time limit"), log.read_text()
        r = subprocess.run(["salloc", "-N", "2", TESTBED, "down", "slm"], capture_output=True, text=True,
                           env=lab.env(), timeout=300)
        assert r.returncode == 0 and "removed: slm" in r.stdout, r.stdout + r.stderr
    finally:
        subprocess.run(["scancel", job], env=lab.env(), check=False)
        for node in lab.nodes:  # on a failure above: what the job left on the nodes
            node.in_mounts(TESTBED, "down", "--all")
            node.in_mounts("env", "-u", "TESTBED_STATE_DIR", TESTBED, "down", "--all")


def test_scancel_removes_everything_on_the_nodes_and_a_new_job_the_record(lab, tmp_path):
    """A job cancelled while a command runs in a node: proctrack/cgroup ends it and every
    agent step, and the step that holds each node's share removes the share on Slurm's
    SIGTERM (its namespaces and ledger: as root they are no process). The controller's own
    record stays (it is not on a node): `testbed down` outside a job says why it cannot reach
    the nodes, and inside a new allocation of the same nodes removes the record."""
    job = _sleeping_job(lab, tmp_path, "4242")
    try:
        assert _stray_steps(), "no step of testbed on the nodes"
        assert set(lab.leftovers()) == {"sn1", "sn2"}
        ids = [line.split()[0] for line in lab.jobs()]
        subprocess.run(["scancel", *ids], env=lab.env(), check=True)
        _until(lambda: not (_pids("^sleep 4242") or _stray_steps()), 60)  # KillWait 5 s; 30 was short under load
        assert _pids("^sleep 4242") == [] and _stray_steps() == [], "processes survived scancel"
        _salloc_ends(job)
        assert lab.leftovers() == {}  # removed by each share's holding step before it exited
        r = subprocess.run([TESTBED, "down", "slm"], capture_output=True, text=True, env=lab.env())
        assert r.returncode == 1 and "has ended, so node sn1 cannot be reached" in r.stderr, r.stderr
        r = subprocess.run(["salloc", "-N", "2", TESTBED, "down", "slm"], capture_output=True, text=True,
                           env=lab.env(), timeout=300)
        assert r.returncode == 0, r.stderr
        assert lab.leftovers() == {}
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        for node in lab.nodes:  # on a failure above: what the shares left on the nodes
            node.in_mounts("env", "-u", "TESTBED_STATE_DIR", TESTBED, "down", "--all")


def test_a_node_set_down_ends_the_job_and_both_shares_go(lab, tmp_path):
    """A node of the job fails as Slurm sees it (`scontrol update State=DOWN`, what slurmctld
    does to a node that stops answering): the job is ended, every step of it gets Slurm's
    SIGTERM, and the steps holding the shares remove them on both nodes, the failed one's too
    while its slurmd can still act. (A node that really dies takes its processes with it; its
    kernel state goes with its reboot, and the surviving node's share goes as here.)"""
    job = _sleeping_job(lab, tmp_path, "4444")
    try:
        assert set(lab.leftovers()) == {"sn1", "sn2"}
        subprocess.run(["scontrol", "update", "NodeName=sn2", "State=DOWN", "Reason=testbed-node-failure"],
                       env=lab.env(), check=True)
        _until(lambda: not (lab.leftovers() or _stray_steps() or _pids("^sleep 4444")), 60)
        assert lab.leftovers() == {} and _stray_steps() == [] and _pids("^sleep 4444") == []
        _salloc_ends(job)
        _resume(lab, "sn2")
        r = subprocess.run(["salloc", "-N", "2", TESTBED, "down", "slm"], capture_output=True, text=True,
                           env=lab.env(), timeout=300)  # the record stays, as after scancel
        assert r.returncode == 0 and "removed: slm" in r.stdout, r.stdout + r.stderr
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        _resume(lab, "sn2")
        for node in lab.nodes:  # on a failure above: what the shares left on the nodes
            node.in_mounts("env", "-u", "TESTBED_STATE_DIR", TESTBED, "down", "--all")


def test_a_node_that_dies_ends_the_job_and_the_other_nodes_share_goes(lab, tmp_path):
    """A node of the job dies outright (:func:`slurm_lab.crash`: every process of it killed
    at once, none can act; its namespaces go with it, as with a reboot): Slurm finds it
    silent (the lab's SlurmdTimeout), revokes the job, and the surviving node's share is
    removed by the step holding it; once the dead node is back (a fresh slurmd) it has nothing of the testbed, and
    `testbed down` in a new allocation removes the controller's record."""
    job = _sleeping_job(lab, tmp_path, "4646")
    sn2 = lab.nodes[1]
    try:
        assert set(lab.leftovers()) == {"sn1", "sn2"}
        assert slurm_lab.crash(sn2) > 0
        out, _ = job.communicate(timeout=120)  # Slurm finds sn2 silent after SlurmdTimeout and revokes the job
        assert "Node failure on sn2" in out, out
        _until(lambda: not (lab.nodes[0].namespaces() or lab.nodes[0].ledgers() or _stray_steps()), 60)
        assert lab.nodes[0].namespaces() == [] and lab.nodes[0].ledgers() == [], out
        assert _stray_steps() == [] and _pids("^sleep 4646") == []
        slurm_lab.boot(lab, sn2)
        _resume(lab, "sn2")
        assert lab.leftovers() == {}
        r = subprocess.run(["salloc", "-N", "2", TESTBED, "down", "slm"], capture_output=True, text=True,
                           env=lab.env(), timeout=300)
        assert r.returncode == 0 and "removed: slm" in r.stdout, r.stdout + r.stderr
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        if sn2.proc is None or sn2.proc.poll() is not None:
            slurm_lab.boot(lab, sn2)
        _resume(lab, "sn2")
        for node in lab.nodes:  # on a failure above: what the shares left on the nodes
            node.in_mounts("env", "-u", "TESTBED_STATE_DIR", TESTBED, "down", "--all")


def _resume(lab, node: str) -> None:
    """The node back in service and the lab idle again (the next test needs both nodes)."""
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=lab.env(), check=False,
                   capture_output=True)
    _until(lambda: slurm_lab._idle(lab), 60)


def _sleeping_job(lab, tmp_path: Path, tag: str) -> subprocess.Popen:
    """``salloc -N 2``: up the topology across both nodes, then `sleep TAG` in w1 (on sn2);
    returned once that sleep runs (the test fails with the job's output if it never does)."""
    (tmp_path / "topo.yaml").write_text(TOPOLOGY)
    env = lab.env(TB=TESTBED, TOPO=str(tmp_path / "topo.yaml"), TAG=tag)
    job = subprocess.Popen(["salloc", "-N", "2", "sh", "-c", '"$TB" up "$TOPO" --hosts slurm > /dev/null && '
                            'exec "$TB" exec w1 -- sleep "$TAG"'], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    _until(lambda: bool(_pids(f"^sleep {tag}")) or job.poll() is not None, 240)
    if not _pids(f"^sleep {tag}"):
        ended = job.poll() is not None
        if not ended:
            job.kill()
        job.wait()
        pytest.fail(job.stdout.read() if ended else "the command never started")
    return job


def _salloc_ends(job: subprocess.Popen, seconds: float = 90) -> None:
    """Wait for the job's ``salloc`` to return once Slurm ended the job. How soon it does is
    Slurm's (stop 51's CI saw one linger more than 30 s on a loaded machine after every step and
    share was gone); what it still runs then must not be testbed's: the test fails naming it."""
    try:
        job.wait(seconds)
        return
    except subprocess.TimeoutExpired:
        alive = _descendants(job.pid)
        job.kill()
        job.wait()
    assert not alive, f"salloc still ran {alive} {seconds} s after its job ended"


def _descendants(pid: int) -> list[str]:
    """``PID STATE CMDLINE`` of the live (not zombie) processes below ``pid``."""
    parent, found = {}, []
    for e in os.scandir("/proc"):
        try:
            stat = Path(f"/proc/{e.name}/stat").read_text()
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            parent[int(e.name)] = (int(ppid), state)
        except (OSError, ValueError):
            continue
    below = {pid}
    for _ in range(len(parent)):  # until no new descendant
        more = {p for p, (pp, _s) in parent.items() if pp in below} - below
        if not more:
            break
        below |= more
    for p in sorted(below - {pid}):
        if parent[p][1] != "Z":
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            found.append(f"{p} {parent[p][1]} {cmd.strip()}")
    return found


def _until(done, seconds: float) -> None:
    """Look at ``done()`` every 0.5 s until it holds or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.5)


def _pids(pattern: str) -> list[int]:
    r = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split() if int(p) != os.getpid()]


def _stray_steps() -> list[int]:
    """srun of testbed's steps here, and what they run on the nodes: of the processes by
    these names only the lab's (:func:`_of_the_lab`), since the main kernel lane's sshd lab
    runs `testbed _host` and tunnels too (tests/lanes.py; one such process failed this check once)."""
    return _lab_pids("testbed.hosts.slurm") + _lab_pids(f"{TESTBED} _host") + _lab_pids("^srun .*testbed")


def _lab_pids(pattern: str) -> list[int]:
    return [pid for pid in _pids(pattern) if _of_the_lab(pid)]


def _of_the_lab(pid: int) -> bool:
    """``pid``'s environment names a Slurm lab's configuration (``SLURM_CONF``): what sbatch,
    salloc and srun start here carries it (the ordinary user's job too, under ``env -i``),
    and the lab's slurmd passes it to every step; an SSH session's `testbed _host` does not.
    False for a process gone meanwhile."""
    return any(e.startswith(b"SLURM_CONF=") and b"/tbslurmlab-" in e for e in environ_of(pid) or [])


def _stray_steps_left(timeout: float = 15.0) -> list[int]:
    """:func:`_stray_steps` once they had ``timeout`` seconds to end: salloc returns as the job
    ends, and a step that holds a share still answers Slurm's SIGTERM (a look at its ledger)."""
    deadline = time.monotonic() + timeout
    while (left := _stray_steps()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


USER = "tbslurmuser"


@pytest.fixture
def user_job(lab):
    """An ordinary user (useradd) and a way to run ``salloc -N 2 sh -c SCRIPT`` as them, from a
    directory any user can read (the topology) with their home as HOME; nothing of root's
    environment beyond Slurm's configuration and PATH."""
    d = Path(tempfile.mkdtemp(prefix="tbslurm-"))
    try:
        d.chmod(0o755)
        (d / "topo.yaml").write_text(TOPOLOGY)
        (d / "topo.yaml").chmod(0o644)
        with ordinary_user(USER) as pw:
            def job(script: str, popen: bool = False, timeout: float = 420):
                env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": lab.env()["SLURM_CONF"],
                       "TB": TESTBED, "TOPO": str(d / "topo.yaml"), "OUT": f"{pw.pw_dir}/runs"}
                argv = ["runuser", "-u", USER, "--", "env", "-i", f"HOME={pw.pw_dir}", *(f"{k}={v}" for k, v in
                                                                                           env.items()),
                        "salloc", "-N", "2", "sh", "-c", script]
                if popen:
                    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            def sbatch(script: str, timeout: float = 420):
                """``sbatch --wait`` of ``script`` as them, its output in HOME/job.out."""
                env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": lab.env()["SLURM_CONF"],
                       "TB": TESTBED, "TOPO": str(d / "topo.yaml"), "OUT": f"{pw.pw_dir}/runs"}
                argv = ["runuser", "-u", USER, "--", "env", "-i", f"HOME={pw.pw_dir}",
                        *(f"{k}={v}" for k, v in env.items()), "sbatch", "--wait", "-o", f"{pw.pw_dir}/job.out",
                        script]
                return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=pw.pw_dir)
            job.home = Path(pw.pw_dir)  # type: ignore[attr-defined]
            job.sbatch = sbatch  # type: ignore[attr-defined]
            yield job
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_an_ordinary_users_job_trains_across_both_nodes_over_tunnels(lab, user_job):
    """Issue 42's end: as an ordinary user, `salloc -N 2` then `testbed up --hosts slurm` and
    `testbed run pactrain --bw 100mbit` across both nodes, the link between them a user-space
    tunnel; the run is ok and its proof passes on that link. `down` leaves no process of the
    user on either node (or here) and nothing on the nodes."""
    r = user_job('set -e; "$TB" up "$TOPO" --hosts slurm > /dev/null; '
                 '"$TB" run pactrain -t slm --bw 100mbit --max-iters 6 --eval-every 6 --out "$OUT"; '
                 '"$TB" down slm')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = next((user_job.home / "runs").glob("*-pactrain-*"))
    topo = json.loads((run / "topology.json").read_text())
    assert [l.get("type") for l in topo["links"]] == ["veth", "veth", "tunnel"]
    assert {h["name"]: h["slurm"] for h in topo["hosts"]} == {"h1": "sn1", "h2": "sn2"}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["proof"] == "passed", summary
    assert (run / "rank1.jsonl").stat().st_size > 0  # written on sn2, in the user's namespaces there
    assert user_processes_left(USER) == []
    assert lab.leftovers() == {}


def test_scancel_of_an_ordinary_users_job_leaves_nothing_on_either_node(lab, user_job):
    """The job ends in the middle of a run (`scancel`): every process of the user on both
    nodes ends, and with the holders their namespaces, tunnels and state. The controller's
    record of the testbed (here, outside the job) is then removed by `testbed down` without
    the job, which says the nodes' shares ended with it, and removes the folders the ended
    job's holders left in the shared home directory (host-NODE-jobID)."""
    job = user_job('"$TB" up "$TOPO" --hosts slurm > /dev/null && '
                   'exec "$TB" run allreduce -t slm --compute-time 0.2 --max-iters 100000 --out "$OUT"', popen=True)
    try:
        deadline = time.monotonic() + 240
        while not list((user_job.home / "runs").glob("*/rank1.jsonl")) and time.monotonic() < deadline:
            assert job.poll() is None, job.stdout.read()
            time.sleep(0.5)
        assert _lab_pids("testbed.net.tunnel"), "no tunnel forwarder"
        ids = [line.split()[0] for line in lab.jobs()]
        subprocess.run(["scancel", *ids], env=lab.env(), check=True)
        job.wait(60)
        deadline = time.monotonic() + 30
        while (_lab_pids("testbed.net.tunnel") or _stray_steps()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _lab_pids("testbed.net.tunnel") == [] and _stray_steps() == []
        assert lab.leftovers() == {}
        bases = user_job.home / ".local" / "state" / "testbed"
        assert {p.name.split("-")[1] for p in bases.glob("host-*-job*")} == {"sn1", "sn2"}
        deadline = time.monotonic() + 30
        while lab.jobs() and time.monotonic() < deadline:  # the job's end, as Slurm sees it
            time.sleep(0.5)
        r = subprocess.run(["runuser", "-u", USER, "--", "env", "-i", f"HOME={user_job.home}",
                            "PATH=/usr/bin:/bin", f"SLURM_CONF={lab.env()['SLURM_CONF']}", TESTBED, "down", "slm"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert user_processes_left(USER) == []
        assert sorted(p.name for p in bases.glob("host-*")) == []  # nothing of the ended job in $HOME
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_doctor_checks_each_node_of_an_ordinary_users_job(lab, user_job):
    """`srun -l -N 2 testbed doctor --json` inside the allocation: one report per node, each
    naming its node, each in the user's rootless namespaces of that node and job (BASE
    host-NODE-jobID on the shared home, not one for both nodes)."""
    r = user_job('srun -l -N 2 "$TB" doctor --json', timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        task, sep, text = line.partition(": ")
        if sep and task.strip().isdigit():
            lines.setdefault(task.strip(), []).append(text)
    reports = [json.loads("\n".join(v)) for v in lines.values()]
    assert sorted(d["slurm_node"] for d in reports) == ["sn1", "sn2"], r.stdout[-3000:]
    for d in reports:
        assert d["ok"] and d["host"] == d["slurm_node"] and isinstance(d["slurm_job"], int), d
        [priv] = [c for c in d["checks"] if c["name"] == "privileges"]
        assert priv["ok"] and f"host-{d['slurm_node']}-job{d['slurm_job']}" in priv["detail"], priv


def test_the_batch_script_docs_slurm_shows_works_as_an_ordinary_user(lab, user_job, tmp_path):
    """docs/slurm.md's batch job, as an ordinary user (`sbatch --wait`): validate with the
    job's nodes as hosts (it loads the topology inside the user's namespaces, as `up` does:
    a cross-node link is a tunnel, not VXLAN), up, a sweep on the testbed, its report, down;
    nothing of the user left on either node."""
    script = user_job.home / "job.sh"
    script.write_text('#!/bin/sh\n#SBATCH -N 2\nset -e\n"$TB" validate "$TOPO" --hosts slurm\n'
                      '"$TB" up "$TOPO" --hosts slurm > /dev/null\n'
                      '"$TB" sweep -t slm --bw 100mbit --schemes allreduce --compute-time 0.05 --max-iters 3 '
                      '--out "$OUT"\n"$TB" report "$OUT"/sweep-* --out "$OUT/report"\n"$TB" down slm\n')
    shutil.chown(script, USER)
    r = user_job.sbatch(str(script))
    out = (user_job.home / "job.out").read_text() if (user_job.home / "job.out").exists() else ""
    assert r.returncode == 0, r.stderr + out[-3000:]
    assert "testbed slm can be built here" in out, out[-3000:]
    assert (user_job.home / "runs" / "report" / "report.json").is_file(), out[-3000:]
    assert user_processes_left(USER) == []
    assert lab.leftovers() == {}
