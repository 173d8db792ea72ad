"""Monitoring's faults, injected for real: the link exporter killed during a run (the run goes
on; its summary says which samples Prometheus lacks), Prometheus killed during `monitor up`
(a clear error, nothing left), and Prometheus down while a run ends (the summary says the
final records were not scraped)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from testbed.common import procs
from testbed.net.netns import pids_in
from tests.helpers import dumbbell

from .conftest import cli, cli_json
from .test_monitor import _free_ports, _wait

pytestmark = [pytest.mark.kernel,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="no prometheus binary (apt-get install prometheus)")]


def _train(iters: int) -> list[str]:
    return ["--", "--dataset", "digits", "--epochs", "50", "--max-iters", str(iters), "--eval-every", "100000"]


def _link_exporter(state_dir: str, name: str) -> int:
    marker = f"--sd-file={state_dir}/targets/testbed-{name}.json"
    pids = procs.with_arg(marker)
    assert len(pids) == 1, (marker, pids)
    return pids[0]


def _start_run(tmp_path, name: str, iters: int = 200) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "-t", name, "--out",
                             str(tmp_path / "runs"), "--json", *_train(iters)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _await_training(tmp_path) -> None:
    deadline = time.monotonic() + 120
    while not list((tmp_path / "runs").glob("*/rank0.jsonl")):
        assert time.monotonic() < deadline, "the run never started training"
        time.sleep(0.2)


def test_the_link_exporter_killed_during_a_run_is_in_its_summary(clean_kernel, tmp_path):
    topo = tmp_path / "mf.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("mf")))
    cli_json("up", str(topo))
    try:
        run = _start_run(tmp_path, "mf", iters=60)
        _await_training(tmp_path)
        os.kill(_link_exporter(clean_kernel["state_dir"], "mf"), signal.SIGKILL)
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err  # the training went on
        # under --json stdout is the summary alone, and the warning still reaches stderr
        assert "warning: the link exporter of testbed 'mf' stopped" in err, err
        s = json.loads(out)
        assert s["status"] == "ok" and s["iterations"] == 60, s
        (exp,) = s["monitoring"]["exporters"]
        assert exp["running_at_start"] and 0 < exp["stopped_at_s"] < s["wall_s"] + 5, exp
        assert exp["missing"].startswith(f"link samples from {exp['stopped_at_s']:.1f} s"), exp
        assert len((next((tmp_path / "runs").iterdir()) / "links.jsonl").read_text().splitlines()) > 4
    finally:
        cli("down", "mf")


def test_an_uninterrupted_run_reports_no_missing_samples(clean_kernel, tmp_path):
    topo = tmp_path / "mo.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("mo")))
    r = cli("run", "allreduce", "--topology", str(topo), "--out", str(tmp_path / "runs"), "--json",
            "--", "--dataset", "digits", "--max-iters", "10")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    (exp,) = s["monitoring"]["exporters"]
    assert exp["running_at_start"] and "missing" not in exp and "stopped_at_s" not in exp, exp
    assert s["monitoring"]["final_scrape"] is None  # no Prometheus scrapes this run: nothing to miss
    assert "missing_training" not in s["monitoring"]


def test_prometheus_killed_during_monitor_up_fails_cleanly_and_leaves_nothing(clean_kernel, tmp_path):
    (port,) = _free_ports(1)
    mon = tmp_path / "mon"
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "monitor", "up", "--dir", str(mon), "--listen",
                          f"127.0.0.1:{port}", "--runs", str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    marker = f"--config.file={mon.resolve() / 'prometheus.yml'}"
    deadline = time.monotonic() + 30
    while not (pids := procs.with_arg(marker)):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.005)
    os.kill(pids[0], signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1, out + err
    assert "Traceback" not in err and "prometheus exited at start" in err, err
    assert not procs.with_arg(marker)
    assert not procs.with_arg(f"--sd-file={mon.resolve() / 'targets' / 'runs.json'}")  # its exporter went too
    assert not (mon / "state.json").exists()
    st = cli_json("monitor", "status", "--dir", str(mon))
    assert st["running"] is False


def test_prometheus_down_when_a_run_ends_leaves_the_final_scrape_missing(clean_kernel, tmp_path):
    (port,) = _free_ports(1)
    mon = tmp_path / "mon"
    cli_json("monitor", "up", "--dir", str(mon), "--listen", f"127.0.0.1:{port}", "--scrape-interval", "1s")
    try:
        topo = tmp_path / "mp.yaml"
        topo.write_text(yaml.safe_dump(dumbbell("mp")))
        cli_json("up", str(topo))
        run = _start_run(tmp_path, "mp", iters=60)
        _await_training(tmp_path)
        ranks = list(pids_in(["mp.w0", "mp.w1"]))
        for pid in ranks:  # the run waits, in its first iterations, however loaded the machine
            os.kill(pid, signal.SIGSTOP)
        try:  # Prometheus has scraped the run (so the run expects its final scrape), then goes
            seen = _wait(f"http://127.0.0.1:{port}", 'testbed_run_info{testbed="mp"}', bool, timeout=60)
            assert seen and run.poll() is None, "the run ended before Prometheus scraped it"
            prom = procs.with_arg(f"--config.file={mon.resolve() / 'prometheus.yml'}")
            os.kill(prom[0], signal.SIGKILL)
        finally:
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        s = json.loads(out)
        assert s["monitoring"]["final_scrape"] is False, s["monitoring"]
        assert "no scrape came after the run ended" in s["monitoring"]["missing_training"]
        assert cli_json("monitor", "status", "--dir", str(mon))["running"] is False
    finally:
        cli("down", "mp")
        cli("monitor", "down", "--dir", str(mon))
