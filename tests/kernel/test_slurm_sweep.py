"""``testbed sweep --slurm`` on the real Slurm lab (:mod:`tests.kernel.slurm_lab`: two nodes,
each its own network and mount namespaces), as an ordinary user: the grid as a job array
over both nodes, an element cancelled and re-run by the re-submission alone, the report
the same as a local sweep's, and a cancelled array that leaves nothing anywhere."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import ordinary_user, user_processes, user_processes_left
from tests.kernel.test_slurm import _stray_steps_left, _until, lab  # noqa: F401 (the lab fixture)

pytestmark = [pytest.mark.kernel,
              pytest.mark.skipif(shutil.which("slurmctld") is None or shutil.which("munged") is None,
                                 reason="needs slurm-wlm and munge (apt-get install slurm-wlm munge)")]

TESTBED = str(Path(sys.executable).parent / "testbed")
USER = "tbsweepuser"
TOPOLOGY = """\
name: swq
nodes:
  s1: {kind: switch}
  w0: {kind: worker}
  w1: {kind: worker}
links:
  - {endpoints: [w0, s1], rate: 100mbit, bottleneck: true}
  - {endpoints: [w1, s1], rate: 100mbit, bottleneck: true}
"""
GRID = ["--schemes", "allreduce,topk,fp16", "--bw", "100mbit,500mbit", "--compute-time", "0.1"]


@pytest.fixture
def user(lab):  # noqa: F811
    """``run(*args)``: testbed as an ordinary user (env -i: HOME, PATH, SLURM_CONF only) from
    a directory any user can read, which holds the topology."""
    d = Path(tempfile.mkdtemp(prefix="tbsweep-"))
    try:
        d.chmod(0o755)
        (d / "topo.yaml").write_text(TOPOLOGY)
        (d / "topo.yaml").chmod(0o644)
        with ordinary_user(USER) as pw:
            def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
                argv = ["runuser", "-u", USER, "--", "env", "-i", f"HOME={pw.pw_dir}", "PATH=/usr/bin:/bin",
                        f"SLURM_CONF={lab.env()['SLURM_CONF']}", TESTBED, *args]
                return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=d)
            run.home = Path(pw.pw_dir)  # type: ignore[attr-defined]
            run.topology = str(d / "topo.yaml")  # type: ignore[attr-defined]
            yield run
            subprocess.run(["scancel", "-u", USER], env=lab.env(), check=False)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _json(r: subprocess.CompletedProcess) -> dict:
    assert r.stdout.strip(), r.stderr[-3000:]
    return json.loads(r.stdout)


def _status(user, d: str) -> dict:
    r = user("sweep", "--status", d, "--json")
    assert r.returncode == 0, r.stderr
    return _json(r)


def _running_with_records(user, d: str) -> list[dict]:
    """The elements running whose ranks have begun to write records."""
    return [e for e in _status(user, d)["elements"]
            if e["state"] == "running" and any((Path(d) / e["run_id"]).glob("rank0.jsonl"))]


def test_a_sweep_as_an_array_over_both_nodes_reruns_only_a_cancelled_element_and_reports_as_locally(lab, user):  # noqa: F811
    out = str(user.home / f"runs-{secrets.token_hex(4)}")  # a sweep of its own (the user may be left from before)
    sweep = ["sweep", *GRID, "--max-iters", "25", "--topology", user.topology, "--out", out]
    r = user(*sweep, "--slurm", "--array-limit", "4", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    first = _json(r)
    d, job = first["dir"], first["submitted"]
    assert first["total"] == 6 and job
    running: list[dict] = []
    _until(lambda: bool(running.extend(_running_with_records(user, d)) or running), 240)
    assert running, _status(user, d)
    killed = running[0]
    subprocess.run(["scancel", killed["job"]], env=lab.env(), check=True)  # one element: JOB_INDEX
    ended = _json(user("sweep", "--status", d, "--wait", "--json"))
    states = {e["run_id"]: e["state"] for e in ended["elements"]}
    assert states.pop(killed["run_id"]) in ("interrupted", "lost"), ended
    assert set(states.values()) == {"ok"}, ended
    results = {e["index"]: json.loads((Path(d) / "slurm" / "results" / f"{e['index']}.json").read_text())
               for e in ended["elements"] if e["state"] == "ok"}
    assert {r["node"] for r in results.values()} == {"sn1", "sn2"}  # over both nodes
    spans = sorted((r["started"], r["ended"]) for r in results.values())
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans  # at least 2 at once
    assert lab.leftovers() == {}  # the cancelled element took its testbed down too

    r = user(*sweep, "--slurm", "--array-limit", "4", "--wait", "--json")  # the same sweep again
    assert r.returncode == 0, r.stderr[-3000:]
    again = _json(r)
    assert again["dir"] == d and set(e["state"] for e in again["elements"]) == {"ok"}
    subs = json.loads((Path(d) / "slurm" / "submissions.json").read_text())
    assert [s["elements"] for s in subs] == [list(range(6)), [killed["index"]]]
    for i, before in results.items():  # a finished element never runs twice
        assert json.loads((Path(d) / "slurm" / "results" / f"{i}.json").read_text()) == before
    assert list((Path(d) / "slurm" / "attempts").iterdir())  # the cancelled attempt, out of report's way

    r = user(*sweep, "--json")  # the same sweep on this one machine
    assert r.returncode == 0, r.stderr[-3000:]
    local = _json(r)["dir"]
    slurm_report, local_report = (_json(user("report", x, "--out", f"{x}/report", "--json")) for x in (d, local))
    assert _shape(slurm_report) == _shape(local_report), (slurm_report, local_report)
    assert user_processes_left(USER) == [] and lab.leftovers() == {} and _stray_steps_left() == []
    assert _status(user, d)["counts"] == {"ok": 6}  # (it removes the ended jobs' folders)
    assert sorted(p.name for p in (user.home / ".local" / "state" / "testbed").glob("host-*")) == []


def _shape(report: dict) -> object:
    """A report's table without its measurements: each group's scheme, rate and runs."""
    return sorted((r["scheme"], r["variant"], r["bw"], r["world_size"], r["runs"], r["ok"], tuple(sorted(r)))
                  for r in report["rows"])


def test_cancelling_a_sweep_leaves_nothing_on_either_node(lab, user):  # noqa: F811
    r = user("sweep", *GRID, "--max-iters", "100000", "--topology", user.topology, "--out", str(user.home / f"c-{secrets.token_hex(4)}"),
             "--slurm", "--array-limit", "2", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    d = _json(r)["dir"]
    _until(lambda: len(_running_with_records(user, d)) == 2, 240)
    assert len(_running_with_records(user, d)) == 2, _status(user, d)
    assert user_processes(USER)  # the elements' namespaces (rootless: nothing in the nodes' own view)
    r = user("sweep", "--cancel", d, "--json")
    assert r.returncode == 0 and _json(r)["cancelled"], r.stderr
    _until(lambda: not (lab.jobs() or lab.leftovers()), 90)
    assert lab.jobs() == [] and lab.leftovers() == {}
    assert user_processes_left(USER) == [] and _stray_steps_left() == []
    st = _status(user, d)
    assert set(st["counts"]) <= {"interrupted", "lost"} and sum(st["counts"].values()) == 6, st
    assert sorted(p.name for p in (user.home / ".local" / "state" / "testbed").glob("host-*")) == []
    r = user("sweep", "--status", str(user.home / "nosuch"))
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "no such sweep directory" in r.stderr, r.stderr
    r = user("sweep", "--status", "/tmp")  # root's
    assert r.returncode == 1 and "not to you" in r.stderr and "Traceback" not in r.stderr, r.stderr
