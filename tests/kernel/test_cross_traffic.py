"""Cross-traffic: iperf3 flows inside the nodes compete with training on the shaped links."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed import Testbed, load_topology_dict
from testbed.common.procs import argv_of
from testbed.runs.traffic import CrossTraffic
from testbed.model.flows import parse_spec
from tests.helpers import dumbbell, pids_with
from tests.kernel.conftest import cli, cli_json

pytestmark = [pytest.mark.kernel, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 not installed (apt-get install iperf3)")]
ROOT = Path(__file__).resolve().parents[2]
WIRE_PER_PAYLOAD = 1514 / 1448  # what tc counts per byte of TCP payload in full-size frames
RATE = 20e6


def _iperfs() -> list[int]:
    return pids_with("--logfile=")


def test_two_greedy_flows_split_the_bottleneck_evenly(clean_kernel, tmp_path):
    with Testbed.up(load_topology_dict(dumbbell("ctf", rate="20mbit"))) as tb:
        ct = CrossTraffic(tb, [parse_spec("w0->w1"), parse_spec("w0->w1")], tmp_path)
        t0 = time.time()
        ct.start()
        try:
            time.sleep(24)
        finally:
            ct.stop()
        assert not _iperfs()
        # two CUBIC flows on a drop-tail queue take turns for seconds at a time; with the
        # default queue they split 0.51-0.58 over 18-20 s (benchmarks/cross_traffic.py)
        s = ct.summary(t0 + 2, time.time())
        rates = [f["mean_bits_per_second"] for f in s]
        assert sum(rates) > 0.9 * 0.956 * RATE, rates  # together they fill the link
        for r in rates:
            assert 0.3 <= r / sum(rates) <= 0.7, rates


def test_a_run_shares_the_bottleneck_with_a_flow_and_leftovers_are_stopped(clean_kernel, tmp_path):
    topo = tmp_path / "ctr.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("ctr", rate="20mbit")))
    cli_json("up", str(topo), "--no-exporter")
    try:
        r = cli("run", "allreduce", "-t", "ctr", "--cross-traffic", "w0->w9", "--json")
        assert r.returncode == 1 and "'w9' is not a worker" in r.stdout
        s = cli_json("run", "allreduce", "-t", "ctr", "--cross-traffic", "w0->w1", "--out", str(tmp_path / "runs"),
                     "--max-iters", "25", "--width", "0.5", "--no-exporter")
        assert not _iperfs(), "the run stopped its flows"
        flow = s["cross_traffic"][0]
        assert flow["label"] == "w0->w1" and flow["seconds"] >= 3
        links = s["bottleneck"]["links"]
        fwd, rev = links["s0-s1 forward"]["bytes"], links["s0-s1 reverse"]["bytes"]
        # forward carries training (about what reverse carries: a 2-rank ring is symmetric) plus
        # the flow: tc's counters and iperf3's received bytes tell the same story
        took = s["bottleneck"]["seconds"]  # the counters' window: from the start of training
        cross_wire = flow["mean_bits_per_second"] / 8 * took * WIRE_PER_PAYLOAD
        assert abs(fwd - rev - cross_wire) < 0.15 * fwd, (fwd, rev, cross_wire)
        assert fwd * 8 / took > 0.85 * RATE, "training and the flow together fill the link"
        share = rev / fwd
        # the two shared the link: neither had it alone. On a quiet machine a synchronous
        # collective against a greedy flow gets 0.26-0.33 (benchmarks/cross_traffic.py); on a
        # loaded 2-core CI machine iperf3 itself is starved of CPU and the share rose to 0.65,
        # so the bound here is what sharing means, not the quiet machine's split
        assert 0.1 <= share <= 0.85, share
        recs = [json.loads(x) for x in (Path(s["run_dir"]) / "traffic.jsonl").read_text().splitlines()]
        assert sum("bits_per_second" in x for x in recs) >= 3 and recs[0]["label"] == "w0->w1"

        # kill -9 of a run leaves its flows; the next run on the testbed stops them
        p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "-t", "ctr", "--cross-traffic",
                              "w1->w0", "--out", str(tmp_path / "runs2"), "--max-iters", "100000", "--width", "0.5",
                              "--no-exporter"], cwd=ROOT, env=dict(os.environ),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not list((tmp_path / "runs2").glob("*/rank0.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_iperfs()) == 2
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert len(_iperfs()) == 2, "a killed run cannot stop its flows"
        from testbed.net.netns import pids_in
        for pid in pids_in(["ctr.w0", "ctr.w1"]):  # its orphaned ranks (iperf3 stays)
            if not any(a.startswith("--logfile=") for a in argv_of(pid)):
                os.kill(pid, signal.SIGKILL)
        s = cli_json("run", "allreduce", "-t", "ctr", "--cross-traffic", "none", "--out", str(tmp_path / "runs3"),
                     "--max-iters", "2", "--no-exporter")
        assert s["status"] == "ok" and "cross_traffic" not in s
        assert not _iperfs(), "the next run stopped the flows the killed one left"
    finally:
        assert cli("down", "ctr").returncode == 0
    assert not _iperfs()
