"""Every file the tool reads, pointed at /dev/zero, a FIFO (no writer) and a 1 GB sparse
file: a clear refusal naming the file (or, where a missing file is normal, nothing read), no
hang and bounded memory. Each case runs in a child process whose peak memory is measured
(wait4's ru_maxrss); a hang is a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_RSS_MB = 400  # the interpreter with torch imported is about 350 MB; a read of 1 GB is far above


@pytest.fixture(params=["zero", "fifo", "sparse"])
def hostile(request, tmp_path) -> Path:
    if request.param == "zero":
        return Path("/dev/zero")
    p = tmp_path / f"hostile-{request.param}"
    if request.param == "fifo":
        os.mkfifo(p)
    else:
        with open(p, "wb") as f:
            f.truncate(1 << 30)
    return p


WRAP = ("import resource, subprocess, sys\n"
        "try:\n"
        "    rc = subprocess.run(sys.argv[2:], timeout=float(sys.argv[1])).returncode\n"
        "except subprocess.TimeoutExpired:\n"
        "    rc = 124  # killed by run(): a hang\n"
        "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(rc)\n")
"""Runs the command as its only child and prints that child's peak RSS (the test process's own
children's figure would be the largest of every earlier test's)."""


def _child(argv: list[str], env: dict | None = None, cwd: Path | None = None, timeout: float = 60):
    """(exit status, stdout+stderr, peak RSS in MB, seconds) of a child, killed after ``timeout``."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", WRAP, str(timeout), *argv], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd, stdin=subprocess.DEVNULL,
                       timeout=timeout + 30)
    if p.returncode == 124:
        pytest.fail(f"{argv} hung (killed after {timeout} s)")
    out = p.stdout.decode(errors="replace")
    body, _, rss = out.rpartition("MAXRSS_KB ")
    return p.returncode, body, int(rss) / 1024, time.monotonic() - t0


def _cli(*args: str, **kw):
    return _child([sys.executable, "-m", "testbed.cli", *args], **kw)


def test_cli_inputs_are_refused_naming_the_file(hostile, tmp_path):
    cases = [
        (("up", "--dry-run", str(hostile)), "topology file"),
        (("run", "allreduce", "--init", str(hostile), "--out", str(tmp_path / "o")), "--init"),
        (("run", "--script", str(hostile), "--out", str(tmp_path / "o")), "--script"),
    ]
    for args, words in cases:
        rc, out, rss, _ = _cli(*args)
        assert rc == 1 and words in out and str(hostile) in out, (args, out)
        assert "Traceback" not in out and rss < MAX_RSS_MB, (args, rss)
    assert not (tmp_path / "o").exists()


def _run_dir(tmp_path: Path, hostile: Path, link: str) -> Path:
    d = tmp_path / "runs" / "r1"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": "r1", "request": {"bw": "100mbit", "scheme": "allreduce"}}))
    (d / "summary.json").write_text(json.dumps({"scheme": "allreduce", "status": "ok", "bw": "100mbit"}))
    (d / "eval.jsonl").write_text("")
    (d / link).unlink(missing_ok=True)
    (d / link).symlink_to(hostile)
    if link == "run.json":
        (d / "summary.json").unlink()  # report reads run.json of a run that wrote no summary
    return d


@pytest.mark.parametrize("link", ["summary.json", "run.json", "eval.jsonl", "links.jsonl"])
def test_report_on_a_run_whose_files_are_hostile(hostile, tmp_path, link):
    d = _run_dir(tmp_path, hostile, link)
    rc, out, rss, _ = _cli("report", str(d.parent), "--out", str(tmp_path / "rep"))
    assert rss < MAX_RSS_MB and "Traceback" not in out, (rss, out)
    assert rc != 0 or f"skipped {d}" in out, out  # refused, or that run skipped with the reason
    assert link in out and ("regular file" in out or "bytes, more than" in out), out


def test_state_ledgers_and_status(hostile, tmp_path):
    state = tmp_path / "state"
    (state / "tb1").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    (state / "tb1" / "ledger.jsonl").symlink_to(hostile)
    (state / "tb1" / "state.json").symlink_to(hostile)
    env = {"TESTBED_STATE_DIR": str(state)}
    for args in (("status", "--json"), ("status", "tb1"), ("down", "tb1")):
        rc, out, rss, _ = _cli(*args, env=env)
        assert rss < MAX_RSS_MB and "Traceback" not in out, (args, rss, out)
        assert rc != 0 and "regular file" in out or "bytes, more than" in out, (args, out)


FUNCTIONS = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from testbed.common.errors import TestbedError
    H, D = Path(sys.argv[1]), Path(sys.argv[2])

    def attempt(name, fn):
        try:
            r = fn()
            print(json.dumps({"case": name, "ok": repr(r)[:80]}))
        except TestbedError as e:
            print(json.dumps({"case": name, "error": e.message}))

    from testbed.model.trace import load_trace
    from testbed.common.files import JsonlTail, read_jsonl, tail_text
    from testbed.monitor import prometheus, sd
    from testbed.runs.userrecords import rank_records
    from testbed.nodes.vm import accel as qemu
    from testbed.nodes.vm import relay as vmexec
    from testbed.hosts.ssh import client as ssh
    from testbed.model.hosts import Host
    import collectors.training as training

    attempt("trace", lambda: load_trace(H))
    attempt("records", lambda: read_jsonl(H))
    attempt("records-tail", lambda: JsonlTail(H).read())
    attempt("log-tail", lambda: len(tail_text(H)) <= 65536)  # a log's tail: its last 64 KiB at most
    (D / "state.json").symlink_to(H)
    attempt("monitor-state", lambda: prometheus.read_state(D))
    attempt("target", lambda: sd.read_target(H))
    (D / "rank0.jsonl").symlink_to(H)
    attempt("user-records", lambda: rank_records(D, 0))
    (D / "config.json").symlink_to(H)
    attempt("exporter-run", lambda: training._load(D))
    (D / "agent.json").symlink_to(H)
    attempt("vm-agent", lambda: vmexec.connect("nons", D))
    attempt("known-hosts", lambda: ssh.connect(Host("h", "127.0.0.1", "127.0.0.1", port=1, known_hosts=str(H))))
    attempt("ssh-key", lambda: ssh.connect(Host("h", "127.0.0.1", "127.0.0.1", port=1, key=str(H),
                                                known_hosts="/dev/null/none", accept_new_host_key=True)))
''')

REFUSED = {"trace", "records", "records-tail", "user-records", "vm-agent", "known-hosts", "ssh-key"}
"""Cases that must name the file; the others read nothing from it (a missing or unreadable
monitor state, target file, log or run is normal and means: none)."""


def test_every_other_reader_refuses_or_ignores_the_file(hostile, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    rc, out, rss, _ = _child([sys.executable, "-c", FUNCTIONS, str(hostile), str(d)], cwd=ROOT)
    assert rc == 0 and rss < MAX_RSS_MB, (rc, rss, out)
    got = {x["case"]: x for x in map(json.loads, [l for l in out.splitlines() if l.startswith("{")])}
    assert len(got) == 11, out
    for case in REFUSED:
        assert "error" in got[case] and any(w in got[case]["error"] for w in ("regular file", "more than", "longer than")), \
            got[case]
    for case in set(got) - REFUSED:
        assert got[case].get("ok") in ("None", "True"), got[case]
