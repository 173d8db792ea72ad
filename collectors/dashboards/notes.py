"""Annotations from Prometheus series: the moments a researcher looks for on every chart.

- a run's start and end: ``testbed_run_start_time_seconds`` and
  ``testbed_run_end_time_seconds`` (Unix time; the value is the moment marked);
- a link's shape changed (a trace step, `testbed link set`, a run's ``--bw`` and its
  restore): ``testbed_link_shape_change_time_seconds``, the moment the shape in force was
  set, so a change is marked at its time even when no scrape fell between it and the one
  before (a run's ``--bw`` on a testbed the run just made, a short trace step);
- cross-traffic on, as a region until it is off: ``testbed_cross_traffic_active``.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from .parts import annotation

EXTRAS: dict[str, dict] = {}
"""Per annotation name, the Prometheus options :func:`collectors.dashboards.build.render` adds."""


def run_time(metric: str, sel: str) -> str:
    return f"max by (testbed, run_id, scheme, bw) ({metric}{{{sel}}}) * 1000"


def shape_changes(link_sel: str) -> str:
    return f"max by (testbed, link, src, dst) (testbed_link_shape_change_time_seconds{{{link_sel}}}) * 1000"


def cross_traffic(sel: str) -> str:
    return ("max by (testbed, run_id, label) (testbed_cross_traffic_active"
            f" * on(run_id) group_left(testbed) max by (run_id, testbed) (testbed_run_info{{{sel}}})) > 0")


def annotate(d: db.Dashboard, run_sel: str, link_sel: str) -> db.Dashboard:
    """The annotations, for runs matching ``run_sel`` (labels of testbed_run_info: testbed,
    run_id, scheme, bw) and links matching ``link_sel``."""
    for builder, extras in (
        annotation("Run started", run_time("testbed_run_start_time_seconds", run_sel), "green",
                   "run {{run_id}} started", "testbed,scheme,bw", "{{scheme}} at {{bw}} on {{testbed}}", value_is_time=True),
        annotation("Run ended", run_time("testbed_run_end_time_seconds", run_sel), "red", "run {{run_id}} ended",
                   "testbed,scheme,bw", "{{scheme}} at {{bw}} on {{testbed}}", value_is_time=True),
        annotation("Link shape changed (trace step, link set, --bw)", shape_changes(link_sel), "orange",
                   "{{testbed}} {{link}} {{src}}->{{dst}} shape changed", "testbed,link", value_is_time=True),
        annotation("Cross-traffic on", cross_traffic(run_sel), "purple", "cross-traffic {{label}}", "testbed,run_id"),
    ):
        EXTRAS[builder.build().name] = extras
        d = d.annotation(builder)
    return d
