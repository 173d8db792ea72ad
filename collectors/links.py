"""Per link and direction: tc counters and shape of every running testbed, read at scrape time.

On a testbed that spans hosts, each host's exporter reports the link directions whose
egress is on that host, so every series comes from exactly one exporter.

Counters come from the root HTB qdisc of the interface whose egress carries the direction
(the same numbers as ``testbed link show`` and the run summaries), read over netlink in
the testbed's namespaces; the shape is the one in force (``testbed link set`` included).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from testbed.model.topology import DIRECTIONS
from testbed.engine.core import NetlinkPool, Testbed
from testbed.common.errors import TestbedError
from testbed.plan.ledger import Ledger

LABELS = ["testbed", "link", "direction", "src", "dst", "bottleneck"]

COUNTERS = (  # (metric, counter key, help)
    ("testbed_link_transmit_bytes", "bytes", "Bytes sent into the link direction (egress qdisc, layer 2)."),
    ("testbed_link_transmit_packets", "packets", "Packets sent into the link direction."),
    ("testbed_link_drops", "drops", "Packets the link direction's queue dropped."),
    ("testbed_link_overlimits", "overlimits", "Times the shaper delayed a packet because the rate was exhausted."),
)


class LinkCollector(Collector):
    def __init__(self, testbeds: Iterable[str] | None = None):
        """``testbeds``: names to export; None exports every running testbed."""
        self.only = set(testbeds) if testbeds else None
        self.pool = NetlinkPool()
        # pyroute2 binds a handle to the thread that first used it, and the HTTP server
        # answers each scrape in a new thread: the pool is used from this one thread only.
        self._netlink = ThreadPoolExecutor(1, thread_name_prefix="netlink")

    def close(self) -> None:
        self._netlink.submit(self.pool.close).result()
        self._netlink.shutdown()

    def _read(self, testbeds: list[Testbed]) -> dict[str, dict | None]:
        out: dict[str, dict | None] = {}
        for tb in testbeds:
            try:
                out[tb.name] = tb.link_counters(pool=self.pool, local_only=True)
            except (TestbedError, OSError):
                out[tb.name] = None
        self.pool.prune()  # close the handles of testbeds gone since the last scrape
        return out

    def _testbeds(self) -> list[Testbed]:
        out = []
        for name in sorted(self.only) if self.only is not None else Ledger.all_names():
            try:
                out.append(Testbed.attach(name))  # refuses testbeds not (or no longer) up and ready
            except TestbedError:
                continue
        return out

    def collect(self):
        counters = {m: CounterMetricFamily(m, h, labels=LABELS) for m, _, h in COUNTERS}
        backlog = GaugeMetricFamily("testbed_link_backlog_bytes", "Bytes waiting in the link direction's queue.",
                                    labels=LABELS)
        backlog_p = GaugeMetricFamily("testbed_link_backlog_packets", "Packets waiting in the link direction's queue.",
                                      labels=LABELS)
        capacity = GaugeMetricFamily("testbed_link_capacity_bytes_per_second",
                                     "Configured rate of the link direction (layer 2).", labels=LABELS)
        delay = GaugeMetricFamily("testbed_link_delay_seconds", "Configured one-way delay (netem).", labels=LABELS)
        jitter = GaugeMetricFamily("testbed_link_jitter_seconds", "Configured delay variation (netem).", labels=LABELS)
        loss = GaugeMetricFamily("testbed_link_loss_ratio", "Configured random loss, 0-1 (netem).", labels=LABELS)
        changed = GaugeMetricFamily("testbed_link_shape_change_time_seconds",
                                    "When the shape in force was set (Unix time): up, link set, a trace step, "
                                    "a run's --bw or its restore.", labels=LABELS)
        up = GaugeMetricFamily("testbed_link_scrape_ok", "1 when the testbed's counters were read, 0 when not.",
                               labels=["testbed"])
        testbeds = self._testbeds()
        read = self._netlink.submit(self._read, testbeds).result()
        for tb in testbeds:
            live = read[tb.name]
            if live is None:
                up.add_metric([tb.name], 0)
                continue
            up.add_metric([tb.name], 1)
            for l in tb.topology.links:
                for d, (src, dst) in zip(DIRECTIONS, ((l.a, l.b), (l.b, l.a))):
                    if tb.egress[(l.index, d)].host != tb.here:
                        continue  # that host's exporter has it (multi-host: one series, one exporter)
                    labels = [tb.name, l.name, d, src, dst, "true" if l.bottleneck else "false"]
                    c = live.get((l.index, d))
                    shape = l.shape(d)
                    capacity.add_metric(labels, shape.rate.bps / 8)
                    delay.add_metric(labels, shape.delay.seconds)
                    jitter.add_metric(labels, shape.jitter.seconds)
                    loss.add_metric(labels, shape.loss.fraction)
                    if (at := tb.shape_changed_at(l, d)) is not None:
                        changed.add_metric(labels, at)
                    if c is None:
                        continue
                    for m, key, _ in COUNTERS:
                        counters[m].add_metric(labels, c.get(key, 0))
                    backlog.add_metric(labels, c.get("backlog_bytes", 0))
                    backlog_p.add_metric(labels, c.get("qlen", 0))
        yield from counters.values()
        yield from (backlog, backlog_p, capacity, delay, jitter, loss, changed, up)
