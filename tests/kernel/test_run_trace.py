"""`testbed run --bw-trace`: the bottleneck follows a trace during a run, recorded per iteration."""

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

from tests.helpers import dumbbell, pids_with
from tests.kernel.conftest import cli, cli_json, run

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ["--width", "0.5"]  # about 550 kB of gradients: communication dominates at 10 Mbit/s


def _rates(ns: str) -> list[str]:
    out = ""
    for dev in ("l2a", "l2b"):
        out += run(["tc", "-n", ns, "class", "show", "dev", dev]).stdout
    return sorted(w[i + 1] for w in (l.split() for l in out.splitlines()) for i, x in enumerate(w) if x == "rate")


def _replays() -> list[int]:
    return pids_with("--replay-id=")


def test_a_run_follows_a_trace_records_the_rate_per_iteration_and_restores(tmp_path, clean_kernel):
    topo = tmp_path / "rtr.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("rtr", rate="300mbit")))
    trace = tmp_path / "step.csv"
    trace.write_text("time_s,rate\n0,100mbit\n2,10mbit\n5,100mbit\n")
    cli_json("up", str(topo), "--no-exporter")
    try:
        # refused before anything runs: with --bw, and a trace the links cannot take
        r = cli("run", "allreduce", "-t", "rtr", "--bw", "10mbit", "--bw-trace", str(trace), "--json")
        assert r.returncode == 1 and "--bw and --bw-trace" in r.stdout
        bad = tmp_path / "bad.csv"
        bad.write_text("0,100mbit\n1,0mbit\n")
        r = cli("run", "allreduce", "-t", "rtr", "--bw-trace", str(bad), "--out", str(tmp_path / "no"), "--json")
        assert r.returncode == 1 and "bad.csv" in r.stdout and not list((tmp_path / "no").glob("*"))

        s = cli_json("run", "allreduce", "-t", "rtr", "--bw-trace", str(trace), "--out", str(tmp_path / "runs"),
                     "--max-iters", "50", *WORKLOAD, "--no-exporter")
        assert s["status"] == "ok" and s["bw"] == "trace step.csv" and s["bw_trace"]["steps_applied"] == 3
        by_rate = {x["rate_bps"]: x for x in s["bw_trace"]["iterations_by_rate"]}
        slow, fast = by_rate[10_000_000], by_rate[100_000_000]
        assert slow["iterations"] >= 2 and fast["iterations"] >= 10, by_rate
        # the iteration times follow the rate: ring all-reduce of 550 kB is 10x slower at 10 Mbit/s
        assert slow["mean_iter_s"] > 3 * fast["mean_iter_s"], by_rate
        run_dir = Path(s["run_dir"])
        recs = [json.loads(x) for x in (run_dir / "rank1.jsonl").read_text().splitlines()]
        assert all("link_rate_bps" in x for x in recs)
        assert {round(x["link_rate_bps"]) for x in recs} >= {10_000_000, 100_000_000}
        for x in recs:  # an iteration wholly at 10 Mbit/s is slow, wholly at 100 fast
            if x["link_rate_bps"] == 10e6:
                assert x["iter_s"] > 0.2, x
        samples = [json.loads(x) for x in (run_dir / "links.jsonl").read_text().splitlines()]
        assert {x["rate_bps"] for x in samples} >= {10_000_000, 100_000_000}, "links.jsonl follows the shape"
        steps = [json.loads(x) for x in (run_dir / "trace.jsonl").read_text().splitlines()]
        assert [x["rate"] for x in steps if x["event"] == "step"] == ["100mbit", "10mbit", "100mbit"]
        assert _rates("rtr") == ["300Mbit", "300Mbit"] and not _replays(), "shapes restored, replay gone"
        rep = cli_json("report", str(run_dir), "--out", str(tmp_path / "report"))
        assert f"timeline-{run_dir.name}.png" in rep["files"] and (tmp_path / "report" / f"timeline-{run_dir.name}.png").stat().st_size > 10_000
        assert "300mbit" in cli("link", "show", "--json").stdout

        # kill -9 of the run: its replay notices, puts the shapes back and exits
        loop = tmp_path / "loop.csv"
        loop.write_text("0,20mbit\n0.5,40mbit\n1,20mbit\n")
        p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "-t", "rtr", "--bw-trace",
                              str(loop), "--trace-loop", "--out", str(tmp_path / "runs2"), "--max-iters", "100000",
                              *WORKLOAD, "--no-exporter"], cwd=ROOT, env=dict(os.environ),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not list((tmp_path / "runs2").glob("*/rank0.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _rates("rtr")[0] in ("20Mbit", "40Mbit") and len(_replays()) == 1
        p.send_signal(signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 10
        while _replays() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _replays() and _rates("rtr") == ["300Mbit", "300Mbit"]
        # its ranks die with it (they would go on sending through the links under the next run)
        from testbed.net.netns import pids_in

        while list(pids_in(["rtr.w0", "rtr.w1"])) and time.monotonic() < deadline + 10:
            time.sleep(0.1)
        assert not list(pids_in(["rtr.w0", "rtr.w1"])), "the killed run's ranks are still running"
    finally:
        assert cli("down", "rtr").returncode == 0


def test_ctrl_c_of_a_run_with_a_trace_and_cross_traffic_restores_and_stops_everything(tmp_path, clean_kernel):
    topo = tmp_path / "rci.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("rci", rate="300mbit")))
    loop = tmp_path / "loop.csv"
    loop.write_text("0,20mbit\n0.5,40mbit\n1,20mbit\n")
    cli_json("up", str(topo), "--no-exporter")
    try:
        p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "-t", "rci", "--bw-trace",
                              str(loop), "--trace-loop", "--cross-traffic", "w0->w1,rate=5mbit", "--out",
                              str(tmp_path / "runs"), "--max-iters", "100000", *WORKLOAD, "--no-exporter"],
                             cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not list((tmp_path / "runs").glob("*/rank0.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)
        iperfs = pids_with("--logfile=")
        assert len(iperfs) == 2 and len(_replays()) == 1 and _rates("rci")[0] in ("20Mbit", "40Mbit")
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 1 and "interrupted" in err and "Traceback" not in err, err
        assert not _replays() and _rates("rci") == ["300Mbit", "300Mbit"]
        assert not [q for q in iperfs if Path(f"/proc/{q}").exists()], "the flows stopped"
        assert "300mbit" in cli("link", "show", "--json").stdout
    finally:
        assert cli("down", "rci").returncode == 0
