"""A lab machine shared by several users (issue: hardening III), with real users made by
useradd: what one user plants cannot make another's (or root's) report or run write through
it, and what one user runs (the link and run exporters, Prometheus, run directories) others
cannot read."""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import dumbbell

from .conftest import cli
from .test_monitor import _free_ports
from .test_rootless import USERS, _ok, _write, as_user, users  # noqa: F401  (the fixture)

pytestmark = pytest.mark.kernel
ATTACKER, VICTIM = USERS


@pytest.fixture
def shared_tmp():
    """A folder every user reaches (pytest's tmp_path is root's own, mode 0700)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="tb-shared-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _own(path: Path, user: str) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid, follow_symlinks=False)


def _planted_runs(tmp: Path, victim_file: Path) -> Path:
    """A world-readable folder of the attacker's: one plausible run, and a report/ folder whose
    files link to ``victim_file``, left writable by all (so that anyone's report could write there)."""
    shared = tmp / "shared"
    run = shared / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "request": {"scheme": "allreduce", "bw": "1gbit"}}))
    (run / "summary.json").write_text(json.dumps({"run_id": "r1", "scheme": "allreduce", "bw": "1gbit",
                                                  "status": "ok", "world_size": 2, "mean_iter_s": 0.1}))
    (shared / "runs" / "report").mkdir()
    for name in ("report.json", "report.csv", "proof.csv", "tta.png"):
        (shared / "runs" / "report" / name).symlink_to(victim_file)
    _own(shared, ATTACKER)
    for d in (shared, shared / "runs", run):
        d.chmod(0o755)
    (shared / "runs" / "report").chmod(0o777)
    return shared / "runs"


def test_report_never_writes_through_what_another_user_planted(users, shared_tmp, tmp_path):
    victim_home = users[VICTIM]
    secret = victim_home / "private.txt"
    secret.write_text("the victim's own\n")
    _own(secret, VICTIM)
    root_file = tmp_path / "root-owned"
    root_file.write_text("root's own\n")
    runs = _planted_runs(shared_tmp, secret)

    r = as_user(VICTIM, "report", str(runs))  # the default place is the attacker's report/ folder
    assert secret.read_bytes() == b"the victim's own\n", "report wrote through the attacker's link"
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"belongs to uid {pwd.getpwnam(ATTACKER).pw_uid}" in r.stderr, r.stderr
    assert "--out" in r.stderr
    _ok(as_user(VICTIM, "report", str(runs), "--out", str(victim_home / "rep")))  # a place of their own
    assert stat.S_IMODE((victim_home / "rep").stat().st_mode) == 0o700
    assert (victim_home / "rep" / "report.csv").stat().st_uid == pwd.getpwnam(VICTIM).pw_uid

    for name in ("report.json", "report.csv"):  # root, too, is refused the attacker's folder
        (runs / "report" / name).unlink()
        (runs / "report" / name).symlink_to(root_file)
    r = cli("report", str(runs))
    assert root_file.read_bytes() == b"root's own\n", "report run by root wrote through the attacker's link"
    assert r.returncode == 1 and "belongs to uid" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cli("report", str(runs), "--out", str(runs / "mine"))  # under folders the attacker can rename
    assert r.returncode == 1 and f"{runs.parent} belongs to uid" in r.stderr, r.stderr  # the first from /
    assert root_file.read_text() == "root's own\n" and not (runs / "mine").exists()


def test_a_run_or_sweep_into_another_users_out_is_refused_before_anything_is_built(users, shared_tmp):
    shared = shared_tmp / "out"
    (shared / "checkpoints").mkdir(parents=True)
    victim_file = users[VICTIM] / "model.pt"
    victim_file.write_text("not a checkpoint\n")
    _own(victim_file, VICTIM)
    (shared / "checkpoints" / "planted.pt").symlink_to(victim_file)
    _own(shared, ATTACKER)
    shared.chmod(0o777)  # the attacker left it writable by all (no sticky bit)
    for argv in (("run", "allreduce", "-t", "nothere", "--out", str(shared)),
                 ("sweep", "-t", "nothere", "--schemes", "allreduce", "--bw", "100mbit", "--out", str(shared))):
        r = as_user(VICTIM, *argv)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (argv, r.stderr)
        assert f"{shared} belongs to uid" in r.stderr and "not to you" in r.stderr, r.stderr
    assert sorted(p.name for p in shared.iterdir()) == ["checkpoints"]
    assert victim_file.read_text() == "not a checkpoint\n"


def test_a_run_below_a_folder_another_user_may_rename_in_is_refused(users, shared_tmp):
    """Issue 56: the owner of a sticky folder may rename anything in it (mid-run they swapped
    the victim's run directory for one of theirs, zygote socket included). Refused for an
    ordinary user (the real owner seen through the rootless namespaces) and for root; root's
    own sticky folder, as /tmp, stays fine."""
    attacker = pwd.getpwnam(ATTACKER)
    sticky = shared_tmp / "sticky"  # the attacker's own /tmp
    sticky.mkdir()
    os.chown(sticky, attacker.pw_uid, attacker.pw_gid)
    sticky.chmod(0o1777)
    run = ("run", "allreduce", "-t", "nothere", "--out")
    for r in (as_user(VICTIM, *run, str(sticky / "runs")), cli(*run, str(sticky / "runs"))):
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"{sticky} belongs to uid {attacker.pw_uid}, who may rename" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 2, r.stderr  # the error and its hint
    assert list(sticky.iterdir()) == []
    tmp = shared_tmp / "tmp"  # root's own sticky folder: the run goes on to the next check
    tmp.mkdir()
    tmp.chmod(0o1777)
    r = as_user(VICTIM, *run, str(tmp / "runs"))
    assert r.returncode == 1 and "nothere" in r.stderr and "belongs to" not in r.stderr, r.stderr


def _status(url: str, headers: dict | None = None, as_: str | None = None) -> int:
    """The HTTP status ``url`` answers, asked by this process or by user ``as_``."""
    if as_ is not None:
        code = ("import sys, urllib.request, urllib.error\n"
                "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=10).status)\n"
                "except urllib.error.HTTPError as e:\n    print(e.code)\n")
        r = subprocess.run(["runuser", "-u", as_, "--", sys.executable, "-c", code, url], capture_output=True,
                           text=True, timeout=60, cwd="/")
        return int(r.stdout.strip())
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _listening(uid: int) -> set[str]:
    """The TCP addresses (HOST:PORT) that processes of ``uid`` listen on."""
    out = subprocess.run(["ss", "-ltnHe"], capture_output=True, text=True, timeout=30).stdout
    return {line.split()[3] for line in out.splitlines() if f" uid:{uid} " in line}


def _body(url: str, headers: dict) -> bytes:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.read()
    except (OSError, ValueError):
        return b""


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary (apt-get install prometheus)")
def test_a_users_exporters_prometheus_and_runs_answer_that_user_only(users):
    owner, home = VICTIM, users[VICTIM]
    (port,) = _free_ports(1)
    prom = f"http://127.0.0.1:{port}"
    _ok(as_user(owner, "monitor", "up", "--listen", f"127.0.0.1:{port}"))
    try:
        _ok(as_user(owner, "up", _write(home, owner, "priv", dumbbell(name="priv", rate="1gbit"))))
        exporter = json.loads(_ok(as_user(owner, "status", "priv", "--json")).stdout)["exporter"]
        assert _status(exporter, as_=ATTACKER) == 401 and _status(exporter) == 401  # the link exporter
        token = (home / ".local/state/testbed/metrics.token").read_text().strip()
        assert stat.S_IMODE((home / ".local/state/testbed/metrics.token").stat().st_mode) == 0o600
        assert _status(exporter, {"Authorization": f"Bearer {token}"}) == 200
        basic = {"Authorization": "Basic " + base64.b64encode(f"testbed:{token}".encode()).decode()}
        for path in ("/api/v1/targets", "/api/v1/query?query=up", "/-/ready"):
            assert _status(prom + path, as_=ATTACKER) == 401, path
            assert _status(prom + path, basic) == 200, path
        st = json.loads(_ok(as_user(owner, "monitor", "status", "--json")).stdout)
        assert st["running"] and stat.S_IMODE(os.stat(st["dir"]).st_mode) == 0o700

        # the run's own exporter (on by default), asked while it serves (it waits for Prometheus' scrape):
        # the loopback port the owner listens on that was not there before the run
        uid = pwd.getpwnam(owner).pw_uid
        before = _listening(uid)
        p = as_user(owner, "run", "allreduce", "-t", "priv", "--max-iters", "2", "--out", str(home / "runs"),
                    "--json", popen=True)
        run_exporter = None
        deadline = time.monotonic() + 120
        while run_exporter is None and p.poll() is None and time.monotonic() < deadline:
            for address in _listening(uid) - before:
                url = f"http://{address}/metrics"
                if b"testbed_run_info" in _body(url, {"Authorization": f"Bearer {token}"}):
                    run_exporter = url
            time.sleep(0.05)
        assert run_exporter is not None, "no run exporter found while the run lasted"
        assert _status(run_exporter, as_=ATTACKER) == 401 and _status(run_exporter) == 401, run_exporter
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err
        run = json.loads(out)
        assert stat.S_IMODE(Path(run["run_dir"]).stat().st_mode) == 0o700
        r = subprocess.run(["runuser", "-u", ATTACKER, "--", "cat", str(Path(run["run_dir"]) / "summary.json")],
                           capture_output=True, text=True)
        assert r.returncode != 0 and "Permission denied" in r.stderr
        # it scrapes with the token: a target found by file discovery is "unknown" until its first scrape,
        # which Prometheus spreads over the interval and a loaded machine delays, so wait for it
        deadline = time.monotonic() + 60
        while True:
            targets = json.loads(_ok(as_user(owner, "monitor", "status", "--json")).stdout)["targets"]
            links = [t for t in targets if t["exporter"] == "links"]
            if (links and all(t["health"] == "up" for t in links)) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert links and all(t["health"] == "up" for t in links), targets
        assert not any("401" in t["last_error"] for t in targets), targets
    finally:
        as_user(owner, "down", "priv")
        _ok(as_user(owner, "monitor", "down"))
