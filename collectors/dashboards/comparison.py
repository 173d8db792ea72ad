"""The comparison dashboard: schemes side by side at one bottleneck rate (``$bw``)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from . import notes
from .parts import RATE, UTILISATION, datasource_variable, query_variable, row, timeseries

SEL = 'bw="$bw",scheme=~"$scheme"'


def _per_scheme(m: str) -> str:
    return f"avg by (scheme) (rate({m}{{{SEL}}}[{RATE}]) / rate(testbed_train_iterations_total{{{SEL}}}[{RATE}]))"


# the bottlenecks of the testbeds that run a run at $bw (testbed_run_info exists while it runs)
BOTTLENECK = (f'(rate(testbed_link_transmit_bytes_total{{bottleneck="true"}}[{RATE}])'
              ' / on(testbed, link, direction) group_left testbed_link_capacity_bytes_per_second{bottleneck="true"})'
              f' and on(testbed) max by (testbed) (testbed_run_info{{{SEL}}})')


def comparison() -> db.Dashboard:
    iter_s = (f"avg by (scheme) (rate(testbed_train_iteration_seconds_sum{{{SEL}}}[{RATE}])"
              f" / rate(testbed_train_iteration_seconds_count{{{SEL}}}[{RATE}]))")
    compute_s = _per_scheme("testbed_train_compute_seconds_total")
    d = (db.Dashboard("testbed: schemes at one bandwidth").uid("testbed-comparison").tags(["testbed"])
         .refresh("5s").time("now-30m", "now").timezone("browser").editable()
         .with_variable(datasource_variable())
         .with_variable(query_variable("bw", "bandwidth", "testbed_run_info", multi=False))
         .with_variable(query_variable("scheme", "scheme", "testbed_run_info", 'bw="$bw"'))
         .with_row(row("Time"))
         .with_panel(timeseries("Iteration time by scheme", [(iter_s, "{{scheme}}")], "s"))
         .with_panel(timeseries("Compute against communication per iteration by scheme", [
             (compute_s, "compute {{scheme}}"), (f"({iter_s}) - ({compute_s})", "communication and step {{scheme}}")],
             "s"))
         .with_row(row("Outcome"))
         .with_panel(timeseries("Test accuracy by run", [
             (f"max by (scheme, run_id) (testbed_train_accuracy{{{SEL}}})", "{{scheme}} {{run_id}}")],
             "percentunit", max_val=1))
         .with_panel(timeseries("Iterations completed by run", [
             (f'max by (scheme, run_id) (testbed_train_iterations_total{{{SEL},rank="0"}})', "{{scheme}} {{run_id}}")],
             "short"))
         .with_row(row("Traffic"))
         .with_panel(timeseries("Payload bytes per iteration by scheme", [
             (_per_scheme("testbed_train_payload_bytes_total"), "{{scheme}}")], "bytes"))
         .with_panel(timeseries("Bottleneck utilisation (testbeds running at $bw)", [
             (BOTTLENECK, "{{testbed}} {{link}} {{src}}->{{dst}}")], "percentunit", max_val=1,
             thresholds=UTILISATION)))
    return notes.annotate(d, SEL, 'bottleneck="true"')
