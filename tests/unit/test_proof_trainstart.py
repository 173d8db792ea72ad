"""Utilisation and bytes per iteration measured from training's start (issue 40, item 4):
the summary leaves the start-up traffic out when it has the counters of that moment, and
the watch for rank 0's ``started`` marker works wherever rank 0 runs: this host (a local
file) or another host of a multi-host testbed (its copy of the run directory, over SFTP).
The whole path across real hosts: tests/kernel/test_proof_multihost.py."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.model.topology import load_topology_dict
from testbed.runs.sampling import LocalMarker, RemoteMarker, TrainStart, train_start
from testbed.runs.summary import summarise

RATE = 10_000_000  # 10 Mbit/s


def _bottleneck():
    topo = load_topology_dict({
        "name": "ts", "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch"},
                                "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
        "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s1"]},
                  {"endpoints": ["s0", "s1"], "rate": "10mbit", "bottleneck": True}]})
    return [l for l in topo.links if l.bottleneck]


def _counters(link, fwd: int, rev: int) -> dict:
    return {(link.index, "forward"): {"bytes": fwd, "drops": 0}, (link.index, "reverse"): {"bytes": rev, "drops": 0}}


def test_measuring_from_training_start_leaves_the_start_up_traffic_out(tmp_path):
    """Launch at 0 s, training from 4 s, end at 10 s: 3 MB of start-up (DDP's broadcast,
    the rendezvous) before training, 6 MB each way during it."""
    links = _bottleneck()
    (l,) = links
    start, at_train, end = _counters(l, 0, 0), _counters(l, 3_000_000, 3_000_000), _counters(l, 9_000_000, 9_000_000)
    request = {"bw": "10mbit", "testbed": "ts"}
    shapes = {l.name: {"forward": {"rate": "10mbit"}, "reverse": {"rate": "10mbit"}}}
    workload = {"iterations": 100, "world_size": 2}

    def run(train_start):
        return summarise(tmp_path, "r", request, links, start, end, 10.0, shapes, train_start,
                         workload=dict(workload))["bottleneck"]

    launch, train = run(None), run((at_train, 6.0))
    assert launch["measured_from"] == "launch" and train["measured_from"] == "training start"
    assert launch["bytes"] == 18_000_000 and train["bytes"] == 12_000_000  # the 2 x 3 MB of start-up left out
    assert launch["bytes_per_iteration"] == 180_000 and train["bytes_per_iteration"] == 120_000
    assert launch["seconds"] == 10.0 and train["seconds"] == 6.0
    fwd = f"{l.name} forward"
    assert launch["links"][fwd]["utilisation"] == 9_000_000 * 8 / 10.0 / RATE  # 7.2: diluted by 4 s of start-up
    assert train["links"][fwd]["utilisation"] == 6_000_000 * 8 / 6.0 / RATE  # 8.0: the training's own rate
    assert train["max_utilisation"] > launch["max_utilisation"]


def test_a_dilated_run_measured_from_training_start_gives_emulated_seconds_and_rates(tmp_path):
    links = _bottleneck()
    (l,) = links
    shapes = {l.name: {"forward": {"rate": "10mbit"}, "reverse": {"rate": "10mbit"}}}
    s = summarise(tmp_path, "r", {"bw": None, "testbed": "ts"}, links, _counters(l, 0, 0),
                  _counters(l, 4_000_000, 4_000_000), 40.0, shapes, (_counters(l, 1_000_000, 1_000_000), 20.0),
                  workload={"iterations": 10}, dilation=4.0)["bottleneck"]
    assert s["seconds"] == 5.0 and s["bytes"] == 6_000_000
    assert s["links"][f"{l.name} forward"]["utilisation"] == 3_000_000 * 8 / 5.0 / (RATE * 4)


@dataclass
class FakeTb:
    """A testbed whose counters are a number that grows with every read."""

    name: str = "tb"
    here: str = "local"
    workers: list = field(default_factory=list)
    reads: int = 0
    sites: dict = field(default_factory=dict)

    def link_counters(self, links=None):
        self.reads += 1
        return {(0, "forward"): {"bytes": 1000 * self.reads}}

    def site(self, host):
        return self.sites[host]


def _wait(ts: TrainStart, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while ts._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)


def _until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the watch never looked"
        time.sleep(0.01)


class LookedAt(LocalMarker):
    """A local marker that counts the watch's looks at it."""

    looks = 0

    def seen(self) -> bool:
        self.looks += 1
        return super().seen()


def test_a_local_marker_from_this_launch_reads_the_counters_an_older_one_does_not(tmp_path):
    marker = tmp_path / "started"
    marker.touch()
    os.utime(marker, (time.time() - 60, time.time() - 60))  # an earlier run's
    tb = FakeTb()
    ts = TrainStart(tb, [], watched := LookedAt(marker, since=time.time() - 1))
    _until(lambda: watched.looks >= 2)  # the watch has looked at the old marker
    assert ts.counters is None and tb.reads == 0
    marker.touch()
    _wait(ts)
    assert ts.counters == {(0, "forward"): {"bytes": 1000}} and ts.time is not None
    ts.stop()


@dataclass
class Stat:
    st_mtime: float


class FakeSftp:
    def __init__(self, files: dict):
        self.files, self.closed, self.stats = files, False, 0

    def stat(self, path):
        self.stats += 1
        if isinstance(self.files.get(path), Exception):
            raise self.files[path]
        if path not in self.files:
            raise FileNotFoundError(path)
        return Stat(self.files[path])

    def get_channel(self):
        return self

    def settimeout(self, seconds):
        self.timeout = seconds

    def close(self):
        self.closed = True


class FakeRemote:
    def __init__(self, sftp):
        self.sftp, self.calls = sftp, []

    def call(self, op, *args):
        self.calls.append((op, *args))
        return {"path": f"/run/testbed/{args[0]}/runs/{args[1]}"}

    def client(self):
        return self

    def open_sftp(self):
        return self.sftp


@dataclass
class FakeSite:
    tb: FakeTb
    remote: FakeRemote
    host: str = "h1"


def _remote(files: dict) -> tuple[FakeTb, FakeSftp, FakeSite]:
    tb, sftp = FakeTb(), FakeSftp(files)
    site = FakeSite(tb, FakeRemote(sftp))
    tb.sites["h1"] = site
    return tb, sftp, site


def test_a_remote_marker_is_watched_in_that_hosts_copy_of_the_run_directory():
    tb, sftp, site = _remote({})
    ts = TrainStart(tb, [], RemoteMarker(site, "run-7"))
    _until(lambda: sftp.stats >= 2)  # opened (its first stat), then looked at
    assert ts.counters is None and site.remote.calls == [("rundir", "tb", "run-7")]
    sftp.files["/run/testbed/tb/runs/run-7/started"] = 1000.0  # rank 0 on h1 starts training
    _wait(ts)
    assert ts.counters == {(0, "forward"): {"bytes": 1000}}
    assert sftp.closed and sftp.timeout == RemoteMarker.TIMEOUT_S  # its own channel, bounded, closed when done


def test_a_remote_marker_left_by_an_earlier_run_counts_only_once_it_changes():
    path = "/run/testbed/tb/runs/run-7/started"
    tb, sftp, site = _remote({path: 500.0})  # that host's clock is not compared with ours
    ts = TrainStart(tb, [], RemoteMarker(site, "run-7"))
    _until(lambda: sftp.stats >= 2)  # opened (its first stat), then looked at
    assert ts.counters is None and tb.reads == 0
    sftp.files[path] = 501.0
    _wait(ts)
    assert ts.counters is not None
    ts.stop()


def test_a_host_lost_while_watching_leaves_no_moment_and_no_error():
    path = "/run/testbed/tb/runs/run-7/started"
    tb, sftp, site = _remote({})
    ts = TrainStart(tb, [], RemoteMarker(site, "run-7"))
    sftp.files[path] = OSError("Socket is closed")
    _wait(ts)
    assert not ts._thread.is_alive() and ts.counters is None and sftp.closed  # the summary says "launch"


@dataclass
class W:
    rank: int
    host: str


def test_the_watch_is_made_where_rank_0_runs(tmp_path):
    tb, _, site = _remote({})
    tb.workers = [W(1, "local"), W(0, "h1")]  # rank 0 on another host: its copy of the run directory
    ts = train_start(tb, [], tmp_path / "run-9", time.time())
    assert isinstance(ts.marker, RemoteMarker) and ts.marker.site is site and ts.marker.run_name == "run-9"
    ts.stop()
    tb.workers = [W(0, "local"), W(1, "h1")]  # a multi-host testbed with rank 0 here: the local file
    ts = train_start(tb, [], tmp_path / "run-9", time.time())
    assert isinstance(ts.marker, LocalMarker) and ts.marker.path == Path(tmp_path / "run-9" / "started")
    ts.stop()
