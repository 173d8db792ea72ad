"""The run's zygote on real nodes: a 4-rank run's ranks are forked from it (their parent is
the zygote, each beside its client in its node), the proof, the flight recorder's counts,
the records and the memory fields hold; with TESTBED_ZYGOTE=0, and when the zygote dies
before it serves, the ranks start as before and the run still passes; as an ordinary user
(rootless) the ranks come from the zygote too, and nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import star_of_stars
from testbed.common.procs import argv_of, parent_of
from testbed.net.netns import pids_in
from workloads.collectives import RECORDER_ENTRIES

from tests.kernel import test_rootless

USERS, as_user, _ok, _write = test_rootless.USERS, test_rootless.as_user, test_rootless._ok, test_rootless._write
_await_nothing_left = test_rootless._await_nothing_left
users = test_rootless.users  # the ordinary users it makes (a fixture)

pytestmark = pytest.mark.kernel
ROOT = Path(__file__).resolve().parents[2]
SERVER, CLIENT = "testbed.nodes.zygote.server", "testbed.nodes.zygote.client"


def _topology(tmp_path: Path, name: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(star_of_stars(4, name=name, per_leaf=2)))  # 2 leaves: a bottleneck each
    return path


def _run(tmp_path: Path, name: str, iters: int, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "--topology",
                             str(_topology(tmp_path, name)), "--out", str(tmp_path / "runs"), "--compute-time", "0.1",
                             "--max-iters", str(iters), "--no-exporter", "--json"],
                            cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _zygotes(tmp_path: Path) -> list[int]:
    """The zygotes of runs under ``tmp_path`` (their stdout is the run directory's zygote.log)."""
    return [p for p in _with_arg(SERVER) if _logs_under(p, tmp_path)]


def _with_arg(arg: str) -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and arg in argv_of(int(e.name))]


def _logs_under(pid: int, tmp_path: Path) -> bool:
    """``pid`` is a zygote, not a rank forked from one (which has its argv): its stdout is
    its run's zygote.log."""
    try:
        out = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return False
    return out.startswith(str(tmp_path)) and out.endswith("/zygote.log")


def _summary(p: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, out + err
    return json.loads(out)


def _await(what, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not (got := what()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return got


def _records(tmp_path: Path) -> bool:
    found = list((tmp_path / "runs").glob("*/rank3.jsonl"))
    return bool(found) and len(found[0].read_text().splitlines()) >= 2


def _check_run(s: dict) -> Path:
    """What a run's results must show with or without the zygote; its directory."""
    assert (s["status"], s["proof"]) == ("ok", "passed"), s
    run_dir = Path(s["run_dir"])
    assert (run_dir / "started").exists()
    for r in range(4):
        doc = json.loads((run_dir / f"collectives{r}.json").read_text())
        assert doc["recorder_entries"] == RECORDER_ENTRIES and doc["uncounted"] == 0 and doc["ops"], doc
        assert (run_dir / f"rank{r}.jsonl").read_text().strip()
    assert s["max_rss_bytes_per_rank"] > 100e6 and s["pss_bytes_all_ranks"] > 100e6
    return run_dir


def test_the_ranks_are_forked_from_the_runs_zygote_inside_their_nodes(tmp_path, clean_kernel):
    p = _run(tmp_path, "zyg", 40)
    try:
        assert _await(lambda: _records(tmp_path)), "the ranks never started iterating"
        (zygote,) = _zygotes(tmp_path)
        for w in range(4):
            procs = sorted(pids_in([f"zyg.w{w}"]))
            clients = [q for q in procs if CLIENT in argv_of(q)]
            ranks = [q for q in procs if q not in clients]
            assert len(clients) == 1 and len(ranks) == 1, [argv_of(q) for q in procs]
            assert parent_of(ranks[0]) == zygote, "the rank is the zygote's child"
            assert parent_of(clients[0]) != zygote
    except BaseException:
        p.send_signal(signal.SIGINT)  # it stops the ranks and takes the testbed down
        p.communicate(timeout=120)
        raise
    s = _summary(p)
    run_dir = _check_run(s)
    log = (run_dir / "zygote.log").read_text()
    assert sorted(int(line.split("rank ")[1].split()[0]) for line in log.splitlines()
                  if "runs workloads.train" in line) == [0, 1, 2, 3], log
    assert log.count("ended (exit code 0)") == 4 and "refused" not in log
    assert not (run_dir / "zygote.sock").exists() and not _zygotes(tmp_path), "the zygote ends with the run"
    assert not any("without the zygote" in (run_dir / f"rank{r}.log").read_text() for r in range(4))


def test_without_the_zygote_and_when_it_dies_before_serving_the_ranks_start_as_before(tmp_path, clean_kernel):
    s = _summary(_run(tmp_path / "off", "zoff", 3, TESTBED_ZYGOTE="0"))
    run_dir = _check_run(s)
    assert not (run_dir / "zygote.log").exists()
    assert not any("the zygote" in (run_dir / f"rank{r}.log").read_text() for r in range(4))
    # a zygote that dies while it imports: its queued clients start their ranks themselves
    p = _run(tmp_path, "zdie", 3)
    zygote = _await(lambda: _zygotes(tmp_path), timeout=60)
    assert zygote, "no zygote started"
    os.kill(zygote[0], signal.SIGSTOP)
    log = next((tmp_path / "runs").glob("*/zygote.log"))
    if "serving" in log.read_text():
        os.kill(zygote[0], signal.SIGCONT)
        p.communicate(timeout=300)
        pytest.skip("the zygote served before it could be stopped (a fast machine): nothing to fall back from")
    os.kill(zygote[0], signal.SIGKILL)
    run_dir = _check_run(_summary(p))
    assert all("started without the zygote" in (run_dir / f"rank{r}.log").read_text() for r in range(4))


def test_rootless_ranks_come_from_the_zygote_too(users):
    user, home = USERS[0], users[USERS[0]]
    topo = _write(home, user, "zrl", star_of_stars(4, name="zrl", per_leaf=2))
    r = _ok(as_user(user, "run", "allreduce", "--topology", topo, "--compute-time", "0.1", "--max-iters", "3",
                    "--out", str(home / "zruns"), "--no-exporter", "--json", timeout=600))
    run_dir = _check_run(json.loads(r.stdout))
    log = (run_dir / "zygote.log").read_text()
    assert log.count("runs workloads.train") == 4 and "refused" not in log, log
    _await_nothing_left(user, home)
