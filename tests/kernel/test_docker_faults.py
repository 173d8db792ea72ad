"""Container workers under real faults: the Docker engine, a container or the image changed
behind testbed's back, and the run's own process killed.

Each fault is made for real on the running engine: ``docker rm -f`` of a worker's container
during a run, ``docker restart`` of one before and during a run, the engine itself stopped
and started again during a run, the worker image untagged between ``up`` and ``run``, and
``kill -9`` of ``testbed run``. Every case ends with ``testbed down`` leaving nothing
(``docker_clean``: no container, namespace, veth or qdisc).

The engine restart stops dockerd by the pid in its pid file and starts it again with the
command line it ran with (as ``.ci/run`` starts it); whatever happens, the test leaves an
engine running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import finish
from tests.kernel import test_docker
from tests.kernel.conftest import cli, cli_json
from tests.kernel.test_docker import _containers, _docker_dumbbell, _write, cli_argv

# test_docker's fixtures, in force here too: forward_drop is autouse (dockerd's FORWARD DROP
# policy for the whole module)
engine, docker_clean, forward_drop = test_docker.engine, test_docker.docker_clean, test_docker.forward_drop

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
SHORT = ["--max-iters", "6", "--eval-every", "6", "--target-acc", "0.3"]
LONG = ["--max-iters", "100000", "--eval-every", "100000"]
DOCKER_PID = Path("/var/run/docker.pid")


def _up(tmp_path: Path, name: str) -> None:
    cli_json("up", str(_write(tmp_path, _docker_dumbbell(name, "1gbit"))), "--no-exporter")


def _down(engine, name: str) -> None:
    r = cli("down", name, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _containers(engine, name) == []


def _run(name: str, runs: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli("run", "allreduce", "--testbed", name, "--out", str(runs), "--no-exporter", *extra, timeout=120)


def _start_long_run(name: str, runs: Path) -> subprocess.Popen:
    """`testbed run` for as long as it is let, returned once both ranks have records."""
    p = subprocess.Popen([*cli_argv(), "run", "allreduce", "--testbed", name, "--out", str(runs), "--no-exporter",
                          *LONG], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        recs = [x for x in runs.glob("*/rank*.jsonl") if x.stat().st_size > 0]
        if len(recs) == 2:
            return p
        if p.poll() is not None:
            break
        time.sleep(0.2)
    p.kill()
    out, err = p.communicate()
    raise AssertionError(f"the run never started training: {err[-2000:]}")


def _finish(p: subprocess.Popen, timeout: float = 60) -> str:
    return finish(p, timeout)[0]


def _failed_clearly(p_rc: int, err: str) -> None:
    print("\n".join(l for l in err.splitlines() if l.startswith(("error:", "  hint:"))))
    assert p_rc == 1, err
    assert "Traceback" not in err, err


def _processes_with(text: str) -> dict[int, str]:
    """Every process on the host (a container's included) with ``text`` in its command line."""
    out = {}
    for e in os.scandir("/proc"):
        if e.name.isdigit() and int(e.name) != os.getpid():
            try:
                with open(f"/proc/{e.name}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if text.encode() in cmd:
                out[int(e.name)] = cmd.replace(b"\0", b" ").decode(errors="replace")
    return out


# ------------------------------------------------------------------------ the container
def test_a_container_removed_during_a_run_names_its_rank_and_down_leaves_nothing(docker_clean, engine, tmp_path):
    _up(tmp_path, "frm")
    runs = tmp_path / "runs"
    try:
        p = _start_long_run("frm", runs)
        try:
            engine.containers.get("testbed-frm.w1").remove(force=True)  # docker rm -f
        finally:
            err = _finish(p)
        _failed_clearly(p.returncode, err)
        assert "rank 1 (node w1)" in err and "container testbed-frm.w1 was removed" in err, err
        r = cli("exec", "w1", "--", "true")
        _failed_clearly(r.returncode, r.stderr)
        assert "node w1: its container testbed-frm.w1 was removed" in r.stderr, r.stderr
    finally:
        _down(engine, "frm")


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_restarted_container_is_refused_not_trained_over(docker_clean, engine, tmp_path, when):
    """A restarted container has a new network namespace: its veth into the testbed stayed in
    the old one. Neither `exec` nor `run` may use it as if it were still wired."""
    _up(tmp_path, "frs")
    runs = tmp_path / "runs"
    try:
        if when == "before":
            engine.containers.get("testbed-frs.w1").restart(timeout=1)
            r = cli("exec", "w1", "--", "true")
            _failed_clearly(r.returncode, r.stderr)
            assert "node w1" in r.stderr and "restarted" in r.stderr, r.stderr
            r = _run("frs", runs, *SHORT)
            rc, err = r.returncode, r.stderr
            assert not list(runs.glob("*/rank*.jsonl")) or all(
                x.stat().st_size == 0 for x in runs.glob("*/rank*.jsonl")), "it trained"
        else:
            p = _start_long_run("frs", runs)
            try:
                engine.containers.get("testbed-frs.w1").restart(timeout=1)
            finally:
                err = _finish(p)
            rc = p.returncode
        _failed_clearly(rc, err)
        assert "node w1" in err and "container testbed-frs.w1 was restarted" in err, err
        assert "testbed down" in err, err
    finally:
        _down(engine, "frs")


# ------------------------------------------------------------------------ the engine
def _engine_pid() -> int | None:
    try:
        pid = int(DOCKER_PID.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def _engine_answers(timeout: float) -> bool:
    import docker

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            dc = docker.from_env(timeout=5)
            try:
                dc.info()
                return True
            finally:
                dc.close()
        except Exception:
            time.sleep(0.2)
    return False


def _start_engine(argv: list[str]) -> None:
    """Start dockerd as `.ci/run` does: its own session, output to /tmp/dockerd.log."""
    with open("/tmp/dockerd.log", "ab") as log:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def engine_restart(engine):
    """A function that restarts the Docker engine for real (SIGTERM, wait, start again with
    its own command line); the engine runs again after the test, whatever happened."""
    pid = _engine_pid()
    if pid is None:
        pytest.skip(f"no dockerd pid in {DOCKER_PID}: the engine was not started on this machine")
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    times = {}

    def restart() -> None:
        t0 = time.monotonic()
        old = _engine_pid()
        os.kill(old, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{old}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{old}").exists(), "dockerd did not stop within 30 s of SIGTERM"
        times["stopped"] = time.monotonic() - t0
        _start_engine(argv)
        assert _engine_answers(60), "dockerd did not answer within 60 s of starting again"
        times["restarted"] = time.monotonic() - t0

    try:
        yield restart
    finally:
        if not _engine_answers(1):
            if _engine_pid() is None:
                _start_engine(argv)
            assert _engine_answers(60), "the Docker engine could not be started again"
        print(f"engine restart: stopped after {times.get('stopped', 0):.1f} s, "
              f"answering after {times.get('restarted', 0):.1f} s")


def test_an_engine_restart_during_a_run_fails_it_clearly_and_down_leaves_nothing(
        docker_clean, engine, engine_restart, tmp_path):
    _up(tmp_path, "feg")
    runs = tmp_path / "runs"
    try:
        p = _start_long_run("feg", runs)
        try:
            engine_restart()
        finally:
            err = _finish(p)
        _failed_clearly(p.returncode, err)
        assert "rank 0 (node w0)" in err or "rank 1 (node w1)" in err, err
        assert "Docker engine" in err, err
        # the engine is back, its containers are not: the next run is refused, naming why
        r = _run("feg", runs, *SHORT)
        _failed_clearly(r.returncode, r.stderr)
        assert "node w0: its container testbed-feg.w0 is exited" in r.stderr, r.stderr
        assert "the Docker engine restarted at" in r.stderr, r.stderr
    finally:
        _down(engine, "feg")


# ------------------------------------------------------------------------ the image
def test_the_image_removed_after_up_does_not_stop_a_run(docker_clean, engine, tmp_path):
    """`docker rmi -f` of the tag the containers came from only untags it: the containers hold
    its layers, so a run on them works and `down` removes them. Building the tag again takes
    seconds, all its steps cached."""
    import docker

    from testbed.nodes.images import DEFAULT_TAG

    image = engine.images.get(DEFAULT_TAG)
    _up(tmp_path, "fim")
    runs = tmp_path / "runs"
    try:
        engine.images.remove(DEFAULT_TAG, force=True)  # docker rmi -f testbed/worker:cpu
        assert DEFAULT_TAG not in {t for i in engine.images.list() for t in i.tags}
        r = _run("fim", runs, *SHORT)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        _down(engine, "fim")
        t0 = time.monotonic()
        r = cli("image", "build", "--json", timeout=300)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        print(f"`testbed image build` after the tag was removed: {took:.1f} s")
        assert took < 60, f"rebuilding the tag from cached steps took {took:.0f} s"
    finally:
        cli("down", "fim")
        try:
            rebuilt = engine.images.get(DEFAULT_TAG)
        except docker.errors.ImageNotFound:
            rebuilt = None
            image.tag(*DEFAULT_TAG.split(":"))  # put the tag back however the test ended
        if rebuilt is not None and rebuilt.id != image.id:
            try:  # the untagged image, now that no container holds it (else it stays, dangling)
                engine.images.remove(image.id)
            except docker.errors.APIError:
                pass


# ------------------------------------------------------------------------ the run itself
def test_kill9_of_run_leaves_no_rank_in_the_containers(docker_clean, engine, tmp_path):
    _up(tmp_path, "fkr")
    runs = tmp_path / "runs"
    try:
        p = _start_long_run("fkr", runs)
        ranks = {pid: cmd for pid, cmd in _processes_with(str(runs)).items() if pid != p.pid}
        inside = [c.top()["Processes"] for c in _containers(engine, "fkr")]
        assert sum("workloads.train" in cmd for cmd in ranks.values()) >= 4, ranks  # nsexec + rank, twice
        assert all(any("workloads.train" in " ".join(row) for row in rows) for rows in inside), inside
        p.kill()
        p.wait()
        t0 = time.monotonic()
        while time.monotonic() < t0 + 30 and set(ranks) & set(_processes_with(str(runs))):
            time.sleep(0.05)
        print(f"ranks gone {time.monotonic() - t0:.2f} s after `testbed run` was killed")
        left = _processes_with(str(runs))
        assert not left, f"ranks outlived `testbed run` killed with SIGKILL: {left}"
        for c in _containers(engine, "fkr"):  # only the container's init and its sleep remain
            assert not any("workloads" in " ".join(row) for row in c.top()["Processes"]), c.top()
    finally:
        _down(engine, "fkr")
