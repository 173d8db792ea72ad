"""`testbed link replay`: a running link follows a trace, read back from tc counters."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from testbed import Testbed, load_topology_dict
from testbed.engine.replay import replay
from testbed.model.trace import parse_csv
from tests.helpers import TcSampler, dumbbell, iperf3, pids_with
from tests.kernel.conftest import cli, run

pytestmark = [pytest.mark.kernel]
ROOT = Path(__file__).resolve().parents[2]
TCP_PAYLOAD_PER_FRAME = 1448 / 1514  # a full-size frame's TCP payload (timestamps on) over what tc counts


def _htb_rates(ns: str, dev: str) -> list[str]:
    out = run(["tc", "-n", ns, "class", "show", "dev", dev]).stdout
    return [w[i + 1] for w in (l.split() for l in out.splitlines()) for i, x in enumerate(w) if x == "rate"]


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 not installed (apt-get install iperf3)")
def test_a_step_trace_is_followed_by_a_running_flow(clean_kernel):
    """200 -> 50 -> 200 Mbit/s while iperf3 runs: from one second after each change, every
    second's goodput (tc's byte counter, sampled every 50 ms, times the TCP payload of a
    full frame) is within [0.75, 1.0] of the step's rate (loose below: on a loaded machine a
    second of the flow can fall to 0.85 of it; a step not applied is off by four times)."""
    steps = [(0.0, 200e6), (3.0, 50e6), (6.0, 200e6)]
    trace = parse_csv([f"{t},{int(r / 1e6)}mbit" for t, r in steps], "steps")
    with Testbed.up(load_topology_dict(dumbbell(name="rpl", rate="1gbit"))) as tb:
        result = {}
        flow = threading.Thread(target=lambda: result.update(iperf3(tb, 15)))
        flow.start()
        with TcSampler(tb.egress[(2, "forward")]) as counter:
            deadline = time.monotonic() + 30
            while counter.recent_rate(0.5) < steps[0][1]:  # the flow is up, faster than the first step
                assert flow.is_alive() and time.monotonic() < deadline, "the flow never came up to speed"
                time.sleep(0.1)
            t0 = time.monotonic()
            res = replay(tb, tb.find_links(bottleneck=True), trace, duration_s=9.0)
            flow.join()

        def rate_between(a, b):
            return counter.rate_between(t0 + a, t0 + b)

        seen = []
        for (start, rate), end in zip(steps, [3.0, 6.0, 9.0]):
            for s in range(int(start) + 1, int(end)):  # each whole second from 1 s after the change
                wire = rate_between(s, s + 1)
                goodput = wire * TCP_PAYLOAD_PER_FRAME
                seen.append(round(goodput / rate, 3))
                # tc counts whole frames; 50 ms samples put up to one sample's burst in a second
                assert wire <= 1.05 * rate, (start, s, wire / 1e6)
                assert 0.75 * rate <= goodput <= 1.0 * rate, (start, s, goodput / 1e6)
        print("goodput / step rate, per second:", seen, "lateness:", res.lateness(), "slow reads:", counter.slow)
        assert [r["rate"] for r in res.steps] == ["200mbit", "50mbit", "200mbit"]
        assert res.lateness()["max_s"] < 2  # the 20 ms target is the benchmark's; here a sanity bound
        assert result["end"]["sum_received"]["bytes"] > 0, "the flow survived every change"
        assert _htb_rates("rpl", "l2a") + _htb_rates("rpl", "l2b") == ["200Mbit"] * 2, "the last step stays"
        assert tb.find_links(bottleneck=True)[0].forward.rate.bps == 200_000_000, "state follows"


def test_cli_replay_restores_on_ctrl_c_and_refuses_bad_traces(clean_kernel, tmp_path):
    topo = tmp_path / "rpc.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("rpc", rate="300mbit")))
    assert cli("up", str(topo), "--no-exporter").returncode == 0
    try:
        before = sorted(_htb_rates("rpc", "l2a") + _htb_rates("rpc", "l2b"))
        # bad input: refused before anything changes, named
        bad = tmp_path / "bad.csv"
        bad.write_text("0,100mbit\n2,100mbps\n")
        ok = tmp_path / "ok.csv"
        ok.write_text("0,100mbit\n")
        r = cli("link", "replay", "--bottleneck", str(bad), "--json")
        assert r.returncode == 1 and "bad.csv:2: '100mbps' is ambiguous" in json.loads(r.stdout)["error"]
        for args, words in [((str(bad),), "give LINK TRACE"), (("s0-s1", str(tmp_path / "none.csv")), "cannot read"),
                            (("nolink", str(ok)), "no link 'nolink'")]:
            r = cli("link", "replay", *args, "--json")
            assert r.returncode == 1 and words in r.stdout, r.stdout
        assert sorted(_htb_rates("rpc", "l2a") + _htb_rates("rpc", "l2b")) == before

        # a short trace to its end, with a log
        good = tmp_path / "good.csv"
        good.write_text("time_s,rate\n0,100mbit\n0.5,40mbit\n")
        log = tmp_path / "steps.jsonl"
        r = cli("link", "replay", "s0-s1", str(good), "--log", str(log), "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads(r.stdout)
        assert [s["rate"] for s in out["steps"]] == ["100mbit", "40mbit"] and not out["restored"]
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert [x["event"] for x in lines] == ["ready", "start", "step", "step"]
        assert [x["rate"] for x in lines[2:]] == ["100mbit", "40mbit"] and lines[1]["links"] == ["s0-s1"]
        assert _htb_rates("rpc", "l2a") == ["40Mbit"]
        assert cli("link", "set", "s0-s1", "--bw", "300mbit").returncode == 0

        # a looping trace stopped by Ctrl-C: the shapes from before come back
        loop = tmp_path / "loop.csv"
        loop.write_text("0,10mbit\n1,20mbit\n2,10mbit\n")
        p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "link", "replay", "--bottleneck", str(loop),
                              "--loop"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while "20Mbit" not in _htb_rates("rpc", "l2a") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _htb_rates("rpc", "l2a") == ["20Mbit"], "the trace was being followed"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 1 and "interrupted: the shapes from before were put back" in err, err
        assert "Traceback" not in err
        assert sorted(_htb_rates("rpc", "l2a") + _htb_rates("rpc", "l2b")) == before
        show = json.loads(cli("link", "show", "--json").stdout)
        assert "300mbit" in json.dumps(show) and "10mbit" not in json.dumps(show), "state agrees with the kernel"
    finally:
        assert cli("down", "rpc").returncode == 0


def test_background_replay_is_in_the_ledger_stopped_by_stop_and_by_down(clean_kernel, tmp_path):
    topo = tmp_path / "rbg.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("rbg", rate="300mbit")))
    loop = tmp_path / "loop.csv"
    loop.write_text("0,10mbit\n0.5,20mbit\n1,10mbit\n")
    assert cli("up", str(topo), "--no-exporter").returncode == 0
    try:
        before = sorted(_htb_rates("rbg", "l2a") + _htb_rates("rbg", "l2b"))
        # a bad trace is refused by the command itself, and nothing is started
        bad = tmp_path / "bad.csv"
        bad.write_text("0,10mbit\n1,0mbit\n")
        r = cli("link", "replay", "--bottleneck", str(bad), "--background", "--json")
        assert r.returncode == 1 and "bad.csv" in r.stdout and not pids_with("--replay-id="), r.stdout
        r = cli("link", "replay", "--bottleneck", str(loop), "--loop", "--background", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        started = json.loads(r.stdout)
        assert pids_with("--replay-id=") == [started["pid"]]
        ledger = Path(clean_kernel["state_dir"]) / "rbg" / "ledger.jsonl"
        assert '"StartReplay"' in ledger.read_text()
        seen = set()
        deadline = time.monotonic() + 20
        while len(seen) < 2 and time.monotonic() < deadline:
            seen.update(_htb_rates("rbg", "l2a"))
            time.sleep(0.05)
        assert seen == {"10Mbit", "20Mbit"}, seen
        status = json.loads(cli("link", "replay", "--stop", "--json").stdout)
        assert status["stopped"] == [started["pid"]] and not pids_with("--replay-id=")
        assert sorted(_htb_rates("rbg", "l2a") + _htb_rates("rbg", "l2b")) == before, "shapes put back"
        steps = [json.loads(x) for x in Path(started["log"]).read_text().splitlines()]
        assert [s["event"] for s in steps[:2]] == ["ready", "start"]
        assert {s["rate"] for s in steps[2:]} == {"10mbit", "20mbit"}

        # started again; then `down` removes it with the testbed
        assert cli("link", "replay", "s0-s1", str(loop), "--loop", "--background").returncode == 0
        assert len(pids_with("--replay-id=")) == 1
    finally:
        assert cli("down", "rbg").returncode == 0
    assert not pids_with("--replay-id="), "down stopped the background replay"


def test_a_replay_tied_to_a_process_puts_the_shapes_back_when_it_dies(clean_kernel, tmp_path):
    """What `run --bw-trace` relies on after `kill -9` of the run: its replay notices."""
    loop = tmp_path / "loop.csv"
    loop.write_text("0,10mbit\n0.5,20mbit\n1,10mbit\n")
    with Testbed.up(load_topology_dict(dumbbell("rtie", rate="300mbit"))) as tb:
        owner = subprocess.Popen(["sleep", "60"])
        try:
            from testbed.engine.replay import start_background

            bg = start_background(tb.name, loop, link="s0-s1", loop=True, while_pid=owner.pid)
            deadline = time.monotonic() + 20
            while _htb_rates("rtie", "l2a") not in (["10Mbit"], ["20Mbit"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _htb_rates("rtie", "l2a") in (["10Mbit"], ["20Mbit"])
            owner.kill()
            owner.wait()
            assert bg.proc.wait(10) == 0, bg.tail()
            assert _htb_rates("rtie", "l2a") == ["300Mbit"] and _htb_rates("rtie", "l2b") == ["300Mbit"]
        finally:
            owner.kill()


def test_a_topology_schedule_runs_from_up_and_ends_with_down(clean_kernel, tmp_path):
    d = dumbbell("rsch", rate="300mbit")
    d["links"][2]["schedule"] = [{"at": "0s", "rate": "10mbit"}, {"at": "500ms", "rate": "20mbit"},
                                 {"at": "1s", "rate": "10mbit"}]
    d["links"][2]["loop"] = True
    topo = tmp_path / "rsch.yaml"
    topo.write_text(yaml.safe_dump(d))
    assert cli("up", str(topo), "--no-exporter").returncode == 0
    try:
        assert len(pids_with("--replay-id=")) == 1
        seen = set()
        deadline = time.monotonic() + 20
        while len(seen) < 2 and time.monotonic() < deadline:
            seen.update(_htb_rates("rsch", "l2a") + _htb_rates("rsch", "l2b"))
            time.sleep(0.05)
        assert seen == {"10Mbit", "20Mbit"}, seen
        # a run cannot set the rate of links a replay is driving
        r = cli("run", "allreduce", "-t", "rsch", "--bw", "50mbit", "--out", str(tmp_path / "runs"), "--json")
        assert r.returncode == 1 and "trace replay(s) running in the background" in r.stdout, r.stdout
        assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
        # stopped, then started again from the topology by hand
        assert cli("link", "replay", "--stop").returncode == 0 and not pids_with("--replay-id=")
        assert _htb_rates("rsch", "l2a") == ["300Mbit"]
        r = cli("link", "replay", "s0-s1", "--from-topology", "--background", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["trace"] == "links[2].schedule", r.stdout
        r = cli("link", "replay", "w0-s0", "--from-topology", "--json")
        assert r.returncode == 1 and "has no schedule" in r.stdout
    finally:
        assert cli("down", "rsch").returncode == 0
    assert not pids_with("--replay-id=")


def test_a_schedule_with_delay_is_checked_for_netem_at_up(clean_kernel, tmp_path):
    from testbed.net.probe import netem_missing

    d = dumbbell("rsnd", rate="300mbit")
    d["links"][2]["schedule"] = [{"at": "0s", "rate": "10mbit", "delay": "5ms"}]
    topo = tmp_path / "rsnd.yaml"
    topo.write_text(yaml.safe_dump(d))
    r = cli("up", str(topo), "--no-exporter", "--json")
    if netem_missing():  # the topology's shapes need no netem; only its schedule does
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "links[2].schedule: schedule needs the netem qdisc" in json.loads(r.stdout)["error"]
    else:
        assert r.returncode == 0, r.stdout + r.stderr
        assert cli("down", "rsnd").returncode == 0
