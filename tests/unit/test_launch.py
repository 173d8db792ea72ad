"""The launcher's failure report names the rank that died first, not the first rank it polls."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.runs.launch import Launcher, RankFailed, RankProc


class _Testbed:
    here = "local"
    name = "unit"

    def why_stopped(self, name):
        return None

    def node(self, name):
        return name


def _rank(tmp_path: Path, rank: int, code: str) -> RankProc:
    log = tmp_path / f"rank{rank}.log"
    log.write_text(f"rank {rank} log\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    return RankProc(rank, f"w{rank}", proc, log, tmp_path / f"rank{rank}.jsonl")


def test_the_rank_that_died_first_is_named_even_when_a_lower_rank_died_of_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state" / "unit").mkdir(parents=True)
    (tmp_path / "state" / "unit" / "ledger.jsonl").touch()  # the testbed is up, not going
    launcher = Launcher.__new__(Launcher)
    launcher.tb, launcher.timeout, launcher.places, launcher._collected = _Testbed(), 300.0, {}, 0.0
    r1 = _rank(tmp_path, 1, "import os, signal, time; time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)")
    # rank 0 fails once its peer is gone (reaped), as gloo's "connection reset" makes it do
    r0 = _rank(tmp_path, 0, "import os, sys, time\nt = time.monotonic()\n"
                            f"while os.path.exists('/proc/{r1.proc.pid}') and time.monotonic() - t < 60:\n"
                            "    time.sleep(0.02)\nsys.exit(1)")
    launcher.ranks = [r0, r1]
    # one poll before either died, the next after both had: the order must come from the reaper
    with pytest.raises(RankFailed) as e:
        launcher.wait(interval=1.5)
    assert str(e.value).startswith("rank 1 (node w1) was killed by signal 9"), str(e.value)
    assert "rank 1 log" in str(e.value)


def test_the_wait_returns_when_the_last_rank_exits_not_at_its_next_poll(tmp_path, monkeypatch):
    """A rank's exit ends the launcher's nap: a run's end is seen as it happens (before, every
    run waited out the rest of a 0.5 s poll). The poll here is 60 s, so the wait can only have
    returned early by being woken."""
    import threading
    import time

    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state" / "unit").mkdir(parents=True)
    (tmp_path / "state" / "unit" / "ledger.jsonl").touch()
    launcher = Launcher.__new__(Launcher)
    launcher.tb, launcher.timeout, launcher.places, launcher._collected = _Testbed(), 300.0, {}, 0.0
    launcher.zygote, launcher._woken = None, threading.Event()
    launcher.ranks = [_rank(tmp_path, 0, "import time; time.sleep(0.3)")]
    launcher.ranks[0].woken = launcher._woken
    t0 = time.monotonic()
    launcher.wait(interval=60.0)
    assert launcher.ranks[0].proc.returncode == 0
    assert time.monotonic() - t0 < 30.0
