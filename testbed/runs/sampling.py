"""What a run samples while its ranks train.

    LinkSampler   the bottleneck links' tc counters: appended to links.jsonl (bytes, drops,
                  rate, utilisation) and kept as the live utilisation
    TrainStart    the bottleneck counters when rank 0 starts its first iteration, on this
                  host or another (train_start chooses LocalMarker or RemoteMarker)
    Progress      the launcher's tick: a link sample every second, the newest records of
                  rank 0 and the evaluations, and the progress display's Status
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from testbed.common.errors import TestbedError
from testbed.common.files import JsonlTail, read_json
from testbed.common.writes import writing
from testbed.model.topology import DIRECTIONS
from testbed.engine.core import Testbed
from testbed.model.topology import Link
from testbed.plan.ledger import Ledger
from testbed.runs.request import Status


class LinkSampler:
    """Samples the bottleneck counters into links.jsonl and the live utilisation."""

    def __init__(self, tb: Testbed, links: list[Link], path: Path, live_shapes: bool = False):
        self.tb, self.links, self.path = tb, links, path
        with writing(path):
            self.f = open(path, "a", buffering=1, encoding="utf-8")
        self.written = 0
        """Samples written to links.jsonl so far (one per link and direction)."""
        self.live_shapes = live_shapes
        """Read the shapes in force from the state file at every sample (a trace changes them)."""
        self.prev: dict | None = None
        self.prev_t = 0.0
        self.util: dict[str, float] = {}

    def _current(self) -> list[Link]:
        state = Ledger(self.tb.name).read_state() if self.live_shapes else None
        if state is None:
            return self.links
        from testbed.model.topology import load_topology_dict

        now = load_topology_dict(state["topology"], source=state.get("source")).links
        return [now[l.index] for l in self.links]

    def sample(self) -> dict:
        now = time.time()
        counters = self.tb.link_counters(self.links)
        links = self._current()
        lines = []
        if self.prev is not None and now > self.prev_t:
            dt = now - self.prev_t
            for l in links:
                for d in DIRECTIONS:
                    c, p = counters.get((l.index, d), {}), self.prev.get((l.index, d), {})
                    rate = l.shape(d).rate.bps
                    delta = c.get("bytes", 0) - p.get("bytes", 0)
                    util = delta * 8 / dt / rate
                    self.util[f"{l.name} {d}"] = util
                    lines.append(json.dumps({"time": now, "link": l.name, "direction": d,
                                             "bytes": c.get("bytes", 0), "drops": c.get("drops", 0),
                                             "rate_bps": rate, "bytes_per_s": delta / dt,
                                             "utilisation": util}) + "\n")
        with writing(self.path, lambda: f"the {self.written} link samples before are kept"):
            self.f.write("".join(lines))
        self.written += len(lines)
        self.prev, self.prev_t = counters, now
        return counters

    def close(self):
        self.f.close()


class TrainStart:
    """The bottleneck counters when training starts, so that utilisation and bytes per
    iteration leave out torch's import, the rendezvous and DDP's start-up broadcast. Rank 0
    creates ``started`` in its host's copy of the run directory (workloads.collectives): the
    built-in trainer just before its first iteration, the user's code when its process group
    is up. A thread polls ``marker`` for it (:class:`LocalMarker` every 10 ms when rank 0
    runs on this host, :class:`RemoteMarker` every 20 ms over SFTP when it runs on another)
    and then reads the counters of every host (one agent round trip for the others'). A
    workload that never says so, or a marker that cannot be watched, has no such moment:
    None (the summary measures from the launch)."""

    def __init__(self, tb: Testbed, links: list[Link], marker: LocalMarker | RemoteMarker):
        self.tb, self.links, self.marker = tb, links, marker
        self.counters: dict | None = None
        self.time: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="train-start", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            self.marker.open()
            while not self._stop.wait(self.marker.poll_s):
                if self.marker.seen():
                    self.counters, self.time = self.tb.link_counters(self.links), time.time()
                    return
        except Exception:  # a lost host, a refused read (paramiko, netlink): the summary measures from the launch
            return
        finally:
            self.marker.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class LocalMarker:
    """``started`` in this host's run directory, made after ``since`` (the launch)."""

    poll_s = 0.01

    def __init__(self, path: Path, since: float):
        self.path, self.since = path, since

    def open(self) -> None:
        pass

    def seen(self) -> bool:
        try:
            return self.path.stat().st_mtime >= self.since
        except OSError:
            return False

    def close(self) -> None:
        pass


class _Files(Protocol):
    """What :class:`RemoteMarker` uses of a host's files: paramiko's SFTPClient, or on a
    Slurm host the file step's :class:`~testbed.hosts.slurm.files.FilesClient`."""

    def get_channel(self) -> Any: ...

    def stat(self, path: str) -> Any: ...

    def close(self) -> None: ...


class RemoteMarker:
    """``started`` in another host's directory of the run (``testbed _host rundir``, as the
    launcher's :class:`~testbed.hosts.runplace.RemoteRun` opens it), stat'ed over an SFTP
    channel of its own (the launcher's is not shared between threads). The launcher copies
    the file back only every ``COLLECT_EVERY_S`` (2 s): too late to read the counters by.
    That host's clock is not compared with this one's: a marker already there when the
    watch begins (a directory of an earlier run of the same id) counts only once its
    modification time changes."""

    poll_s = 0.02
    TIMEOUT_S = 10.0

    def __init__(self, site, run_name: str):
        self.site, self.run_name = site, run_name
        self.sftp: _Files | None = None
        self.path = ""
        self.stale: float | None = None

    def open(self) -> None:
        d = self.site.remote.call("rundir", self.site.tb.name, self.run_name)["path"]
        if not isinstance(d, str) or not d.startswith("/"):
            raise TestbedError(f"host {self.site.host} answered rundir with {d!r}")
        self.path = f"{d}/started"
        self.sftp = self.site.remote.open_sftp()
        self.sftp.get_channel().settimeout(self.TIMEOUT_S)  # a host cut off ends the watch, not hangs it
        self.stale = self._mtime()

    def _mtime(self) -> float | None:
        if self.sftp is None:
            raise RuntimeError(f"{self.run_name}: the marker's SFTP session is not open")
        try:
            return self.sftp.stat(self.path).st_mtime
        except FileNotFoundError:
            return None

    def seen(self) -> bool:
        m = self._mtime()
        return m is not None and m != self.stale

    def close(self) -> None:
        if self.sftp is not None:
            self.sftp.close()
            self.sftp = None


def train_start(tb: Testbed, links: list[Link], run_dir: Path, since: float) -> TrainStart:
    """Watch for training's start where rank 0 runs: this host, or another one."""
    host = next(w.host for w in tb.workers if w.rank == 0)
    if host == tb.here:
        return TrainStart(tb, links, LocalMarker(run_dir / "started", since))
    return TrainStart(tb, links, RemoteMarker(tb.site(host), run_dir.name))


class Progress:
    """Called by the launcher about twice a second while the ranks run (:meth:`tick`)."""

    def __init__(self, run_dir: Path, world: int, sampler: LinkSampler, traffic,
                 on_status: Callable[[Status], None] | None):
        self.run_dir, self.sampler, self.traffic, self.on_status = run_dir, sampler, traffic, on_status
        self.status = Status(run_dir, world=world)
        self.rank0, self.evals = JsonlTail(run_dir / "rank0.jsonl"), JsonlTail(run_dir / "eval.jsonl")
        self.last_sample = time.monotonic()

    def tick(self) -> None:
        if time.monotonic() - self.last_sample >= 1.0:
            self._sample_links()
        self._read_records()
        if self.on_status:
            self.on_status(self.status)

    def _sample_links(self) -> None:
        """A link sample (links.jsonl, the live utilisation) and the cross-traffic's reports so far."""
        self.sampler.sample()
        self.last_sample = time.monotonic()
        self.status.utilisation = dict(self.sampler.util)
        if self.traffic is not None:
            self.traffic.flush(self.run_dir / "traffic.jsonl")

    def _read_records(self) -> None:
        """Iteration, epoch and loss from rank 0's newest record, accuracy from the newest
        evaluation, and the run's length once the workload has written config.json."""
        status = self.status
        r, e = self.rank0.poll(), self.evals.poll()
        if r:
            status.iteration, status.epoch, status.loss = r["iter"], r.get("epoch", 0), r.get("loss")
        if e:
            status.accuracy = e["accuracy"]
        if status.total is None and (self.run_dir / "config.json").exists():
            try:
                status.total = read_json(self.run_dir / "config.json", "json", "config file")["iterations"]
            except (OSError, ValueError, KeyError, TypeError, TestbedError):
                pass
