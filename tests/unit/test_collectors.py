"""Exporters without root: training records -> metrics, promtool, dashboards, compose files."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collectors.training import TrainingCollector

ROOT = Path(__file__).resolve().parents[2]


def _run_dir(tmp_path: Path, run_id="r1", ranks=2) -> Path:
    d = tmp_path / "runs" / run_id
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"args": {"scheme": "pactrain", "model": "cnn", "dataset": "digits"},
                                               "world_size": ranks, "dense_bytes": 1000}))
    (d / "run.json").write_text(json.dumps({"run_id": run_id, "request": {"bw": "100mbit", "testbed": "tb"}}))
    return d


def _append(path: Path, *records, partial: str = "") -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write(partial)


def _samples(reg) -> dict:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _it(rank, i, s, payload=500, tx=None):
    return {"rank": rank, "iter": i, "iter_s": s, "loss": 1.0 / i, "payload_bytes": payload, "tx_bytes": tx,
            "compute_s": 0.1}


def test_training_metrics_follow_the_records_incrementally(tmp_path):
    d = _run_dir(tmp_path)
    _append(d / "rank0.jsonl", _it(0, 1, 0.2, tx=1000), _it(0, 2, 0.7, payload=400, tx=3000))
    _append(d / "rank1.jsonl", _it(1, 1, 0.3), partial='{"rank": 1, "iter": 2, "iter_s"')
    _append(d / "eval.jsonl", {"iter": 2, "epoch": 0, "accuracy": 0.5})
    reg = CollectorRegistry()
    reg.register(TrainingCollector([tmp_path / "runs"]))
    s = _samples(reg)
    def lab(r, **extra):
        return tuple(sorted({"bw": "100mbit", "rank": str(r), "run_id": "r1", "scheme": "pactrain", **extra}.items()))
    assert s[("testbed_train_iterations_total", lab(0))] == 2
    assert s[("testbed_train_iterations_total", lab(1))] == 1  # the half-written line waits
    assert s[("testbed_train_payload_bytes_total", lab(0))] == 900
    assert s[("testbed_train_wire_bytes_total", lab(0))] == 3000
    assert s[("testbed_train_compression_ratio", lab(0))] == pytest.approx(0.4)
    assert s[("testbed_train_loss", lab(0))] == pytest.approx(0.5)
    assert s[("testbed_train_accuracy", lab(0))] == 0.5
    assert s[("testbed_train_iteration_seconds_count", lab(0))] == 2
    assert s[("testbed_train_iteration_seconds_sum", lab(0))] == pytest.approx(0.9)
    assert s[("testbed_train_iteration_seconds_bucket", lab(0, le="0.25"))] == 1
    assert s[("testbed_train_iteration_seconds_bucket", lab(0, le="1.0"))] == 2
    info = [k for k in s if k[0] == "testbed_run_info"]
    assert dict(info[0][1]) == {"run_id": "r1", "scheme": "pactrain", "model": "cnn", "dataset": "digits",
                                "bw": "100mbit", "world_size": "2", "testbed": "tb"}
    # the rest of the line arrives: counted once, earlier records not re-read
    with open(d / "rank1.jsonl", "a") as f:
        f.write(': 0.4, "loss": 0.1, "payload_bytes": 500}\n')
    _append(d / "rank0.jsonl", _it(0, 3, 20.0))
    s = _samples(reg)
    assert s[("testbed_train_iterations_total", lab(1))] == 2
    assert s[("testbed_train_iterations_total", lab(0))] == 3
    assert s[("testbed_train_payload_bytes_total", lab(0))] == 1400
    assert s[("testbed_train_iteration_seconds_bucket", lab(0, le="10.0"))] == 2
    assert s[("testbed_train_iteration_seconds_bucket", lab(0, le="+Inf"))] == 3


def test_cross_traffic_rates_and_bytes_follow_traffic_jsonl(tmp_path):
    d = _run_dir(tmp_path)
    _append(d / "traffic.jsonl", {"time": 1.0, "flow": 0, "event": "on", "label": "w0->w1"},
            {"time": 2.0, "flow": 0, "label": "w0->w1", "bits_per_second": 8e6, "bytes": 1e6, "interval_s": 1.0},
            {"time": 3.0, "flow": 0, "label": "w0->w1", "bits_per_second": 4e6, "bytes": 5e5, "interval_s": 1.0},
            {"time": 3.0, "flow": 1, "label": "w1->w0 x2", "bits_per_second": "x", "bytes": 1})
    reg = CollectorRegistry()
    reg.register(TrainingCollector([tmp_path / "runs"]))
    s = _samples(reg)
    lab = (("flow", "0"), ("label", "w0->w1"), ("run_id", "r1"))
    assert s[("testbed_cross_traffic_bits_per_second", lab)] == 4e6
    assert s[("testbed_cross_traffic_received_bytes_total", lab)] == 1.5e6
    assert not [k for k in s if k[0].startswith("testbed_cross") and ("flow", "1") in k[1]], "bad lines skipped"
    assert s[("testbed_cross_traffic_active", lab)] == 1
    _append(d / "traffic.jsonl", {"time": 4.0, "flow": 0, "event": "off", "label": "w0->w1", "for_s": 2.0})
    assert _samples(reg)[("testbed_cross_traffic_active", lab)] == 0
    _append(d / "traffic.jsonl", {"time": 6.0, "flow": 0, "event": "on", "label": "w0->w1", "for_s": 1})
    assert _samples(reg)[("testbed_cross_traffic_active", lab)] == 1
    (d / "summary.json").write_text("{}")  # the run ended: its flows were stopped before
    assert _samples(reg)[("testbed_cross_traffic_active", lab)] == 0


def test_run_start_and_end_times_for_annotations(tmp_path):
    import os
    d = _run_dir(tmp_path)
    _append(d / "rank0.jsonl", _it(0, 1, 0.2))
    os.utime(d / "config.json", (1000.0, 1000.0))  # training started (the workload wrote config.json)
    reg = CollectorRegistry()
    reg.register(TrainingCollector([tmp_path / "runs"], keep_s=float("inf")))
    lab = (("bw", "100mbit"), ("run_id", "r1"), ("scheme", "pactrain"), ("testbed", "tb"))
    s = _samples(reg)
    assert s[("testbed_run_start_time_seconds", lab)] == 1000.0
    assert ("testbed_run_end_time_seconds", lab) not in s  # still running
    _append(d / "rank0.jsonl", _it(0, 2, 0.2))
    os.utime(d / "rank0.jsonl", (1060.0, 1060.0))  # its last record
    (d / "summary.json").write_text("{}")
    s = _samples(reg)
    assert s[("testbed_run_end_time_seconds", lab)] == 1060.0
    os.utime(d / "summary.json", (2000.0, 2000.0))  # rewritten later (the monitoring note): the end stays
    assert _samples(reg)[("testbed_run_end_time_seconds", lab)] == 1060.0


def test_finished_runs_age_out_and_sweeps_are_found(tmp_path):
    import os
    d = _run_dir(tmp_path, "old")
    _append(d / "rank0.jsonl", _it(0, 1, 0.2))
    sweep = tmp_path / "runs" / "sweep-1"
    sweep.mkdir()
    new = _run_dir(tmp_path, "new")
    new.rename(sweep / "new")
    _append(sweep / "new" / "rank0.jsonl", _it(0, 1, 0.2))
    for f in d.iterdir():
        os.utime(f, (1, 1))
    reg = CollectorRegistry()
    reg.register(TrainingCollector([tmp_path / "runs"], keep_s=600))
    runs = {dict(k[1])["run_id"] for k in _samples(reg) if k[0] == "testbed_run_info"}
    assert runs == {"new"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_accepts_the_training_metrics(tmp_path):
    d = _run_dir(tmp_path)
    _append(d / "rank0.jsonl", _it(0, 1, 0.2, tx=10))
    _append(d / "eval.jsonl", {"iter": 1, "epoch": 0, "accuracy": 0.5})
    reg = CollectorRegistry()
    reg.register(TrainingCollector([tmp_path / "runs"]))
    r = subprocess.run(["promtool", "check", "metrics"], input=generate_latest(reg), capture_output=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_provisioning_points_at_files_that_exist(monkeypatch):
    compose = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    for svc in compose["services"].values():
        for v in svc.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith("."):
                assert (ROOT / "compose" / src).exists(), v
        assert svc["network_mode"] == "host"
    env = compose["services"]["grafana"]["environment"]
    assert env["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    assert "--web.listen-address=127.0.0.1:9090" in compose["services"]["prometheus"]["command"]
    ds = yaml.safe_load((ROOT / "compose/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "testbed-prometheus"
    prom_cfg = yaml.safe_load((ROOT / "compose/prometheus/prometheus.yml").read_text())
    rules_mount = dict(v.split(":")[:2][::-1] for v in compose["services"]["prometheus"]["volumes"])
    (rule_glob,) = prom_cfg["rule_files"]  # the shipped rules are mounted where the compose Prometheus looks
    local = ROOT / "compose" / rules_mount[str(Path(rule_glob).parent)]
    assert [p.name for p in local.glob(Path(rule_glob).name)] == ["testbed.rules.yml"]
    prov = yaml.safe_load((ROOT / "compose/grafana/provisioning/dashboards/testbed.yml").read_text())
    mounted = dict(v.split(":")[:2][::-1] for v in compose["services"]["grafana"]["volumes"] if v.startswith("."))
    assert prov["providers"][0]["options"]["path"] in mounted
    # the compose Prometheus discovers the same target files as `testbed monitor up`
    from testbed.monitor.sd import targets_dir

    prom = yaml.safe_load((ROOT / "compose/prometheus/prometheus.yml").read_text())
    (pattern,) = prom["scrape_configs"][0]["file_sd_configs"][0]["files"]
    mounts = dict(v.split(":")[:2][::-1] for v in compose["services"]["prometheus"]["volumes"])
    assert mounts[str(Path(pattern).parent)] == "/run/testbed/targets"
    monkeypatch.delenv("TESTBED_STATE_DIR", raising=False)
    assert targets_dir() == Path("/run/testbed/targets")  # where exporters announce themselves by default


def _compose_cmd():
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


@pytest.mark.skipif(_compose_cmd() is None, reason="neither docker-compose nor the docker compose plugin is installed")
def test_compose_file_validates_and_refuses_grafanas_default_password():
    argv = [*_compose_cmd(), "-f", str(ROOT / "compose" / "docker-compose.yml"), "--profile", "prometheus", "config"]
    env = {k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    r = subprocess.run(argv, capture_output=True, text=True, env={**env, "GRAFANA_ADMIN_PASSWORD": "s3cret-test"})
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret-test"
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in r.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_accepts_the_shipped_and_generated_configs(tmp_path):
    from testbed.monitor import rules
    from testbed.monitor.prometheus import config
    p = tmp_path / "prometheus.yml"
    (tmp_path / "rules.yml").write_text(rules.render())
    p.write_text(yaml.safe_dump(config("2s", [tmp_path / "state" / "targets", tmp_path / "targets"],
                                       [tmp_path / "rules.yml"])))
    for cfg in (p, ROOT / "compose" / "prometheus" / "prometheus.yml"):
        r = subprocess.run(["promtool", "check", "config", str(cfg)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def _wait_file(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


def test_exporter_announces_itself_in_a_target_file_and_withdraws_at_exit(tmp_path):
    d = _run_dir(tmp_path)
    _append(d / "rank0.jsonl", _it(0, 1, 0.2))
    target = tmp_path / "targets" / "runs.json"
    p = subprocess.Popen([sys.executable, "-m", "collectors", "--runs", str(tmp_path / "runs"), "--listen",
                          "127.0.0.1:0", f"--sd-file={target}", "--sd-label", "exporter=runs"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_file(target)
        (group,) = json.loads(target.read_text())
        assert group["labels"] == {"exporter": "runs"}
        host, port = group["targets"][0].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0  # the port bound, not the 0 asked for
        with urllib.request.urlopen(f"http://{group['targets'][0]}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert 'testbed_train_iterations_total{bw="100mbit",rank="0",run_id="r1",scheme="pactrain"} 1.0' in body
        assert "testbed_link_" not in body  # no links asked for: none exported
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=20)
    assert p.returncode == 0, out
    assert not target.exists()


@pytest.mark.parametrize("args, message", [
    ([], "nothing to export"),
    (["--runs", "x", "--sd-label", "no-equals"], "--sd-label"),
    (["--runs", "x", "--listen", "9464"], "--listen"),
])
def test_exporter_bad_arguments_are_named(args, message):
    r = subprocess.run([sys.executable, "-m", "collectors", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_run_exporter_waits_for_a_scrape_of_the_final_records(tmp_path, monkeypatch):
    from collectors.training import RunExporter

    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    d = _run_dir(tmp_path)
    target = tmp_path / "state" / "targets" / "run-tb-r1.json"
    e = RunExporter(d, target)
    try:
        assert json.loads(target.read_text())[0]["labels"] == {"exporter": "training"}
        t = time.monotonic()
        assert e.finish() is None and time.monotonic() - t < 5  # nobody scrapes, nobody watches: no wait

        def scrape_every(period: float, n: int) -> None:
            for _ in range(n):
                urllib.request.urlopen(e.url, timeout=10).read()
                time.sleep(period)

        scrape_every(0.3, 3)  # a Prometheus scraping every 0.3 s...
        _append(d / "rank0.jsonl", _it(0, 1, 0.2), _it(0, 2, 0.2))  # ...then the run's last records
        th = threading.Thread(target=scrape_every, args=(0.3, 4))
        th.start()
        t = time.monotonic()
        assert e.finish() is True  # a scrape that began after the final records came
        assert time.monotonic() - t < 10
        th.join()
        assert e.collector.runs[d].ranks[0].iterations == 2  # that scrape read the final records
    finally:
        e.close()
    assert not target.exists()


def test_run_exporter_waits_for_the_first_scrape_when_a_monitor_watches(tmp_path, monkeypatch):
    """A run shorter than Prometheus' discovery delay still gets scraped once, if someone watches."""
    from testbed.monitor.sd import watchers_dir
    from collectors.training import RunExporter

    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    watcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--config.file=X"])
    try:
        watchers_dir().mkdir(parents=True)
        (watchers_dir() / "m.json").write_text(json.dumps({"pid": watcher.pid, "marker": "--config.file=X",
                                                           "scrape_interval_s": 1}))
        e = RunExporter(_run_dir(tmp_path), tmp_path / "state" / "targets" / "run.json")
        try:
            timer = threading.Timer(1.0, lambda: urllib.request.urlopen(e.url, timeout=10).read())
            timer.start()
            t = time.monotonic()
            assert e.finish() is True
            assert 0.9 < time.monotonic() - t < 5
        finally:
            e.close()
    finally:
        watcher.kill()
        watcher.wait()
    # a note whose Prometheus is gone does not count
    e = RunExporter(_run_dir(tmp_path, run_id="r2"), tmp_path / "state" / "targets" / "run2.json")
    try:
        t = time.monotonic()
        assert e.finish() is None and time.monotonic() - t < 5  # counted, it would wait 14 s
    finally:
        e.close()


def test_prometheus_durations_in_seconds():
    from testbed.monitor.prometheus import _seconds

    assert [_seconds(x) for x in ("2s", "500ms", "1m30s", "1h", "junk")] == [2, 0.5, 90, 3600, 5.0]


def test_a_trace_runs_bw_label_names_its_trace(tmp_path):
    d = _run_dir(tmp_path)
    (d / "run.json").write_text(json.dumps({"run_id": "r1", "request": {"bw": None, "testbed": "tb",
                                                                        "bw_trace": {"file": "/x/step.csv"}}}))
    reg = CollectorRegistry()
    reg.register(TrainingCollector([tmp_path / "runs"]))
    (info,) = [dict(k[1]) for k in _samples(reg) if k[0] == "testbed_run_info"]
    assert info["bw"] == "trace step.csv"  # as the run's summary.json names it


def test_grafana_hint_names_the_password_compose_requires():
    from testbed.monitor.prometheus import GRAFANA_HINT

    compose = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    required = compose["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    var = required.split("${")[1].split(":")[0]
    assert var == "GRAFANA_ADMIN_PASSWORD" and f"export {var}=" in GRAFANA_HINT
    assert "compose/docker-compose.yml up -d grafana" in GRAFANA_HINT


def test_the_proof_is_exported_per_link_and_direction_once_the_summary_holds_it(tmp_path):
    d = _run_dir(tmp_path)
    _append(d / "rank0.jsonl", _it(0, 1, 0.2))
    reg = CollectorRegistry()
    reg.register(TrainingCollector([tmp_path / "runs"]))
    assert not any(k[0].startswith("testbed_run_proof") for k in _samples(reg))  # running: no verdict yet
    (d / "summary.json").write_text(json.dumps({"status": "ok"}))  # a user's code: written before the proof
    assert not any(k[0].startswith("testbed_run_proof") for k in _samples(reg))
    (d / "summary.json").write_text(json.dumps({"status": "bypassed", "proof": "bypassed", "proof_links": {
        "s1-s0 forward": {"bound_bytes": 1000, "measured_bytes": 10}, "s1-s0 reverse": {"bound_bytes": "x"}}}))
    s = _samples(reg)
    fwd = (("direction", "forward"), ("link", "s1-s0"), ("run_id", "r1"))
    assert s[("testbed_run_proof_bound_bytes", fwd)] == 1000 and s[("testbed_run_proof_measured_bytes", fwd)] == 10
    assert s[("testbed_run_proof_passed", (("run_id", "r1"),))] == 0
    assert not any(k[0] == "testbed_run_proof_bound_bytes" and ("direction", "reverse") in k[1] for k in s)


def test_a_scripts_records_of_the_wrong_types_are_ignored_not_crashed_on(tmp_path):
    d = _run_dir(tmp_path)
    _append(d / "rank0.jsonl", _it(0, 1, 0.2, tx=1000),
            {"rank": 0, "iter": "2", "iter_s": "x", "loss": [1], "payload_bytes": "big", "tx_bytes": {"a": 1},
             "compute_s": True, "accuracy": "high"}, {"rank": 0, "iter": 1e400, "iter_s": float("nan")})
    _append(d / "eval.jsonl", {"epoch": "one", "accuracy": None})
    (d / "rank0.jsonl").open("a").write("[" * 100000 + "\n")
    reg = CollectorRegistry()
    reg.register(TrainingCollector([tmp_path / "runs"]))
    s = _samples(reg)
    lab = tuple(sorted({"bw": "100mbit", "rank": "0", "run_id": "r1", "scheme": "pactrain"}.items()))
    assert s[("testbed_train_iterations_total", lab)] == 1
    assert s[("testbed_train_iteration_seconds_count", lab)] == 1
    assert s[("testbed_train_wire_bytes_total", lab)] == 1000
