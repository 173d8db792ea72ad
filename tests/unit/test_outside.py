"""The spawner outside the rootless namespaces (:mod:`testbed.common.outside`), with real
processes: each case runs in a fresh interpreter (the spawner is forked, as
:func:`testbed.common.rootless.enter` forks it, from a process with one thread)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])


def _run(tmp_path: Path, body: str) -> str:
    code = "import os, signal, subprocess, sys, time\nfrom pathlib import Path\nfrom testbed.common import outside\n" \
           f"os.environ[outside.ENV] = outside.start(Path({str(tmp_path)!r}))\n" + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _alive(marker: str) -> list[int]:
    r = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


def test_a_process_gets_the_std_streams_handed_over_and_its_status_comes_back(tmp_path):
    out = _run(tmp_path, """
        p = outside.popen(["sh", "-c", "read x; echo got $x; echo err >&2; exit 3"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=open(os.devnull, "wb"))
        p.stdin.write(b"hello\\n"); p.stdin.close()
        print(p.stdout.read().decode().strip(), p.wait(10), p.poll())
        q = outside.popen(["sleep", "30"])
        try:
            q.wait(0.2)
        except subprocess.TimeoutExpired:
            print("still running", q.poll())
        q.terminate()
        print("ended", q.wait(10))
        """)
    assert out.split("\n")[:3] == ["got hello 3 3", "still running None", f"ended {-15}"]
    deadline = time.monotonic() + 10
    while list(tmp_path.glob("outside-*.sock")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(tmp_path.glob("outside-*.sock"))  # the spawner ended with the command that started it


def test_an_askers_end_ends_its_process_unless_detached(tmp_path):
    mark = f"{os.getpid()}{time.monotonic_ns() % 100000}"
    out = _run(tmp_path, f"""
        for tag, detach in (("1", False), ("2", True)):
            if os.fork() == 0:  # an asker that exits while its process runs
                p = outside.popen(["sleep", "{mark}" + tag], detach=detach)
                print(tag, p.pid, flush=True)
                os._exit(0)
            os.wait()
        time.sleep(1.0)
        """)
    pids = {line.split()[0]: int(line.split()[1]) for line in out.strip().splitlines()}
    try:
        deadline = time.monotonic() + 10
        while _alive(f"^sleep {mark}1") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(f"^sleep {mark}1") == []
        assert _alive(f"^sleep {mark}2") == [pids["2"]]  # detached: it outlives the asker and the spawner
    finally:
        for p in _alive(f"^sleep {mark}"):
            os.kill(p, 9)


def test_the_spawner_ends_what_it_started_when_the_command_ends(tmp_path):
    mark = f"{os.getpid()}{time.monotonic_ns() % 100000}9"
    _run(tmp_path, f"""
        p = outside.popen(["sleep", "{mark}"])
        assert p.poll() is None
        """)
    deadline = time.monotonic() + 10
    while _alive(f"^sleep {mark}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(f"^sleep {mark}") == []


def test_without_a_spawner_popen_says_so(monkeypatch):
    from testbed.common import outside

    monkeypatch.delenv(outside.ENV, raising=False)
    with pytest.raises(OSError, match="no spawner"):
        outside.popen(["true"])
