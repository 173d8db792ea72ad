"""e2e: a real Prometheus (Debian's package) discovers and scrapes the exporters of a testbed and a real run."""

from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from collectors import dashboards
from testbed.monitor import rules
from tests.helpers import dumbbell
from tests.kernel.conftest import cli, cli_json

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="no prometheus binary (apt-get install prometheus)")


def _free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all held open while choosing, so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _query(url: str, expr: str, headers: dict | None = None) -> list[dict]:
    """``headers``: an ordinary user's Prometheus asks for their credentials (testbed.monitor.auth)."""
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(urllib.request.Request(f"{url}/api/v1/query?{q}", headers=headers or {}),
                                timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _range(url: str, expr: str, start: float, end: float | None = None) -> list[dict]:
    """What a Grafana time-series panel asks for: the expression over [start, end or now]."""
    end = time.time() if end is None else end
    q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _wait(url: str, expr: str, ok, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        res = _query(url, expr)
        if ok(res) or time.monotonic() > deadline:
            return res
        time.sleep(0.5)


def _marks(prom: str, expr: str, since: float, link: str) -> list[float]:
    """The moments (Unix time) a value-is-time annotation ``expr`` marks on ``link`` since
    ``since``, waiting up to 15 s for a scrape to bring the last one."""
    deadline = time.monotonic() + 15
    while True:
        got = sorted({float(v) / 1000 for r in _range(prom, expr, since) if r["metric"].get("link") == link
                      for _, v in r["values"]})
        if (got and max(got) > since) or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def _labels(res: list[dict], name: str) -> set[str]:
    return {r["metric"].get(name, "") for r in res}


def test_prometheus_scrapes_links_and_training_and_every_dashboard_query_has_data(tmp_path, clean_kernel):
    mdir, runs = tmp_path / "monitor", tmp_path / "runs"
    runs.mkdir()
    trace = tmp_path / "mon.csv"  # the bottleneck steps 40 -> 30 Mbit/s one second into training
    trace.write_text("time_s,rate\n0,40mbit\n1,30mbit\n")
    bw = "trace mon.csv"  # the run's bw label, as its summary names it
    (pport,) = _free_ports(1)
    targets = Path(clean_kernel["state_dir"]) / "targets"
    topo = tmp_path / "mon.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("mon", rate="50mbit")))
    t0 = time.time()
    try:
        st = cli_json("monitor", "up", "--dir", str(mdir), "--listen", f"127.0.0.1:{pport}",
                      "--scrape-interval", "1s")
        prom = st["prometheus_url"]
        assert str(targets) in st["targets"]
        # another `monitor up` on the same directory is refused while this one runs
        again = cli("monitor", "up", "--dir", str(mdir))
        assert again.returncode == 1 and "already running" in again.stderr
        # `up` starts the testbed's link exporter and announces it; Prometheus finds it by itself
        tb = cli_json("up", str(topo))
        assert tb["exporter"].startswith("http://127.0.0.1:")
        assert [p.name for p in targets.iterdir()] == ["testbed-mon.json"]
        _wait(prom, 'up{exporter="links"}', lambda r: r and r[0]["value"][1] == "1")
        r0 = time.time()
        s = cli_json("run", "allreduce", "-t", "mon", "--bw-trace", str(trace), "--out", str(runs),
                     "--max-iters", "30", "--eval-every", "15", "--cross-traffic", "w0->w1,rate=4mbit")
        r1 = time.time()
        assert s["status"] == "ok" and s["bw"] == bw and s["bw_trace"]["steps_applied"] == 2
        run_id, iters = s["run_id"], s["iterations"]
        # The run's own exporter is gone (so its series are stale now: last_over_time reads
        # them), and before going it waited for a scrape of its final records.
        assert [p.name for p in targets.iterdir()] == ["testbed-mon.json"]
        res = _wait(prom, f'last_over_time(testbed_train_iterations_total{{run_id="{run_id}",rank="0"}}[5m])',
                    lambda r: r and float(r[0]["value"][1]) == iters, timeout=30)  # no exporter to scrape now
        assert res and float(res[0]["value"][1]) == iters, res
        acc = _query(prom, f'last_over_time(testbed_train_accuracy{{run_id="{run_id}"}}[5m])')
        assert float(acc[0]["value"][1]) == pytest.approx(s["final_accuracy"])  # the last evaluation

        # links: counters per direction with the topology's labels, the run's rate seen while it ran
        want = 2 * s["mean_payload_bytes"] * iters  # a 2-rank all-reduce crosses the link once each way
        res = _wait(prom, 'testbed_link_transmit_bytes_total{testbed="mon",bottleneck="true"}',
                    lambda r: sum(float(x["value"][1]) for x in r) >= want, timeout=15)
        by_dir = {r["metric"]["direction"]: r for r in res}
        assert set(by_dir) == {"forward", "reverse"}
        assert {by_dir["forward"]["metric"]["src"], by_dir["forward"]["metric"]["dst"]} == {"s0", "s1"}
        assert sum(float(r["value"][1]) for r in res) >= want
        cap = _query(prom, 'min_over_time(testbed_link_capacity_bytes_per_second{testbed="mon",link="s0-s1"}[5m])')
        assert {float(r["value"][1]) for r in cap} == {30e6 / 8}  # the trace's second step
        # restored after the run: seen from the next scrape on
        now = _wait(prom, 'testbed_link_capacity_bytes_per_second{testbed="mon",link="s0-s1"}',
                    lambda r: {float(x["value"][1]) for x in r} == {50e6 / 8}, timeout=15)
        assert {float(r["value"][1]) for r in now} == {50e6 / 8}
        assert len(_query(prom, 'testbed_link_capacity_bytes_per_second{testbed="mon"}')) == 6  # 3 links x 2

        # training: run info and per-rank series with the documented labels
        info = _query(prom, f'last_over_time(testbed_run_info{{run_id="{run_id}"}}[5m])')
        assert len(info) == 1
        m = info[0]["metric"]
        assert (m["scheme"], m["model"], m["dataset"], m["bw"], m["testbed"]) == ("allreduce", "cnn", "digits",
                                                                                   bw, "mon")
        pay = _query(prom, f'last_over_time(testbed_train_payload_bytes_total{{run_id="{run_id}"}}[5m])')
        assert {r["metric"]["rank"] for r in pay} == {"0", "1"}
        assert all(r["metric"]["scheme"] == "allreduce" and r["metric"]["bw"] == bw for r in pay)
        assert float(pay[0]["value"][1]) == pytest.approx(s["mean_payload_bytes"] * iters, rel=0.01)

        cross = _query(prom, f'last_over_time(testbed_cross_traffic_received_bytes_total{{run_id="{run_id}"}}[5m])')
        assert cross[0]["metric"]["label"] == "w0->w1 4mbit" and float(cross[0]["value"][1]) > 0

        # run start and end, as the annotations mark them: within the run's wall-clock span
        t1 = time.time()
        for m in ("start", "end"):
            (when,) = _query(prom, f'last_over_time(testbed_run_{m}_time_seconds{{run_id="{run_id}"}}[5m])')
            assert t0 < float(when["value"][1]) < t1, (m, when)
        # the dashboards' shape annotation marks each change at its moment (the value is the
        # time): the trace's steps and their restore during the run, then a `testbed link set`
        links_json = json.loads((dashboards.OUT / "links.json").read_text())
        (shape,) = [a["expr"] for a in links_json["annotations"]["list"] if a["name"].startswith("Link shape")]
        shape = shape.replace("$__rate_interval", "5s").replace("$testbed", "mon").replace("$link", ".*")
        assert len([m for m in _marks(prom, shape, t0, "s0-s1") if r0 < m < r1]) >= 2, "trace and restore unmarked"
        t_set = time.time()
        cli_json("link", "set", "s0-s1", "--bw", "45mbit")
        _wait(prom, 'testbed_link_capacity_bytes_per_second{testbed="mon",link="s0-s1"}',
              lambda r: {float(x["value"][1]) for x in r} == {45e6 / 8}, timeout=15)
        assert any(m > t_set for m in _marks(prom, shape, t1, "s0-s1")), "link set not marked"

        # every panel expression, annotation query and variable query of every shipped dashboard
        # returns data from this Prometheus, over the test's time range as Grafana asks for it;
        # each variable lists the value this run has
        subst = {"$__rate_interval": "5s", "$__range": "5m", "$testbed": "mon", "$link": ".*", "$run_id": run_id,
                 "$bw": bw, "$scheme": "allreduce", "$rank": ".*"}
        values = {"testbed": {"mon"}, "link": {"s0-s1"}, "run_id": {run_id}, "bw": {bw}, "scheme": {"allreduce"},
                  "rank": {"0", "1"}}
        for name in dashboards.NAMES:
            shipped = json.loads((dashboards.OUT / name).read_text())
            variables = {f"variable {v['name']!r}": v["name"] for v in shipped["templating"]["list"]}
            for where, expr in dashboards.expressions(shipped):
                q = expr
                for k, v in subst.items():
                    q = q.replace(k, v)
                assert "$" not in q, q
                res = _range(prom, q, t0)
                assert res, f"{name}: no data for {where}: {q}"
                if where in variables:
                    assert values[variables[where]] <= _labels(res, variables[where]), (name, where)
                if where.startswith("annotation 'Link shape"):  # the trace's steps (and the link set above)
                    assert "s0-s1" in _labels(_range(prom, q, t0, t1), "link"), (name, res)

        # the shipped rules are loaded and the recording rules record this testbed and run
        with urllib.request.urlopen(f"{prom}/api/v1/rules", timeout=10) as r:
            loaded = {x.get("name") for g in json.loads(r.read())["data"]["groups"] for x in g["rules"]}
        assert {x.get("record") or x.get("alert") for x in rules.RECORDING + rules.ALERTS} <= loaded
        for rec, sel in (("testbed:link_utilisation:ratio_rate1m", 'testbed="mon",link="s0-s1"'),
                         ("testbed:bottleneck_transmit_bytes:rate1m", 'testbed="mon"'),
                         ("testbed:run_payload_bytes:rate1m", f'testbed="mon",run_id="{run_id}"'),
                         ("testbed:run_iterations:rate1m", f'testbed="mon",run_id="{run_id}"')):
            assert _range(prom, f"{rec}{{{sel}}}", t0), rec

        # Prometheus lets go of the finished run's target at its next discovery update (<= ~10 s)
        deadline = time.monotonic() + 20
        while True:
            status = cli_json("monitor", "status", "--dir", str(mdir))
            seen = [(t["exporter"], t["health"]) for t in status["targets"]]
            if seen == [("links", "up")] or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert status["running"] and seen == [("links", "up")]
        assert cli_json("down", "mon") == {"removed": ["mon"]}
        assert list(targets.iterdir()) == []  # the link exporter stopped with its testbed

        # a run that makes its own testbed: its --bw is set before Prometheus can have found
        # the new exporter, and is still marked at its moment
        r0 = time.time()
        s = cli_json("run", "allreduce", "--topology", str(topo), "--bw", "20mbit", "--out", str(runs),
                     "--max-iters", "6")
        marks = [m for m in _marks(prom, shape, r0, "s0-s1") if r0 < m < time.time()]
        assert marks and s["status"] == "ok", (marks, s.get("status"))
    finally:
        cli("down", "mon")
        down = cli_json("monitor", "down", "--dir", str(mdir))
    assert len(down["stopped"]) == 1
    assert cli_json("monitor", "status", "--dir", str(mdir))["running"] is False
    assert (mdir / "data").is_dir()  # the history stays


def test_monitor_bad_input_is_refused_cleanly(tmp_path):
    r = cli("monitor", "up", "--dir", str(tmp_path / "m"), "--listen", "9090")
    assert r.returncode == 1 and "--listen" in r.stderr and "Traceback" not in r.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("monitor", "up", "--dir", str(tmp_path / "m"), "--listen", f"127.0.0.1:{port}")
    assert r.returncode == 1 and "in use" in r.stderr
    assert not (tmp_path / "m" / "state.json").exists()


def test_monitor_exports_runs_of_plain_torchrun_with_runs(tmp_path, clean_kernel):
    """`monitor up --runs DIR` adds an exporter of run directories written without testbed."""
    run = tmp_path / "runs" / "tr1"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"args": {"scheme": "topk", "model": "cnn", "dataset": "digits"},
                                                 "world_size": 2, "dense_bytes": 1000}))
    (run / "rank0.jsonl").write_text(json.dumps({"rank": 0, "iter": 3, "iter_s": 0.1, "payload_bytes": 10}) + "\n")
    mdir = tmp_path / "monitor"
    (pport,) = _free_ports(1)
    try:
        st = cli_json("monitor", "up", "--dir", str(mdir), "--listen", f"127.0.0.1:{pport}", "--runs",
                      str(tmp_path / "runs"), "--scrape-interval", "1s")
        assert st["exporter_url"].startswith("http://127.0.0.1:")
        res = _wait(st["prometheus_url"], 'testbed_train_iterations_total{run_id="tr1",exporter="runs"}',
                    lambda r: bool(r))
        assert [float(r["value"][1]) for r in res] == [3.0]
    finally:
        down = cli_json("monitor", "down", "--dir", str(mdir))
    assert sorted(s.split()[0] for s in down["stopped"]) == ["exporter", "prometheus"]
    assert not (mdir / "targets" / "runs.json").exists()


def test_monitor_listens_on_ipv6_loopback(tmp_path):
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    mdir = tmp_path / "m6"
    try:
        st = cli_json("monitor", "up", "--dir", str(mdir), "--listen", f"[::1]:{port}")
        assert st["prometheus_url"] == f"http://[::1]:{port}"
        with urllib.request.urlopen(st["prometheus_url"] + "/-/ready", timeout=10) as r:
            assert r.status == 200
    finally:
        cli("monitor", "down", "--dir", str(mdir))
