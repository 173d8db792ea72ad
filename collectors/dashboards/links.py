"""The links dashboard: what each link direction carries, the shape in force, queues, scrape health."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from .parts import (RATE, UTILISATION, datasource_variable, query_variable, row, steps, timeseries)
from . import notes

LINK = 'testbed=~"$testbed",link=~"$link"'
NAME = "{{testbed}} {{link}} {{src}}->{{dst}}"  # every link series is named this way
UTIL = (f"rate(testbed_link_transmit_bytes_total{{{LINK}}}[{RATE}])"
        f" / on(testbed, link, direction) group_left testbed_link_capacity_bytes_per_second{{{LINK}}}")
UP = steps((None, "red"), (1, "green"))


def _traffic(d: db.Dashboard) -> db.Dashboard:
    return (d.with_row(row("Traffic"))
            .with_panel(timeseries("Utilisation (transmitted / capacity)", [(UTIL, NAME)], "percentunit",
                                   max_val=1, thresholds=UTILISATION, width=24, description=(
                                       "Bytes sent into the direction per second over its configured rate; 1 is a "
                                       "full link (orange from 0.8, red from 0.95).")))
            .with_panel(timeseries("Throughput under capacity (a trace steps the capacity)", [
                (f"rate(testbed_link_transmit_bytes_total{{{LINK}}}[{RATE}]) * 8", NAME),
                (f"testbed_link_capacity_bytes_per_second{{{LINK}}} * 8", "capacity " + NAME)], "bps"))
            .with_panel(timeseries("Packets per second", [
                (f"rate(testbed_link_transmit_packets_total{{{LINK}}}[{RATE}])", NAME)], "pps")))


def _shape(d: db.Dashboard) -> db.Dashboard:
    return (d.with_row(row("Shape in force (topology, `testbed link set`, --bw, a trace)"))
            .with_panel(timeseries("Rate", [(f"testbed_link_capacity_bytes_per_second{{{LINK}}} * 8", NAME)],
                                   "bps", width=6))
            .with_panel(timeseries("Delay (one way)", [(f"testbed_link_delay_seconds{{{LINK}}}", NAME)], "s",
                                   width=6))
            .with_panel(timeseries("Jitter", [(f"testbed_link_jitter_seconds{{{LINK}}}", NAME)], "s", width=6))
            .with_panel(timeseries("Loss", [(f"testbed_link_loss_ratio{{{LINK}}}", NAME)], "percentunit", width=6,
                                   max_val=1, thresholds=steps((None, "green"), (0.01, "orange"), (0.05, "red")))))


def _queues(d: db.Dashboard) -> db.Dashboard:
    return (d.with_row(row("Queues"))
            .with_panel(timeseries("Queue backlog", [(f"testbed_link_backlog_bytes{{{LINK}}}", NAME)], "bytes",
                                   width=8))
            .with_panel(timeseries("Queue backlog (packets)", [(f"testbed_link_backlog_packets{{{LINK}}}", NAME)],
                                   "short", width=8))
            .with_panel(timeseries("Drops and overlimits per second", [
                (f"rate(testbed_link_drops_total{{{LINK}}}[{RATE}])", "drops " + NAME),
                (f"rate(testbed_link_overlimits_total{{{LINK}}}[{RATE}])", "overlimits " + NAME)], "pps", width=8,
                description="Drops: the queue was full (or netem's loss). Overlimits: the shaper held a packet back.")))


def _health(d: db.Dashboard) -> db.Dashboard:
    return (d.with_row(row("Scrape health"))
            .with_panel(timeseries("Exporters up", [('up{exporter=~".+"}', "{{exporter}} {{instance}}")], "bool",
                                   max_val=1, thresholds=UP, width=8, description=(
                                       "Prometheus' `up` for testbed's exporters (links, training, runs): 0 is a "
                                       "failed scrape.")))
            .with_panel(timeseries("Scrape duration", [
                ('scrape_duration_seconds{exporter=~".+"}', "{{exporter}} {{instance}}")], "s", width=8,
                thresholds=steps((None, "green"), (1, "orange"), (5, "red"))))
            .with_panel(timeseries("Link counters read", [
                ('testbed_link_scrape_ok{testbed=~"$testbed"}', "{{testbed}}")], "bool", max_val=1, thresholds=UP,
                width=8, description="0: the exporter answered but could not read the testbed's tc counters.")))


def links() -> db.Dashboard:
    d = (db.Dashboard("testbed: link utilisation").uid("testbed-links").tags(["testbed"])
         .refresh("5s").time("now-30m", "now").timezone("browser").editable()
         .with_variable(datasource_variable())
         .with_variable(query_variable("testbed", "testbed", "testbed_link_capacity_bytes_per_second"))
         .with_variable(query_variable("link", "link", "testbed_link_capacity_bytes_per_second",
                                       'testbed=~"$testbed"')))
    for part in (_traffic, _shape, _queues, _health):
        d = part(d)
    return notes.annotate(d, 'testbed=~"$testbed"', LINK)
