"""Cross-traffic: background TCP flows between nodes that compete with training.

A flow is iperf3 (a real tool) inside the nodes: a server in ``to``, a client in ``from``
sending to the server's data-plane address, so its packets take the same shaped links
as the ranks' collectives. Written ``w0->w7`` with options, on the command line
(``testbed run --cross-traffic 'w0->w7,flows=2'``) or in the topology::

    traffic:
      - {from: w0, to: w7, flows: 2}                          # 2 long TCP flows (iperf3 -P 2)
      - {from: w1, to: w6, rate: 20mbit}                      # paced at 20 Mbit/s (iperf3 -b)
      - {from: w2, to: w5, rate: 50mbit, on: 2s, off: 3s}     # on/off: exponential periods

On/off flows alternate between sending (at ``rate``, or as fast as TCP goes) for an
exponentially distributed time of mean ``on`` and silence of mean ``off`` (seeded), so
their mean rate is about rate x on / (on + off).

The achieved rate is what the server received, per second (iperf3's interval report,
``--timestamps``), written to the run's ``traffic.jsonl`` and summarised per flow. Every
iperf3 process carries ``--logfile=<its log in the run directory>``, recorded in the
testbed's ledger before it starts: ``down`` stops it, and the next run on the testbed
stops any left by a run that was killed.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import read_text
from testbed.common.writes import writing
from testbed.model.flows import Flow

BASE_PORT = 5301


_LINE = re.compile(r"^(\d+) \[\s*(SUM|\d+)\]\s+([\d.]+)-([\d.]+)\s+sec\s+([\d.]+) ([KMGT]?)Bytes\s+([\d.]+) ([KMGT]?)bits/sec"
                   r"(.*)$")
_UNIT = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BYTE_UNIT = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def parse_server_log(text: str) -> list[dict]:
    """Per-second received rates from an iperf3 server's log (``--timestamps='%s '``): one
    record per interval (the sum over parallel streams), in order."""
    out: dict[tuple[int, float], dict] = {}
    test = 0
    for line in text.splitlines():
        if "Server listening" in line:
            test += 1
            continue
        m = _LINE.match(line)
        if not m or m.group(9).strip() in ("sender", "receiver"):
            continue
        stamp, sid, a, b = int(m.group(1)), m.group(2), float(m.group(3)), float(m.group(4))
        key = (test, a)
        if sid != "SUM" and key in out and out[key]["sum"]:
            continue
        rec = {"time": float(stamp), "test": test, "offset_s": a, "interval_s": b - a, "bytes": float(m.group(5)) * _BYTE_UNIT[m.group(6)],
               "bits_per_second": float(m.group(7)) * _UNIT[m.group(8)], "sum": sid == "SUM"}
        if sid == "SUM" or key not in out:
            out[key] = rec
        elif not out[key]["sum"]:  # several streams without a SUM line yet: add them up
            out[key]["bytes"] += rec["bytes"]
            out[key]["bits_per_second"] += rec["bits_per_second"]
    return [{k: v for k, v in r.items() if k != "sum"} for r in out.values()]


class CrossTraffic:
    """The flows of one run: started with :meth:`start`, stopped with :meth:`stop`."""

    def __init__(self, tb, flows: Sequence[Flow], run_dir: Path, seed: int = 0):
        for f in flows:
            for n in (f.src, f.dst):
                if tb.node(n).host != tb.here:
                    raise TestbedError(f"cross-traffic {f.label()}: node {n} is on host {tb.node(n).host}; "
                                       "cross-traffic runs between nodes of the controller only so far",
                                       "drop the flow, or choose nodes placed on the local host")
        self.tb, self.flows, self.run_dir = tb, list(flows), run_dir.resolve()
        self.rng = random.Random(seed)
        self.procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.events: list[dict] = []
        self._recorded: set[str] = set()
        self._written: set[tuple] = set()
        self._events_written = 0

    def _log(self, i: int, role: str) -> Path:
        return self.run_dir / f"traffic-{i}-{role}.log"

    def _spawn(self, node: str, argv: list[str]) -> subprocess.Popen:
        from testbed.plan.actions import StartTraffic
        from testbed.plan.ledger import Ledger

        marker = next(a for a in argv if a.startswith("--logfile="))
        if marker not in self._recorded:  # an on/off flow's client restarts with the same marker
            ledger = Ledger(self.tb.name)
            with ledger.lock():
                ledger.record(StartTraffic(marker).to_dict())
            self._recorded.add(marker)
        p = self.tb.spawn(node, argv, mounts=[self.run_dir], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
        with self._lock:
            self.procs.append(p)
        return p

    def _client_argv(self, i: int, f: Flow, seconds: float | None) -> list[str]:
        argv = ["iperf3", "-c", self.tb.address(f.dst), "-p", str(BASE_PORT + i), "-B", self.tb.address(f.src),
                "-P", str(f.flows), "-t", "0" if seconds is None else f"{max(1, round(seconds))}",
                f"--logfile={self._log(i, 'client')}"]
        if f.rate is not None:
            argv += ["-b", str(f.rate.bps // f.flows)]
        return argv

    def start(self) -> None:
        for i, f in enumerate(self.flows):
            self._spawn(f.dst, ["iperf3", "-s", "-p", str(BASE_PORT + i), "-B", self.tb.address(f.dst), "-i", "1",
                                "--forceflush", "--timestamps=%s ", f"--logfile={self._log(i, 'server')}"])
        time.sleep(0.5)  # the servers listen
        for i, f in enumerate(self.flows):
            if f.onoff:
                t = threading.Thread(target=self._onoff, args=(i, f), daemon=True)
                self._threads.append(t)
                t.start()
            else:
                self._spawn(f.src, self._client_argv(i, f, None))
                self.events.append({"time": time.time(), "flow": i, "event": "on"})

    def _onoff(self, i: int, f: Flow) -> None:
        on_s, off_s = f.on_s, f.off_s
        if on_s is None or off_s is None:  # start() runs only on/off flows here, which have both
            raise ValueError(f"cross-traffic flow {i} is not an on/off flow")
        while not self._stop.is_set():
            on = max(1.0, self.rng.expovariate(1 / on_s))  # iperf3 runs whole seconds
            self.events.append({"time": time.time(), "flow": i, "event": "on", "for_s": round(on)})
            p = self._spawn(f.src, self._client_argv(i, f, on))
            while p.poll() is None and not self._stop.is_set():
                time.sleep(0.1)
            if self._stop.is_set():
                return
            off = self.rng.expovariate(1 / off_s)
            self.events.append({"time": time.time(), "flow": i, "event": "off", "for_s": off})
            if self._stop.wait(off):
                return

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        with self._lock:
            procs = list(self.procs)
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def flush(self, path: Path) -> None:
        """Append to ``path`` the per-second records and on/off events not yet written."""
        new = [r for r in self.records() if (r["flow"], r["test"], r["offset_s"]) not in self._written]
        with self._lock:
            events, self._events_written = self.events[self._events_written:], len(self.events)
        if not new and not events:
            return
        lines = "".join(json.dumps(r) + "\n" for r in sorted(
            new + [{**e, "label": self.flows[e["flow"]].label()} for e in events], key=lambda r: r["time"]))
        with writing(path, f"the {len(self._written)} cross-traffic reports before are kept"):
            with open(path, "a", encoding="utf-8") as f:
                f.write(lines)
        self._written.update((r["flow"], r["test"], r["offset_s"]) for r in new)

    def summary(self, t0: float, t1: float) -> list[dict]:
        """Per flow: bytes received and mean rate over [t0, t1] (whole seconds inside it)."""
        out = []
        recs = self.records()
        for i, f in enumerate(self.flows):
            mine = [r for r in recs if r["flow"] == i and t0 <= r["time"] - r["interval_s"] and r["time"] <= t1 + 1]
            secs = sum(r["interval_s"] for r in mine)
            got = sum(r["bytes"] for r in mine)
            out.append({**f.to_dict(), "label": f.label(), "seconds": secs, "bytes": got,
                        "mean_bits_per_second": got * 8 / secs if secs else None})
        return out

    def records(self) -> list[dict]:
        """Per flow and second: what its server received."""
        out = []
        for i, f in enumerate(self.flows):
            try:
                text = read_text(self._log(i, "server"), "records", "cross-traffic log")
            except (OSError, TestbedError):
                continue
            for r in parse_server_log(text):
                out.append({"flow": i, "label": f.label(), "from": f.src, "to": f.dst, **r})
        return sorted(out, key=lambda r: (r["time"], r["flow"]))


def stop_leftovers(name: str) -> list[int]:
    """Stop iperf3 processes that runs on testbed ``name`` started and did not stop (a run
    killed with -9): found by the markers in its ledger."""
    from testbed.common import procs
    from testbed.plan.actions import StartTraffic, recorded

    return [pid for a in recorded(name, StartTraffic) for pid in procs.terminate(a.pids(), grace=2.0)]
