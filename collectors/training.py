"""Per run and rank: training progress read from the run directories' records at scrape time.

A run directory (``testbed run``, or ``python -m workloads.train --out DIR`` under plain
torchrun) holds ``config.json``, ``rank{R}.jsonl`` and ``eval.jsonl``; ``run.json`` adds
the run id and bandwidth when testbed launched it. Each scrape reads only what was
appended since the last one (files are JSON lines, flushed per iteration), so the cost
does not grow with the length of a run. Runs whose files have not changed for
``keep_s`` seconds are no longer exported (Prometheus keeps their history).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from testbed.common.errors import TestbedError
from testbed.common.files import JsonlTail, read_json

LABELS = ["run_id", "scheme", "rank", "bw"]
INFO_LABELS = ["run_id", "scheme", "model", "dataset", "bw", "world_size", "testbed"]
TIME_LABELS = ["run_id", "scheme", "bw", "testbed"]
ITER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _num(v) -> float | None:
    """``v`` when it is a finite number (not a bool), else None: records are untrusted input."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) > 1e300:
        return None
    return v


@dataclass
class _Rank:
    tail: JsonlTail
    iterations: int = 0
    loss: float | None = None
    payload: float = 0
    last_payload: float | None = None
    tx_bytes: float | None = None
    compute_s: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(ITER_BUCKETS))
    iter_sum: float = 0.0


@dataclass
class _Run:
    path: Path
    run_id: str
    info: dict
    dense_bytes: int | None
    ranks: dict[int, _Rank] = field(default_factory=dict)
    evals: JsonlTail | None = None
    accuracy: float | None = None
    epoch: float | None = None
    traffic: JsonlTail | None = None
    flows: dict[int, dict] = field(default_factory=dict)
    """Cross-traffic flow -> label, last rate (bit/s), bytes received so far, on (its last on/off event)."""
    start_s: float | None = None
    """When training started: config.json's mtime (the workload writes it then; a trace starts on it)."""
    end_s: float | None = None
    """When training ended, once summary.json exists: the newest rank record's mtime."""
    proof: dict | None = None
    """Once summary.json holds it: {"verdict", "links": {(link, direction): (bound, measured)}}."""

    def update(self) -> None:
        for p in self.path.glob("rank*.jsonl"):
            try:
                r = int(p.stem[4:])
            except ValueError:
                continue
            st = self.ranks.setdefault(r, _Rank(JsonlTail(p)))
            for rec in st.tail.read():  # a user's script writes these: a value that is no number is none
                st.iterations = max(st.iterations, int(_num(rec.get("iter")) or 0))
                st.loss = _num(rec.get("loss"))
                pb = _num(rec.get("payload_bytes")) or 0
                st.payload += pb
                st.last_payload = pb
                if _num(rec.get("tx_bytes")) is not None:
                    st.tx_bytes = _num(rec["tx_bytes"])
                st.compute_s += _num(rec.get("compute_s")) or 0.0
                if r == 0 and _num(rec.get("accuracy")) is not None:
                    self.accuracy = rec["accuracy"]  # the records contract: a user's script evaluates in place
                s = _num(rec.get("iter_s"))
                if s is not None:
                    st.iter_sum += s
                    for i, le in enumerate(ITER_BUCKETS):
                        if s <= le:
                            st.buckets[i] += 1
        for rec in self.evals.read() if self.evals is not None else ():
            self.accuracy = _num(rec.get("accuracy"))
            self.epoch = _num(rec.get("epoch"))
        if self.proof is None and (self.path / "summary.json").exists():
            self.proof = _proof(self.path / "summary.json")
        if self.end_s is None and (self.path / "summary.json").exists():
            ends = [_mtime(p) for p in self.path.glob("rank*.jsonl")]
            self.end_s = max((e for e in ends if e), default=None) or _mtime(self.path / "summary.json")
            for f in self.flows.values():
                f["on"] = False  # the run stopped its cross-traffic before writing its summary
        for rec in self.traffic.read() if self.traffic is not None else ():
            flow, bps, got = rec.get("flow"), rec.get("bits_per_second"), rec.get("bytes")
            if isinstance(flow, int) and rec.get("event") in ("on", "off"):
                f = self.flows.setdefault(flow, {"label": str(rec.get("label", flow))[:128], "bytes": 0.0})
                f["on"] = rec["event"] == "on"
                continue
            if not isinstance(flow, int) or not isinstance(bps, (int, float)) or not isinstance(got, (int, float)):
                continue  # on/off events, or a damaged line
            f = self.flows.setdefault(flow, {"label": str(rec.get("label", flow))[:128], "bytes": 0.0})
            f["bps"] = bps
            f["bytes"] += got


def _proof(path: Path) -> dict | None:
    """The proof in a summary.json (None until testbed wrote it there; bad values left out)."""
    try:
        s = read_json(path, "json", "summary")
    except (OSError, ValueError, TestbedError):
        return None
    links = s.get("proof_links") if isinstance(s, dict) else None
    if not isinstance(links, dict) or not isinstance(s.get("proof"), str):
        return None
    out = {}
    for name, row in list(links.items())[:4096]:
        link, _, direction = str(name).rpartition(" ")
        if isinstance(row, dict) and all(type(row.get(k)) is int for k in ("bound_bytes", "measured_bytes")):
            out[(link[:128], direction[:16])] = (row["bound_bytes"], row["measured_bytes"])
    return {"verdict": s["proof"], "links": out}


def _load(path: Path) -> _Run | None:
    try:
        config = read_json(path / "config.json", "json", "config file")
    except (OSError, ValueError, TestbedError):
        return None
    try:
        run = read_json(path / "run.json", "json", "run file")
    except (OSError, ValueError, TestbedError):
        run = {}
    req = run.get("request") or {}
    args = config.get("args") or {}
    run_id = run.get("run_id") or path.name
    trace = req.get("bw_trace") if isinstance(req.get("bw_trace"), dict) else None
    bw = req.get("bw") or (f"trace {Path(str(trace.get('file', ''))).name}" if trace else "")  # as summary.json says
    info = {"run_id": run_id, "scheme": str(args.get("variant") or args.get("scheme", "")), "model": str(args.get("model", "")),
            "dataset": str(args.get("dataset", "")), "bw": str(bw),
            "world_size": str(config.get("world_size", "")), "testbed": str(req.get("testbed") or "")}
    r = _Run(path, run_id, info, config.get("dense_bytes"), start_s=_mtime(path / "config.json"))
    r.evals = JsonlTail(path / "eval.jsonl")
    r.traffic = JsonlTail(path / "traffic.jsonl")
    return r


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _newest_mtime(path: Path) -> float:
    try:
        return max(e.stat().st_mtime for e in os.scandir(path) if e.is_file())
    except ValueError:
        return 0.0


class TrainingCollector(Collector):
    def __init__(self, dirs: Iterable[Path], keep_s: float = 3600.0):
        """``dirs``: run directories, or directories holding them (``runs/``, a sweep)."""
        self.dirs = [Path(d) for d in dirs]
        self.keep_s = keep_s
        self.runs: dict[Path, _Run] = {}

    def _discover(self) -> list[_Run]:
        now = time.time()
        found: list[Path] = []
        for d in self.dirs:
            if (d / "config.json").exists():
                found.append(d)
                continue
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                if e.is_dir():
                    p = Path(e.path)
                    if (p / "config.json").exists():
                        found.append(p)
                    elif e.name.startswith("sweep-"):
                        found.extend(Path(x.path) for x in os.scandir(p)
                                     if x.is_dir() and (Path(x.path) / "config.json").exists())
        live = []
        for p in found:
            if now - _newest_mtime(p) > self.keep_s:
                self.runs.pop(p, None)
                continue
            if p not in self.runs:
                r = _load(p)
                if r is None:
                    continue
                self.runs[p] = r
            live.append(self.runs[p])
        for p in set(self.runs) - set(found):
            del self.runs[p]
        return live

    def collect(self):
        info = GaugeMetricFamily("testbed_run_info", "A run's scheme, model, dataset and bottleneck rate (always 1).",
                                 labels=INFO_LABELS)
        iters = CounterMetricFamily("testbed_train_iterations", "Training iterations completed.", labels=LABELS)
        loss = GaugeMetricFamily("testbed_train_loss", "Training loss of the rank's last batch.", labels=LABELS)
        acc = GaugeMetricFamily("testbed_train_accuracy", "Test accuracy of the last evaluation, 0-1 (rank 0).",
                                labels=LABELS)
        epoch = GaugeMetricFamily("testbed_train_epoch", "Epoch of the last evaluation.", labels=LABELS)
        hist = HistogramMetricFamily("testbed_train_iteration_seconds",
                                     "Seconds per training iteration (forward, backward with communication, step).",
                                     labels=LABELS)
        payload = CounterMetricFamily("testbed_train_payload_bytes",
                                      "Bytes the rank handed to collectives (the scheme's payload).", labels=LABELS)
        wire = CounterMetricFamily("testbed_train_wire_bytes",
                                   "Bytes the rank's data-plane interface transmitted (its tx counter).", labels=LABELS)
        compute = CounterMetricFamily("testbed_train_compute_seconds",
                                      "Forward and backward computation seconds (DDP's timers).", labels=LABELS)
        ratio = GaugeMetricFamily("testbed_train_compression_ratio",
                                  "Payload of the last iteration over the dense gradient bytes (1 = uncompressed).",
                                  labels=LABELS)
        flow_labels = ["run_id", "flow", "label"]
        cross = GaugeMetricFamily("testbed_cross_traffic_bits_per_second",
                                  "A cross-traffic flow's rate as its iperf3 server received it, last second.",
                                  labels=flow_labels)
        cross_bytes = CounterMetricFamily("testbed_cross_traffic_received_bytes",
                                          "Bytes a cross-traffic flow's iperf3 server received.", labels=flow_labels)
        start = GaugeMetricFamily("testbed_run_start_time_seconds", "When the run's training started (Unix time).",
                                  labels=TIME_LABELS)
        end = GaugeMetricFamily("testbed_run_end_time_seconds",
                                "When the run's training ended (Unix time); absent while it runs.", labels=TIME_LABELS)
        active = GaugeMetricFamily("testbed_cross_traffic_active",
                                   "1 while a cross-traffic flow is on, 0 while it is off.", labels=flow_labels)
        proof_labels = ["run_id", "link", "direction"]
        proven = GaugeMetricFamily("testbed_run_proof_passed", "1 when every link carried the bytes the run's "
                                   "collectives must move across it, else 0; absent until the run ends.",
                                   labels=["run_id"])
        bound = GaugeMetricFamily("testbed_run_proof_bound_bytes", "Bytes the run's collectives must move across "
                                  "the link in this direction (the proof's lower bound).", labels=proof_labels)
        measured = GaugeMetricFamily("testbed_run_proof_measured_bytes", "Bytes the link's tc counters measured in "
                                     "this direction over the run (L2, headers included).", labels=proof_labels)
        for run in self._discover():
            run.update()
            i = run.info
            info.add_metric([i[k] for k in INFO_LABELS], 1)
            if run.start_s is not None:
                start.add_metric([i[k] for k in TIME_LABELS], run.start_s)
            if run.end_s is not None:
                end.add_metric([i[k] for k in TIME_LABELS], run.end_s)
            if run.proof is not None:
                proven.add_metric([run.run_id], 1 if run.proof["verdict"] == "passed" else 0)
                for (link, d), (b, m) in run.proof["links"].items():
                    bound.add_metric([run.run_id, link, d], b)
                    measured.add_metric([run.run_id, link, d], m)
            for n, f in sorted(run.flows.items()):
                if "bps" in f:
                    cross.add_metric([run.run_id, str(n), f["label"]], f["bps"])
                    cross_bytes.add_metric([run.run_id, str(n), f["label"]], f["bytes"])
                if "on" in f:
                    active.add_metric([run.run_id, str(n), f["label"]], 1 if f["on"] else 0)
            if run.accuracy is not None:
                acc.add_metric([run.run_id, i["scheme"], "0", i["bw"]], run.accuracy)
                epoch.add_metric([run.run_id, i["scheme"], "0", i["bw"]], run.epoch or 0)
            for r, st in sorted(run.ranks.items()):
                labels = [run.run_id, i["scheme"], str(r), i["bw"]]
                iters.add_metric(labels, st.iterations)
                if st.loss is not None:
                    loss.add_metric(labels, st.loss)
                hist.add_metric(labels, buckets=[*((str(le), c) for le, c in zip(ITER_BUCKETS, st.buckets)),
                                                 ("+Inf", st.iterations)], sum_value=st.iter_sum)
                payload.add_metric(labels, st.payload)
                compute.add_metric(labels, st.compute_s)
                if st.tx_bytes is not None:
                    wire.add_metric(labels, st.tx_bytes)
                if run.dense_bytes and st.last_payload is not None:
                    ratio.add_metric(labels, st.last_payload / run.dense_bytes)
        yield from (info, start, end, iters, loss, acc, epoch, hist, payload, wire, compute, ratio, cross, cross_bytes,
                    active, proven, bound, measured)


class RunExporter:
    """One run's training metrics, served from the process that launched it while it runs.

    `testbed run` starts one per run on a free loopback port and announces it through a
    file-SD target file; :meth:`finish` waits (when someone scrapes at all) for one scrape
    that read the final records, so Prometheus holds the end of the run too.
    """

    def __init__(self, run_dir: Path, target: Path, host: str = "127.0.0.1", token: str | None = None):
        """``token``: answer only requests that carry it (an ordinary user's: testbed.monitor.auth)."""
        from prometheus_client import CollectorRegistry

        from collectors.serve import serve
        from testbed.monitor.sd import hostport
        from testbed.monitor.sd import write_target

        self.target = target
        self.collector = TrainingCollector([run_dir], keep_s=float("inf"))
        self._scrapes: list[tuple[float, float]] = []  # (start, end) of each collect, monotonic
        reg = CollectorRegistry(auto_describe=False)
        reg.register(self)
        self.server, self._thread = serve(reg, host, 0, token)
        self.url = f"http://{hostport(host, self.server.server_port)}/metrics"
        write_target(target, host, self.server.server_port, {"exporter": "training"})

    def collect(self):
        t0 = time.monotonic()
        metrics = list(self.collector.collect())
        self._scrapes.append((t0, time.monotonic()))
        del self._scrapes[:-16]
        yield from metrics

    def finish(self, max_wait: float = 30.0) -> bool | None:
        """Wait for a scrape that began after now; False if none came, None if nobody scrapes
        (no scrape so far, no `testbed monitor` watching).

        A run shorter than Prometheus' discovery delay (file-SD refresh plus the scrape
        manager's 5 s reload) may end before its first scrape; when a `testbed monitor`
        watches the targets, that first scrape is waited for too."""
        from testbed.monitor.sd import watchers

        now = time.monotonic()
        starts = [s for s, _ in self._scrapes]
        if starts:
            gaps = sorted(b - a for a, b in zip(starts, starts[1:]))
            interval = gaps[len(gaps) // 2] if gaps else 5.0
            wait = max(2.0, 2.5 * interval)
        else:
            ws = watchers()
            if not ws:
                return None
            wait = 12.0 + 2 * max(float(w.get("scrape_interval_s", 5.0)) for w in ws)
        deadline = now + min(max_wait, wait)
        while time.monotonic() < deadline:
            if self._scrapes and self._scrapes[-1][0] > now:
                time.sleep(0.2)  # the response leaves after collect() returns
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.target.unlink(missing_ok=True)
        self.server.shutdown()
        self.server.server_close()
