"""``testbed sweep``: every scheme (or the user's code) x rate x grid point (x repeats), on
this machine or, with ``--slurm``, as a Slurm job array (``--wait``, ``--status DIR``,
``--cancel DIR``); ``testbed _sweep-element DIR`` is one element of such an array (hidden)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, TypedDict

import typer
from rich.markup import escape
from rich.table import Table

from testbed.cli import needs
from testbed.cli.params import JsonOpt, scheme_list, split_list, testbed_name, testbed_option
from testbed.cli.render import emit, err, guard, out, plain, sayer, usage
from testbed.cli.runs import MAX_REPEATS, PretrainDatasetOpt, RunExporterOpt, TensorBoardOpt, TimeoutOpt, \
    TopologyOpt, _rates, _with_display
from testbed.cli.usercode import ModuleOpt, ParamOpt, ScriptOpt, own_code
from testbed.cli.workload import check_timeout, pretraining, with_prune_ratios, with_workload_options, workload_args
from testbed.common.errors import TestbedError

if TYPE_CHECKING:
    from testbed.model.units import Rate


class _DirOpt(TypedDict):
    metavar: str
    exists: bool
    file_okay: bool


SweepDirOpt: _DirOpt = dict(metavar="DIR", exists=False, file_okay=False)


class _Shared(TypedDict):
    """What ``sweep`` passes to its SweepRequest for the user's code and for built-in schemes alike."""
    bws: list[Rate]
    repeats: int
    topology: Optional[Path]
    params: dict[str, list[str]]
    out: Path
    timeout: float
    testbed: Optional[str]
    exporter: bool
    dilation: float
    tensorboard: bool


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_extra_args": True})(sweep)
    app.command("_sweep-element", hidden=True)(sweep_element)
    needs.namespaces("sweep", lambda p: not _asks_slurm(p))  # each element enters its own node's
    needs.prunes("sweep", _asks_slurm)  # the folders of the elements' ended jobs
    needs.namespaces("_sweep-element")


def _asks_slurm(params: dict) -> bool:
    """``sweep --slurm``, ``--status DIR`` or ``--cancel DIR``: a sweep that asks Slurm, here."""
    return bool(params.get("slurm") or params.get("status") or params.get("cancel"))


@with_workload_options
def sweep(
    ctx: typer.Context,
    schemes: str = typer.Option("allreduce,fp16,topk,pactrain", "--schemes", metavar="SCHEME,...",
                                parser=scheme_list, help="Comma-separated schemes or variants, e.g. "
                                "allreduce,topk:0.1,pactrain:0.5,pactrain:0.5:exact."),
    bw: str = typer.Option("100mbit,500mbit,1gbit", "--bw", metavar="RATE,...", help="Comma-separated bottleneck "
                           "rates."),
    repeats: int = typer.Option(1, "--repeats", metavar="INT", min=1, max=MAX_REPEATS,
                                help="Runs per scheme, rate and grid point; repeat k uses --seed + k. Report shows "
                                "the median and min-max."),
    param: Optional[List[str]] = ParamOpt,
    script: Optional[Path] = ScriptOpt,
    module: Optional[str] = ModuleOpt,
    pretrain_epochs: float = typer.Option(2.0, "--pretrain-epochs", metavar="NUMBER",
                                          help="Epochs of the shared pre-training."),
    pretrain_dataset: Optional[str] = PretrainDatasetOpt,
    prune_ratios: Optional[str] = typer.Option(None, "--prune-ratios", metavar="RATIO,...", help="Comma-separated "
                                               "pruning ratios: each pactrain entry of --schemes runs at every one "
                                               "(the paper's Fig. 6)."),
    topology: Optional[Path] = TopologyOpt,
    testbed: Optional[str] = testbed_option("Sweep on this running testbed (its name, or its topology FILE)."),
    out_dir: Path = typer.Option(Path("runs"), "--out", metavar="DIR", help="Where the sweep directory and "
                                 "checkpoints go."),
    timeout: float = TimeoutOpt,
    dilation: Optional[str] = typer.Option(None, "--dilation", metavar="K", help="Time dilation of every run (with "
                                           "--compute-time; find K with `testbed run --dilation auto`)."),
    exporter: bool = RunExporterOpt,
    tensorboard: bool = TensorBoardOpt,
    slurm: bool = typer.Option(False, "--slurm", help="Submit the sweep as a Slurm job array, one element per run "
                               "(each brings up its own testbed where Slurm places it); the same command again "
                               "submits only what is not done (docs/slurm.md)."),
    sbatch: Optional[str] = typer.Option(None, "--sbatch", metavar="OPTIONS", help="sbatch options of every "
                                         "element, e.g. '--partition=cpu --time=30 -N 2' (with --slurm)."),
    array_limit: Optional[int] = typer.Option(None, "--array-limit", metavar="N", min=1, max=100000,
                                              help="At most N elements at once (sbatch --array=...%N)."),
    wait: bool = typer.Option(False, "--wait", help="With --slurm: follow the array until every element ended."),
    status: Optional[Path] = typer.Option(None, "--status", help="What each element of the Slurm sweep in DIR is: "
                                          "done, failed, running, pending.", **SweepDirOpt),
    cancel: Optional[Path] = typer.Option(None, "--cancel", help="Cancel the Slurm sweep in DIR (scancel); each "
                                          "running element takes its testbed down.", **SweepDirOpt),
    as_json: bool = JsonOpt,
    workload: Optional[dict] = None,
):
    """Run every scheme (or your own --script/-m) at every bandwidth and grid point; the
    built-in schemes from one shared pre-trained checkpoint. Here, or as a Slurm job array
    (--slurm)."""
    with guard(as_json):
        if status is not None or cancel is not None:
            return _look(status, cancel, wait, as_json)
        if not slurm and (sbatch is not None or array_limit is not None or wait):
            raise usage("--sbatch, --array-limit and --wait go with --slurm")
        if slurm and testbed:
            raise usage("--slurm brings up a testbed per element: give --topology FILE, not --testbed")
        options = _sbatch_options(sbatch) if slurm else []
        from testbed.runs.sweeps import grid
        from testbed.runs.reports import tensorboard as events
        from testbed.runs.sweeps.sweep import SweepRequest

        code = own_code(ctx, script, module)
        params = grid.parse(param or [])
        rates = _rates(bw)
        check_timeout(timeout)
        if tensorboard:
            events.require()
        shared: _Shared = dict(bws=rates, repeats=repeats, topology=topology, params=params, out=out_dir,
                               timeout=timeout, testbed=testbed_name(testbed) if testbed else None,
                               exporter=exporter, dilation=_sweep_dilation(dilation), tensorboard=tensorboard)
        if code is not None:
            req = SweepRequest(schemes=[code.label], workload_args=list(ctx.args), code=code,
                               **shared)
            req.check()
        else:
            assert workload is not None  # with_workload_options passes it
            req = _builtin_sweep(ctx, schemes, prune_ratios, workload, pretrain_dataset, pretrain_epochs, shared)
        if slurm:
            return _submit(req, topology, options, array_limit, wait, as_json)
        index = _with_display(_sweep_all, req, as_json)
        failed = [r for r in index["runs"] if r["status"] != "ok"]
        if as_json:
            emit(index)
        else:
            plain(f"sweep directory: {index['dir']} ({len(index['runs']) - len(failed)} runs ok, "
                  f"{len(failed)} failed); `testbed report {index['dir']}`")
        if failed:
            raise typer.Exit(1)


def _sweep_dilation(text: str | None) -> float:
    from testbed.runs.dilation import Auto, parse

    k = parse(text) if text is not None else 1.0
    if isinstance(k, Auto):
        raise TestbedError("sweep --dilation takes a factor K, not 'auto'",
                           "find K with `testbed run --dilation auto` on one scheme, then sweep with it")
    return float(k)


def _builtin_sweep(ctx, schemes: str, prune_ratios, workload: dict, pretrain_dataset, pretrain_epochs,
                   shared: _Shared):
    """The SweepRequest of built-in schemes: every scheme at every grid point it runs typed
    and checked once (the sweep's runs reuse them), and the shared checkpoint."""
    from testbed.runs.sweeps import grid
    from testbed.runs.sweeps.sweep import SweepRequest

    names = split_list(schemes)
    if prune_ratios is not None:
        names = with_prune_ratios(names, prune_ratios)
    init = workload["init"].resolve() if workload["init"] is not None else None
    req = SweepRequest(schemes=names, workload_args=workload_args({**workload, "init": None}, ctx.args), init=init,
                       **shared)
    req.check()
    first = req.spec(names[0], grid.for_scheme(req.params, names[0])[0])
    assert first is not None  # (built-in schemes have a spec)
    req.pretrain = pretraining(first, pretrain_dataset, pretrain_epochs)
    if first.options.compute_time is not None:  # traffic only: no checkpoint to share
        if pretrain_dataset is not None:
            raise TestbedError("--compute-time measures traffic, not accuracy: --pretrain-dataset does not apply")
        req.pretrain = None
    return req


def _sweep_all(req, on_status, on_message):
    from testbed.runs.sweeps.sweep import sweep as run_sweep

    return run_sweep(req, on_status=on_status, on_message=on_message)


def _sbatch_options(sbatch: Optional[str]) -> list[str]:
    """``--sbatch '...'``: sbatch's options, split as a shell would split them (no shell runs
    them), those testbed sets refused."""
    from testbed.runs.sweeps import slurm as slurmsweep

    try:
        return slurmsweep.check_sbatch(shlex.split(sbatch or ""))
    except ValueError as e:
        raise usage(f"--sbatch {sbatch!r}: {e}") from None


def _submit(req, topology: Optional[Path], options: list[str], limit: Optional[int], wait: bool,
            as_json: bool) -> None:
    from testbed.runs.sweeps import slurm as slurmsweep

    st, job = slurmsweep.submit(req, _topology_document(topology), options, limit, sayer(as_json))
    if wait and st.live:
        st = _follow(st.dir, as_json)
    if as_json:
        emit({**st.to_dict(), "submitted": job})
    if wait or not st.live:
        _ended(st, as_json)
    elif not as_json:
        plain(f"sweep directory: {st.dir}; " + (f"job array {job}" if job else "nothing more to submit") +
              f" ({_counts(st)}); `testbed sweep --status {st.dir}`, or --wait")


def _topology_document(path: Optional[Path]) -> dict:
    """The topology the elements bring up, as its checked document (hosts, if it places nodes
    on some, become each element's job's nodes)."""
    from testbed.hosts.slurm import job as slurmjob
    from testbed.model.topology import load_topology_dict, read_topology_file
    from testbed.runs.testbeds import DEFAULT_TOPOLOGY

    data, source = read_topology_file(path or DEFAULT_TOPOLOGY)
    if not isinstance(data, dict):
        load_topology_dict(data, source=source)  # its one-line error
        raise TestbedError(f"{source}: not a topology")
    names = slurmjob.host_names(data)
    nodes = [f"node{i}" for i in range(len(names))]
    checked = slurmjob.assign(data, 0, nodes, {n: "192.0.2.1" for n in nodes}, None, "testbed") if names else data
    load_topology_dict(checked, source=source)  # as an element will load it
    return data


def _look(status: Optional[Path], cancel: Optional[Path], wait: bool, as_json: bool) -> None:
    from testbed.runs.sweeps import slurm as slurmsweep

    if status is not None and cancel is not None:
        raise usage("--status and --cancel: give one")
    if cancel is not None:
        jobs = slurmsweep.cancel(cancel.resolve())
        if as_json:
            emit({"dir": str(cancel), "cancelled": jobs})
        else:
            plain(f"cancelled job array(s) {', '.join(jobs) or '(none submitted)'} of {cancel}")
        return
    assert status is not None
    st = _follow(status.resolve(), as_json) if wait else slurmsweep.status(status.resolve())
    if as_json:
        emit(st.to_dict())
        return
    t = Table("element", "run", "state", "job", "detail", title=f"sweep {escape(str(st.dir))}: {_counts(st)}")
    for e in st.elements:
        t.add_row(str(e.index), escape(e.point.run_id), _styled(e.state), escape(f"{e.job}_{e.index}" if e.job else "-"),
                  escape((e.error or "").splitlines()[0][:100] if e.error else ""))
    out.print(t)


def _styled(state: str) -> str:
    colour = {"ok": "green", "running": "cyan", "pending": "blue", "missing": "dim"}.get(state, "red")
    return f"[{colour}]{state}[/]"


def _counts(st) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(st.count().items()))


def _follow(d: Path, as_json: bool):
    """``--wait``: the array followed with a progress bar (stderr) until every element ended."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from testbed.runs.sweeps import slurm as slurmsweep

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json or not err.is_terminal, transient=True) as bar:
        task = bar.add_task("sweep", total=None)

        def update(st) -> None:
            ended = sum(n for state, n in st.count().items() if state not in slurmsweep.LIVE)
            bar.update(task, total=len(st.elements), completed=ended, description=escape(_counts(st)))

        return slurmsweep.wait(d, update)


def _ended(st, as_json: bool) -> None:
    """What a local sweep prints at its end; exit 1 when a run is not ok."""
    failed = [e for e in st.elements if e.state != "ok"]
    if not as_json:
        plain(f"sweep directory: {st.dir} ({len(st.elements) - len(failed)} runs ok, {len(failed)} not: "
              f"{_counts(st)}); `testbed report {st.dir}`")
    if failed:
        raise typer.Exit(1)


def sweep_element(directory: Path = typer.Argument(..., metavar="DIR", help="The sweep's directory.")):
    """One element of a Slurm sweep (the array's batch script runs it)."""
    with guard(False):
        from testbed.runs.sweeps.element import element

        result = element(directory, sayer(False))
        plain(f"element {result['run_id']}: {result['status']}")
        if result["status"] != "ok":
            raise typer.Exit(1)
