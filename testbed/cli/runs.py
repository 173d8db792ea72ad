"""Experiments: ``testbed run SCHEME`` (one run); ``testbed sweep`` is in :mod:`testbed.cli.sweeps`."""

from __future__ import annotations

import contextlib
import math
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, TypedDict

import typer
from rich.markup import escape
from rich.table import Table

from testbed.cli import needs
from testbed.cli.params import TRACE_FORMATS, JsonOpt, choice, complete_scheme, scheme_help, testbed_name, testbed_option
from testbed.cli.render import emit, err, guard, lit, out, plain, sayer
from testbed.cli.usercode import ModuleOpt, ScriptOpt, user_code
from testbed.cli.workload import DATASETS, check_timeout, pretraining, wants_pretraining, with_workload_options, workload_spec
from testbed.common.errors import TestbedError

if TYPE_CHECKING:
    from testbed.model.flows import Flow
    from testbed.model.units import Rate

MAX_REPEATS = 100
"""``sweep --repeats``' bound: the sweep's list of runs is made before anything else is
checked (a million repeats took 1.7 GB before `-t nosuch` was refused)."""

RunExporterOpt = typer.Option(True, "--exporter/--no-exporter",
                              help="Serve the training metrics (and, for a testbed brought up here, its link "
                                   "metrics) to Prometheus on loopback, announced through file-based discovery.")
TensorBoardOpt = typer.Option(False, "--tensorboard", help="Write TensorBoard event files from the records into "
                              "each run's tensorboard/ folder as they grow (per rank: iteration times, bytes, "
                              "payload, loss; accuracy; link utilisation): `tensorboard --logdir OUT`.")
TopologyOpt = typer.Option(None, "--topology", metavar="FILE", help="Topology to bring up (default three_switch).")
TimeoutOpt = typer.Option(300.0, "--timeout", metavar="SECONDS",
                          help="Seconds without progress from any rank before the run is stopped.")
DilationOpt = typer.Option(None, "--dilation", metavar="K|auto[:FIRST-LAST]", help="Time dilation (with "
                           "--compute-time): every link and the stated compute K times slower, every recorded time "
                           "divided by K, so this machine's own overheads shrink K-fold. auto: K = 1, 2, 4, ... 64 "
                           "until two agree within 5 %; auto:8-256: from 8 up to 256.")
PretrainDatasetOpt = choice(None, "--pretrain-dataset", choices=DATASETS,
                            help="Pre-train on this dataset, fine-tune on --dataset (default: --dataset).")


class _Shaping(TypedDict):
    """What ``run`` passes to its RunRequest for the user's code and for a built-in scheme alike."""
    topology: Optional[Path]
    testbed: Optional[str]
    bw: Optional[Rate]
    out: Path
    timeout: float
    exporter: bool
    bw_trace: Optional[Path]
    trace_format: str
    trace_window: float
    trace_loop: bool
    cross_traffic: Optional[list[Flow]]
    dilation: float
    tensorboard: bool


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})(run)
    needs.namespaces("run")


@with_workload_options
def run(
    ctx: typer.Context,
    scheme: Optional[str] = typer.Argument(None, metavar="[SCHEME]", autocompletion=complete_scheme,
                                           help=scheme_help() + " With --script/-m, positional arguments go to "
                                           "your code."),
    script: Optional[Path] = ScriptOpt,
    module: Optional[str] = ModuleOpt,
    bw: Optional[str] = typer.Option(None, "--bw", metavar="RATE", help="Rate of the bottleneck links for this "
                                     "run, e.g. 100mbit."),
    bw_trace: Optional[Path] = typer.Option(None, "--bw-trace", metavar="FILE", help="The bottleneck links follow "
                                            "this trace (CSV time_s,rate[,delay,loss] or Mahimahi) during the run."),
    trace_format: str = choice("auto", "--trace-format", choices=TRACE_FORMATS, help="--bw-trace's format."),
    trace_window: float = typer.Option(1.0, "--trace-window", metavar="SECONDS",
                                       help="mahimahi: seconds per rate step."),
    trace_loop: bool = typer.Option(False, "--trace-loop", help="csv: repeat the trace until the run ends."),
    cross_traffic: Optional[List[str]] = typer.Option(None, "--cross-traffic", metavar="FLOW", help="Background "
                                                      "TCP flows during the run, e.g. 'w0->w7,flows=2' or "
                                                      "'w1->w6,rate=20mbit,on=2s,off=3s' (repeatable; 'none': not "
                                                      "even the topology's traffic:)."),
    pretrain: Optional[bool] = typer.Option(None, "--pretrain/--no-pretrain", help="Start from a pre-trained "
                                            "checkpoint, made once and cached in OUT/checkpoints (default: yes for "
                                            "pactrain, which prunes a trained network; no for the others)."),
    pretrain_dataset: Optional[str] = PretrainDatasetOpt,
    pretrain_epochs: float = typer.Option(2.0, "--pretrain-epochs", metavar="NUMBER", help="Epochs of pre-training."),
    topology: Optional[Path] = TopologyOpt,
    testbed: Optional[str] = testbed_option("Run on this running testbed (its name, or its topology FILE); leave "
                                            "it up."),
    out_dir: Path = typer.Option(Path("runs"), "--out", metavar="DIR", help="Directory for run directories."),
    timeout: float = TimeoutOpt,
    dilation: Optional[str] = DilationOpt,
    exporter: bool = RunExporterOpt,
    tensorboard: bool = TensorBoardOpt,
    as_json: bool = JsonOpt,
    workload: Optional[dict] = None,
):
    """Train SCHEME (or your own --script/-m) across the emulated network, one rank per
    worker, and record everything.

    Without --testbed, brings up --topology (three_switch by default) and removes it after.
    Arguments after `--` go to `python -m workloads.train` (or to your script) unchanged.
    """
    with guard(as_json):
        from testbed.model.flows import parse_spec
        from testbed.runs import dilation as dilations
        from testbed.runs.reports import tensorboard as events
        from testbed.runs.experiment import RunRequest
        from testbed.runs.preflight import preflight

        code = user_code(ctx, scheme, script, module)  # SCHEME checked there when it is one
        rate = _rate(bw) if bw is not None else None
        check_timeout(timeout)
        if tensorboard:
            events.require()
        k = dilations.parse(dilation) if dilation is not None else 1.0
        if not (math.isfinite(trace_window) and trace_window > 0):
            raise TestbedError(f"--trace-window must be a positive number of seconds, got {trace_window}")
        flows: Optional[list[Flow]] = None
        if cross_traffic:
            flows = [] if cross_traffic == ["none"] else [parse_spec(x) for x in cross_traffic]
        shaping: _Shaping = dict(topology=topology, testbed=testbed_name(testbed) if testbed else None, bw=rate,
                                 out=out_dir, timeout=timeout, exporter=exporter, bw_trace=bw_trace,
                                 trace_format=trace_format, trace_window=trace_window, trace_loop=trace_loop,
                                 cross_traffic=flows, dilation=1.0 if isinstance(k, dilations.Auto) else k,
                                 tensorboard=tensorboard)
        if code is not None:
            args = ([scheme] if scheme is not None else []) + list(ctx.args)  # `--script F 60`: 60 is F's
            req = RunRequest(scheme=code.label, workload_args=args, code=code, **shaping)
            pre = None
        else:
            assert scheme is not None and workload is not None  # SCHEME: user_code checked it; workload: always passed
            spec = workload_spec(scheme, workload, ctx.args)  # the options, typed once; no data loaded
            pre = pretraining(spec, pretrain_dataset, pretrain_epochs) \
                if wants_pretraining(scheme, pretrain, pretrain_dataset, spec) and spec.init is None else None
            req = RunRequest(scheme=scheme, spec=spec, **shaping)
        if isinstance(k, dilations.Auto):
            dilations.check(_largest(req, k), given=dilation)
        preflight(_largest(req, k))  # all that needs only the options, names and topology: before pre-training
        if req.spec is not None:
            if pre is not None:
                req.spec = req.spec.replace(init=_checkpoint(out_dir, pre, as_json))
            if not as_json:
                _announce(req.scheme, req.spec, rate or (f"trace {bw_trace}" if bw_trace else "as configured"),
                          shaping["testbed"] or topology or "three_switch (default)")
        summary = _with_display(_run_one if not isinstance(k, dilations.Auto) else
                                 partial(_run_auto, auto=k), req, as_json)
        emit(summary) if as_json else _render_summary(summary)


def _rate(text: str) -> Rate:
    from testbed.model.units import Rate, UnitError

    try:
        return Rate.parse(text)
    except UnitError as e:
        raise TestbedError(f"--bw: {e}") from None


def _rates(text: str) -> list[Rate]:
    """``--bw 100mbit,1gbit``: the rates, each checked."""
    return [_rate(x.strip()) for x in text.split(",")]


def _checkpoint(out_dir: Path, pre, as_json: bool) -> Path:
    from testbed.runs.experiment import check_out
    from testbed.runs.sweeps.sweep import checkpoint

    check_out(out_dir)
    return checkpoint(out_dir, pre, sayer(as_json))


def _announce(scheme: str, spec, bottleneck, where) -> None:
    o = spec.options
    err.print(f"[bold]testbed run {escape(scheme)}[/]: model {escape(o.model)}, dataset {escape(o.dataset)}, "
              f"{o.epochs:g} epochs{_at_most(o.max_iters)}, batch {o.batch_size}/worker, "
              f"bottleneck {escape(str(bottleneck))}, "
              f"topology {escape(str(where))}", highlight=False)


def _at_most(n) -> str:
    """`` (at most N iterations)`` where --max-iters ends the run before its epochs do."""
    return "" if n is None else f" (at most {n} iteration{'s' if n != 1 else ''})"


def _largest(req, k):
    """The request as its most dilated run makes it (--dilation auto goes up to its ladder's last K)."""
    from dataclasses import replace

    from testbed.runs.dilation import Auto

    return replace(req, dilation=k.ladder()[-1]) if isinstance(k, Auto) else req


def _run_auto(req, on_status, on_message, auto):
    from testbed.runs.dilation_auto import run_auto

    return run_auto(req, lambda r: _run_one(r, on_status, on_message), on_message, auto)


def _run_one(req, on_status, on_message):
    from testbed.runs.experiment import run as run_experiment

    return run_experiment(req, on_status=on_status, on_message=on_message)


def _with_display(fn, req, as_json: bool):
    """``fn(req, on_status, on_message)`` with a live status table on a terminal (stderr)."""
    from rich.live import Live

    live_on = not as_json and err.is_terminal
    with Live(console=err, refresh_per_second=2, transient=True) if live_on else contextlib.nullcontext() as live:
        return fn(req, (lambda st: live.update(_status_table(st))) if live is not None else None,
                  sayer(as_json))


def _status_table(st) -> Table:
    t = Table.grid(padding=(0, 2))
    it = f"{st.iteration}/{st.total}" if st.total else str(st.iteration)
    t.add_row("iteration", it, "epoch", str(st.epoch), "loss", "-" if st.loss is None else f"{st.loss:.4f}",
              "accuracy", "-" if st.accuracy is None else f"{st.accuracy:.4f}")
    for name, u in sorted(st.utilisation.items()):
        t.add_row(*lit("", "", "", "", "link", name, "utilisation", f"{u:.0%}"))
    return t


def _render_summary(s: dict) -> None:
    from testbed.runs.volume import promise

    t = Table("run", s["run_id"], show_header=True)
    tta = s.get("time_to_target_s")
    b = s["bottleneck"]
    rows = [
        ("scheme", s["scheme"]), ("bottleneck", str(s.get("bw"))), ("ranks", str(s.get("world_size"))),
        ("iterations", str(s.get("iterations"))),
        ("final accuracy", f"{s.get('final_accuracy') or 0:.4f}" if s.get("accuracy_measured", True)
         else f"not measured (--compute-time {s.get('compute_time_s')} s)"),
        (f"time to {s['target_accuracy']:g} accuracy" if s.get("target_accuracy") else "time to target",
         "not reached" if s.get("target_accuracy") and tta is None else ("-" if tta is None else f"{tta:.1f} s")),
        ("mean iteration", f"{(s.get('mean_iter_s') or 0) * 1000:.0f} ms"),
        *_dilation_rows(s),
        ("payload / iteration", "-" if s.get("mean_payload_bytes") is None else f"{s['mean_payload_bytes']:,.0f} B"),
        ("bottleneck bytes / iteration", f"{b.get('bytes_per_iteration') or 0:,.0f} B"),
        ("bottleneck utilisation", f"mean {b.get('mean_utilisation') or 0:.0%}, max {b.get('max_utilisation') or 0:.0%}"),
        ("proof", str(s.get("proof", "-")) + (f": {s['proof_reason']}" if s.get("proof_reason") else "")),
        *promise(s),
        *_proof_rows(s),
    ]
    for k, v in rows:
        t.add_row(*lit(k, v))
    out.print(t)
    plain(f"run directory: {s['run_dir']}  (`testbed report {s['run_dir']}`)")


def _dilation_rows(s: dict) -> list[tuple[str, str]]:
    """A dilated run's K, and whether --dilation auto validated it."""
    k = s.get("dilation")
    paced = _paced_rows(s)
    if not isinstance(k, (int, float)) or k == 1:
        return paced
    labels: dict[object, str] = {True: "validated", False: "not validated"}
    said = labels.get(s.get("dilation_validated"), "-")
    curve = ", ".join(f"K {c['k']:g}: {c['median_iter_s'] * 1000:.0f} ms" for c in s.get("dilation_curve") or []
                      if isinstance(c.get("median_iter_s"), (int, float)))
    return [("time dilation", f"K = {k:g}, {said}" + (f" ({curve})" if curve else "") + "; times in emulated seconds"),
            *paced]


def _paced_rows(s: dict) -> list[tuple[str, str]]:
    """--gpu-time: the budget the real compute was held to, and whether it kept up."""
    t, over = s.get("gpu_time_s"), s.get("overruns")
    if not isinstance(t, (int, float)) or not isinstance(over, int):
        return []
    text = f"real compute held to K x {t * 1000:.2f} ms = {s.get('compute_budget_s') or 0:.3f} s per iteration: "
    if over == 0:
        return [("GPU speed", text + "kept up in every iteration")]
    fits = s.get("dilation_fits")
    return [("GPU speed", text + f"{over} rank-iterations overran (latest miss {s.get('overrun_late_max_s', 0):.3f} s"
             f" real): not validated" + (f"; K >= {fits} meets every deadline" if isinstance(fits, int) else ""))]


def _proof_rows(s: dict) -> list[tuple[str, str]]:
    """Measured against bound, per bottleneck direction (every link's: summary.json's proof_links)."""
    rows = []
    for name in (s.get("bottleneck") or {}).get("links") or {}:
        row = (s.get("proof_links") or {}).get(name) or {}
        bound, got = row.get("bound_bytes"), row.get("measured_bytes")
        if isinstance(bound, int) and isinstance(got, int):
            ratio = f" ({got / bound:.2f}x)" if bound else ""
            rows.append((f"  {name}", f"measured {got:,} B, bound {bound:,} B{ratio}"))
    return rows
