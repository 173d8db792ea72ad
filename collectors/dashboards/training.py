"""The training dashboard: one run or many, filtered by testbed, scheme, rate, run and rank."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from . import notes
from .parts import RATE, datasource_variable, info_table, query_variable, row, steps, timeseries

INFO = 'testbed=~"$testbed",scheme=~"$scheme",bw=~"$bw",run_id=~"$run_id"'  # testbed_run_info's labels
RUN = 'run_id=~"$run_id",scheme=~"$scheme",bw=~"$bw"'  # the training series carry no testbed: $run_id has it
RANK = RUN + ',rank=~"$rank"'
NAME = "{{run_id}} rank {{rank}}"
ITER_S = (f"rate(testbed_train_iteration_seconds_sum{{{RANK}}}[{RATE}])"
          f" / rate(testbed_train_iteration_seconds_count{{{RANK}}}[{RATE}])")
COMPUTE_S = (f"rate(testbed_train_compute_seconds_total{{{RANK}}}[{RATE}])"
             f" / rate(testbed_train_iterations_total{{{RANK}}}[{RATE}])")
PER_ITER = "rate({m}{{{sel}}}[{r}]) / rate(testbed_train_iterations_total{{{sel}}}[{r}])"
RATIO = steps((None, "green"))


def variables(d: db.Dashboard) -> db.Dashboard:
    # "All" runs: those the filters above list (the training series carry no testbed label)
    run = query_variable("run_id", "run", "testbed_run_info", 'testbed=~"$testbed",scheme=~"$scheme",bw=~"$bw"',
                         all_value=None)
    return (d.with_variable(datasource_variable())
            .with_variable(query_variable("testbed", "testbed", "testbed_run_info"))
            .with_variable(query_variable("scheme", "scheme", "testbed_run_info", 'testbed=~"$testbed"'))
            .with_variable(query_variable("bw", "rate", "testbed_run_info", 'testbed=~"$testbed",scheme=~"$scheme"'))
            .with_variable(run)
            .with_variable(query_variable("rank", "rank", "testbed_train_iterations_total", 'run_id=~"$run_id"')))


def _progress(d: db.Dashboard) -> db.Dashboard:
    bucket = f"rate(testbed_train_iteration_seconds_bucket{{{RANK}}}[{RATE}])"
    quantiles = [(f"histogram_quantile({q}, sum by (run_id, le) ({bucket}))", f"{{{{run_id}}}} p{int(q * 100)}")
                 for q in (0.5, 0.9, 0.99)]
    return (d.with_row(row("Progress"))
            .with_panel(timeseries("Iteration time (mean)", [(ITER_S, NAME)], "s"))
            .with_panel(timeseries("Iteration time quantiles (histogram; all ranks)", quantiles, "s"))
            .with_panel(timeseries("Compute against communication per iteration", [
                (COMPUTE_S, "compute " + NAME), (f"({ITER_S}) - ({COMPUTE_S})", "communication and step " + NAME)],
                "s", description="Compute: forward and backward (DDP's timers). The rest of the iteration is "
                "communication (gradients over the shaped links) and the optimiser step."))
            .with_panel(timeseries("Iterations per second", [
                (f"rate(testbed_train_iterations_total{{{RANK}}}[{RATE}])", NAME)], "suffix: it/s"))
            .with_panel(timeseries("Epoch", [(f"testbed_train_epoch{{{RUN}}}", "{{run_id}}")], "short")))


def _model(d: db.Dashboard) -> db.Dashboard:
    return (d.with_row(row("Model"))
            .with_panel(timeseries("Training loss", [(f"testbed_train_loss{{{RANK}}}", NAME)], "short"))
            .with_panel(timeseries("Test accuracy", [(f"testbed_train_accuracy{{{RUN}}}", "{{run_id}}")],
                                   "percentunit", max_val=1)))


def _communication(d: db.Dashboard) -> db.Dashboard:
    return (d.with_row(row("Communication"))
            .with_panel(timeseries("Payload against wire bytes per iteration", [
                (PER_ITER.format(m="testbed_train_payload_bytes_total", sel=RANK, r=RATE), "payload " + NAME),
                (PER_ITER.format(m="testbed_train_wire_bytes_total", sel=RANK, r=RATE), "wire " + NAME)], "bytes",
                description="Payload: what the scheme handed to collectives. Wire: what the rank's interface sent."))
            .with_panel(timeseries("Compression ratio (payload / dense gradient)", [
                (f"testbed_train_compression_ratio{{{RANK}}}", NAME)], "percentunit", thresholds=RATIO))
            .with_panel(timeseries("Cross-traffic (received by its iperf3 server)", [
                ('testbed_cross_traffic_bits_per_second{run_id=~"$run_id"}', "{{run_id}} {{label}}")], "bps"))
            .with_panel(timeseries("Cross-traffic on", [
                ('testbed_cross_traffic_active{run_id=~"$run_id"}', "{{run_id}} {{label}}")], "bool", max_val=1)))


def training() -> db.Dashboard:
    d = (db.Dashboard("testbed: training").uid("testbed-training").tags(["testbed"])
         .refresh("5s").time("now-30m", "now").timezone("browser").editable())
    d = variables(d).with_row(row("Runs")).with_panel(info_table(
        "Runs in the time range",
        f"max by (run_id, testbed, scheme, bw, model, dataset, world_size) "
        f"(last_over_time(testbed_run_info{{{INFO}}}[$__range]))",
        description="Every run seen in the dashboard's time range, with what it trained and at which rate."))
    for part in (_progress, _model, _communication):
        d = part(d)
    return notes.annotate(d, INFO, 'testbed=~"$testbed"')
