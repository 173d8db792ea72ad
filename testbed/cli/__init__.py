"""The `testbed` command: parse -> call the library -> render. No logic here.

Exit codes: 0 ok, 1 failure, 2 usage. With --json, stdout carries exactly one JSON
object (errors too: {"error": ..., "hint": ...}); progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from testbed.common.version import __version__
from testbed.common.errors import TestbedError

out = Console()
err = Console(stderr=True, soft_wrap=True)

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Emulated networks for distributed training: namespaces, bridges, shaped links.")
link_app = typer.Typer(no_args_is_help=True, help="Show or change the links of a running testbed.")
app.add_typer(link_app, name="link")
monitor_app = typer.Typer(no_args_is_help=True, help="A real Prometheus scraping testbed's links and runs.")
app.add_typer(monitor_app, name="monitor")
image_app = typer.Typer(no_args_is_help=True, help="Worker images for backend: docker (and the guest of backend: vm).")
app.add_typer(image_app, name="image")

JsonOpt = typer.Option(False, "--json", help="Print one JSON object on stdout and nothing else.")
TestbedOpt = typer.Option(None, "--testbed", "-t", help="Testbed name (default: the only one that is up).")
ExporterOpt = typer.Option(True, "--exporter/--no-exporter",
                           help="Start the testbed's Prometheus exporter on the host (announced to "
                                "`testbed monitor` through file-based discovery; stopped by `down`).")
RunExporterOpt = typer.Option(True, "--exporter/--no-exporter",
                              help="Serve the training metrics (and, for a testbed brought up here, its link "
                                   "metrics) to Prometheus on loopback, announced through file-based discovery.")
ExporterListenOpt = typer.Option("127.0.0.1:0", "--exporter-listen", metavar="HOST:PORT",
                                 help="Where the exporter listens (port 0: any free port; loopback by default).")


def _lit(*cells):
    """Table cells printed literally: a user's link name `[/x]` is text, never Rich markup."""
    return tuple(Text(c) if isinstance(c, str) else c for c in cells)


class _Fail(Exception):
    def __init__(self, error: TestbedError, as_json: bool):
        self.error, self.as_json = error, as_json


def _emit(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=1, default=str) + "\n")


def _resolve_name(name: Optional[str]) -> str:
    from testbed.engine.core import list_testbeds

    if name:
        return name
    up = [t["name"] for t in list_testbeds()]
    if len(up) == 1:
        return up[0]
    if not up:
        raise TestbedError("no testbed is up", "start one with `testbed up topologies/three_switch.yaml`")
    raise TestbedError(f"several testbeds are up ({', '.join(up)})", "choose one with --testbed NAME")


@contextlib.contextmanager
def _guard(as_json: bool):
    """Turn a TestbedError into a clean exit 1 (message + hint, or JSON) in main()."""
    try:
        yield
    except TestbedError as e:
        raise _Fail(e, as_json) from None


# --------------------------------------------------------------------------- up


@app.command()
def up(
    file: Path = typer.Argument(..., help="Topology YAML file, e.g. topologies/three_switch.yaml."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and print the plan; create nothing."),
    exporter: bool = ExporterOpt,
    exporter_listen: str = ExporterListenOpt,
    as_json: bool = JsonOpt,
):
    """Build the emulated network described by FILE (and start its link exporter)."""
    with _guard(as_json):
        from testbed.model.topology import load_topology

        topo = load_topology(file)
        if dry_run:
            from testbed.engine.core import host_routes
            from testbed.engine.planner import make_plan
            from testbed.plan.plan import choose_subnet

            try:
                routes = host_routes()
            except Exception:
                routes = []
            under = None
            if topo.multi_host:  # tunnel addresses as given; this host's is found at up
                under = {"local": "<this host>", **{h.name: h.underlay for h in topo.hosts}}
            plan = make_plan(topo, choose_subnet(topo, routes), under)
            where = plan.placement or ["local"] * len(plan.actions)
            if as_json:
                _emit({"name": topo.name, "subnet": str(plan.subnet), "hosts": plan.hosts,
                       "actions": [{**a.to_dict(), "host": h} for a, h in zip(plan.actions, where)]})
            else:
                out.print(f"plan for [bold]{escape(topo.name)}[/]: {len(plan.actions)} actions, subnet {plan.subnet}")
                for i, (a, h) in enumerate(zip(plan.actions, where)):
                    out.print(f"{i:5d}  {'' if not topo.multi_host else f'{h}: '}{a.describe()}",
                              highlight=False, markup=False)
            return
        from testbed.engine.core import Testbed

        with Progress(TextColumn("[bold]up {task.fields[name]}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("{task.description}"), console=err,
                      transient=True, disable=as_json or not err.is_terminal) as prog:
            task = prog.add_task("", total=None, name=topo.name)

            def step(done: int, total: int, what: str) -> None:
                prog.update(task, completed=done, total=total, description=what[:60])

            tb = Testbed.up(topo, progress=step, exporter=exporter_listen if exporter else None)
        if as_json:
            _emit(tb.to_dict())
        else:
            _render_testbed(tb.to_dict())
            out.print(f"[green]testbed {escape(tb.name)} is up[/]: `testbed exec {escape(tb.workers[0].name)} -- CMD`, "
                      f"`testbed link show`, `testbed down {escape(tb.name)}`")
            if tb.to_dict()["exporter"]:
                out.print("(`testbed monitor up` starts a Prometheus that scrapes the link metrics)")


# --------------------------------------------------------------------------- down


@app.command()
def down(
    name: Optional[str] = typer.Argument(None, help="Testbed name (default: the only one that is up)."),
    all_: bool = typer.Option(False, "--all", help="Remove every testbed of this state directory, and what its lost ledgers left (tagged namespaces, labelled containers)."),
    as_json: bool = JsonOpt,
):
    """Remove a testbed: every namespace, link, bridge, qdisc and process it created."""
    with _guard(as_json):
        from testbed.engine.core import down as _down
        from testbed.engine.core import down_all

        if all_:
            removed = down_all()
        else:
            if name is None:
                name = _resolve_name(None)
            removed = [name] if _down(name) else []
        if as_json:
            _emit({"removed": removed})
        elif removed:
            out.print(f"removed: {', '.join(removed)}", markup=False)
        else:
            out.print(f"nothing to remove{f' (testbed {name} is not up)' if name else ''}", markup=False)


# --------------------------------------------------------------------------- status


@app.command()
def status(
    name: Optional[str] = typer.Argument(None, help="Testbed name; without it, list all testbeds."),
    as_json: bool = JsonOpt,
):
    """Show running testbeds, or one testbed's nodes (kernel names, addresses) and links."""
    with _guard(as_json):
        from testbed.engine.core import Testbed, list_testbeds

        if name is None:
            tbs = list_testbeds()
            if as_json:
                _emit({"testbeds": tbs})
                return
            if not tbs:
                out.print("no testbed is up")
                return
            t = Table("name", "state", "workers", "links", "topology file")
            for x in tbs:
                t.add_row(*_lit(x["name"], "up" if x["ready"] else Text("incomplete (run down)", style="red"),
                                str(x["workers"]), str(x["links"]), x["source"] or ""))
            out.print(t)
            return
        tb = Testbed.attach(name)
        if as_json:
            _emit(tb.to_dict())
        else:
            _render_testbed(tb.to_dict())


def _render_testbed(d: dict) -> None:
    hosts = any(n.get("host", "local") != "local" for n in d["nodes"])
    nodes = Table("node", "kind", "rank", "backend", *(("host",) if hosts else ()), "netns", "interface", "address",
                  title=f"testbed {d['name']}: nodes", title_justify="left")
    for n in d["nodes"]:
        nodes.add_row(*_lit(n["name"], n["kind"], "" if n["rank"] is None else str(n["rank"]), n["backend"] or "",
                            *((n.get("host", "local"),) if hosts else ()), n["netns"], n["iface"] or "",
                            f"{n['address']}/{d['subnet'].split('/')[1]}" if n["address"] else ""))
    out.print(nodes)
    links = Table("link", "endpoints", "bottleneck", "forward (a->b)", "reverse (b->a)", "interfaces",
                  title="links", title_justify="left")
    for l in d["links"]:
        links.add_row(*_lit(l["name"], f"{l['a']} - {l['b']}", "yes" if l["bottleneck"] else "",
                            _shape_str(l["forward"]["shape"]), _shape_str(l["reverse"]["shape"]),
                            f"{l['forward']['ifname']} / {l['reverse']['ifname']}"))
    out.print(links)
    if d.get("exporter"):
        out.print(f"link metrics: {d['exporter']}", highlight=False, markup=False)


def _shape_str(s: dict) -> str:
    parts = [s["rate"]]
    if "delay" in s:
        parts.append(f"delay {s['delay']}" + (f"±{s['jitter']}" if "jitter" in s else ""))
    if "loss" in s:
        parts.append(f"loss {s['loss']}")
    if "limit" in s:
        parts.append(f"limit {s['limit']}")
    return " ".join(parts)


# --------------------------------------------------------------------------- link


@link_app.command("show")
def link_show(testbed: Optional[str] = TestbedOpt, as_json: bool = JsonOpt):
    """List links with their shape and live counters per direction."""
    with _guard(as_json):
        from testbed.engine.core import Testbed

        tb = Testbed.attach(_resolve_name(testbed))
        rows = tb.link_stats()
        if as_json:
            _emit({"testbed": tb.name, "links": rows})
            return
        t = Table("link", "dir", "shape", "bytes", "packets", "drops", "overlimits", "backlog",
                  title=f"testbed {tb.name}: links", title_justify="left")
        for l in rows:
            for d in ("forward", "reverse"):
                x = l[d]
                c = x["counters"]
                t.add_row(*_lit(l["name"] + (" *" if l["bottleneck"] else "") if d == "forward" else "",
                                f"{x['src']}->{x['dst']}", _shape_str(x["shape"]), f"{c.get('bytes', 0):,}",
                                f"{c.get('packets', 0):,}", str(c.get("drops", 0)), str(c.get("overlimits", 0)),
                                f"{c.get('backlog_bytes', 0)}B"))
        out.print(t)
        out.print("* bottleneck link")


@link_app.command("set")
def link_set(
    link: Optional[str] = typer.Argument(None, help="Link name (e.g. s1-s0, or its 'name:'), or its index."),
    bottleneck: bool = typer.Option(False, "--bottleneck", help="Change every link marked bottleneck."),
    bw: Optional[str] = typer.Option(None, "--bw", help="Rate, e.g. 100mbit, 1gbit."),
    delay: Optional[str] = typer.Option(None, "--delay", help="One-way delay, e.g. 10ms (needs netem)."),
    jitter: Optional[str] = typer.Option(None, "--jitter", help="Delay variation, e.g. 1ms (needs netem)."),
    loss: Optional[str] = typer.Option(None, "--loss", help="Packet loss, e.g. 0.1% (needs netem)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Queue limit in packets (1..10000000)."),
    direction: str = typer.Option("both", "--direction", help="both, forward (a->b) or reverse (b->a)."),
    testbed: Optional[str] = TestbedOpt,
    as_json: bool = JsonOpt,
):
    """Change a running link's shape in place (flows keep running)."""
    with _guard(as_json):
        from testbed.engine.core import Testbed

        if link is not None and bottleneck:
            raise TestbedError("give a link or --bottleneck, not both")

        from testbed.model.topology import parse_shape_values

        changes = parse_shape_values(dict(rate=bw, delay=delay, jitter=jitter, loss=loss, limit=limit),
                                     {"rate": "--bw", "delay": "--delay", "jitter": "--jitter", "loss": "--loss",
                                      "limit": "--limit"})
        tb = Testbed.attach(_resolve_name(testbed))
        links = tb.set_links(tb.find_links(link, bottleneck=bottleneck), direction=direction, **changes)
        if as_json:
            _emit({"testbed": tb.name, "changed": [{"name": l.name, "forward": l.forward.to_dict(),
                                                    "reverse": l.reverse.to_dict()} for l in links]})
        else:
            for l in links:
                out.print(f"{l.name}: {l.a}->{l.b} {l.forward.describe()}, {l.b}->{l.a} {l.reverse.describe()}",
                      markup=False, highlight=False)


@link_app.command("replay")
def link_replay(
    args: Optional[List[str]] = typer.Argument(None, metavar="[LINK] TRACE",
                                     help="The link (or --bottleneck) and the trace file."),
    bottleneck: bool = typer.Option(False, "--bottleneck", help="Drive every link marked bottleneck."),
    fmt: str = typer.Option("auto", "--format", help="csv (time_s,rate[,delay[,loss]]), mahimahi or auto."),
    window: float = typer.Option(1.0, "--window", help="mahimahi: seconds per rate step."),
    loop: bool = typer.Option(False, "--loop", help="csv: repeat (the last line, equal to the first, marks the period)."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Stop after this many seconds."),
    direction: str = typer.Option("both", "--direction", help="both, forward (a->b) or reverse (b->a)."),
    restore: bool = typer.Option(False, "--restore", help="Put the shapes from before back at the end."),
    log: Optional[Path] = typer.Option(None, "--log", help="Append each applied step as a JSON line here."),
    background: bool = typer.Option(False, "--background", help="Run it as a background process (recorded in the "
                                     "ledger; `--stop` or `testbed down` ends it)."),
    stop: bool = typer.Option(False, "--stop", help="Stop the testbed's background replays (shapes put back)."),
    from_topology: bool = typer.Option(False, "--from-topology", help="Follow LINK's schedule: in the topology "
                                       "(no TRACE file)."),
    replay_id: Optional[str] = typer.Option(None, "--replay-id", hidden=True),
    while_pid: Optional[int] = typer.Option(None, "--while-pid", hidden=True),
    start_on: Optional[Path] = typer.Option(None, "--start-on", hidden=True),
    testbed: Optional[str] = TestbedOpt,
    as_json: bool = JsonOpt,
):
    """Drive running links through a bandwidth trace, each step in place at its time.

    Runs in the foreground until the trace ends (a looping one: --duration or Ctrl-C), or
    with --background as a process of its own. Ctrl-C, SIGTERM and --stop put the shapes
    from before back.
    """
    with _guard(as_json):
        import math

        from testbed.engine.core import Testbed
        from testbed.engine.replay import check, open_log, replay, start_background, stop_background
        from testbed.model.trace import MAX_SPAN_S, load_trace

        if stop:
            if args or background or bottleneck:
                raise TestbedError("--stop takes no LINK, TRACE or --background", "write: testbed link replay --stop")
            tb = Testbed.attach(_resolve_name(testbed))
            pids = stop_background(tb.name)
            if as_json:
                _emit({"testbed": tb.name, "stopped": pids})
            else:
                out.print(f"stopped {len(pids)} background replay(s) of {tb.name}"
                          + ("; each put the shapes from before back" if pids else ""), markup=False, highlight=False)
            return
        args = args or []
        if while_pid is not None and while_pid <= 0:
            raise TestbedError(f"--while-pid {while_pid}: not a process id")
        if from_topology:
            if bottleneck or len(args) != 1:
                raise TestbedError("with --from-topology give only the LINK whose schedule: to follow")
            link, trace_file = args[0], None
        else:
            want = 1 if bottleneck else 2
            if len(args) != want:
                raise TestbedError("give LINK TRACE, or --bottleneck TRACE" if not bottleneck
                                   else "with --bottleneck give only the TRACE file")
            link, trace_file = (None, args[0]) if bottleneck else args
        if direction not in ("both", "forward", "reverse"):
            raise TestbedError(f"--direction {direction!r}: choose both, forward or reverse")
        if duration is not None and not (math.isfinite(duration) and 0 < duration <= MAX_SPAN_S):
            raise TestbedError(f"--duration must be a number of seconds in (0, {MAX_SPAN_S:g}], got {duration}")
        trace = load_trace(Path(trace_file), fmt, window, loop) if trace_file is not None else None
        tb = Testbed.attach(_resolve_name(testbed))
        links = tb.find_links(link, bottleneck=bottleneck)
        names = ", ".join(l.name for l in links)
        if trace is None:
            trace = links[0].schedule
            if trace is None:
                raise TestbedError(f"link {links[0].name} has no schedule: in the topology",
                                   "give a TRACE file instead of --from-topology")
        if trace.loop and duration is None and as_json and not background:
            raise TestbedError("a looping trace with --json needs --duration (the JSON comes at the end)")
        if background:
            check(links, trace, direction)  # refused here, not in a process nobody watches
            bg = start_background(tb.name, None if from_topology else Path(trace_file), link=link, fmt=fmt,
                                  window_s=window, loop=loop, duration_s=duration, direction=direction,
                                  restore=restore, log=log)
            if as_json:
                _emit({"testbed": tb.name, "links": [l.name for l in links], "trace": trace.source or str(trace_file),
                       "pid": bg.proc.pid, "log": str(bg.log), "output": str(bg.output)})
            else:
                out.print(f"replaying {trace.source or trace_file} on {names} in the background (pid {bg.proc.pid}); steps are "
                          f"logged to {bg.log}; `testbed link replay --stop` or `testbed down` ends it",
                          markup=False, highlight=False)
            return

        def show(rec):
            if not as_json:
                out.print(f"{rec['at_s']:9.3f} s  {names}: {rec['rate']}"
                          + "".join(f" {k} {rec[k]}" for k in ("delay", "loss") if k in rec)
                          + f"  (in force {rec['late_s'] * 1000:.1f} ms after its time)", markup=False, highlight=False)

        logf = open_log(log)
        try:
            res = replay(tb, links, trace, direction=direction, duration_s=duration, restore=restore, log=logf,
                         on_step=show, stop=None if while_pid is None else lambda: not _pid_alive(while_pid),
                         start_when=None if start_on is None else start_on.exists)
        except KeyboardInterrupt:
            raise TestbedError(f"interrupted: the shapes from before were put back on {names}") from None
        finally:
            if logf:
                logf.close()
        late = res.lateness()
        if as_json:
            _emit({"testbed": tb.name, "links": [l.name for l in links], "trace": trace.source or str(trace_file),
                   "period_s": trace.period_s, **res.to_dict()})
        else:
            out.print(f"{late['steps']} steps applied" + (f"; in force after their time: median "
                      f"{late['median_s'] * 1000:.1f} ms, p95 {late['p95_s'] * 1000:.1f} ms, max "
                      f"{late['max_s'] * 1000:.1f} ms" if late["steps"] else "")
                      + ("; shapes from before restored" if res.restored else ""), markup=False, highlight=False)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


# --------------------------------------------------------------------------- exec


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec(
    node: str = typer.Argument(..., help="Node name (a worker; a switch runs in the switches' namespace)."),
    cmd: List[str] = typer.Argument(..., help="Command and arguments, after '--'."),
    testbed: Optional[str] = TestbedOpt,
):
    """Run a command inside a node: `testbed exec w0 -- ping -c1 10.200.0.2`."""
    with _guard(False):
        from testbed.engine.core import Testbed

        tb = Testbed.attach(_resolve_name(testbed))
        argv = tb.command(node, cmd, cwd=None)  # through the node's backend (netns, container)
        out.file.flush()
        os.execv(argv[0], argv)


# --------------------------------------------------------------------------- run

# What the plain `testbed run SCHEME` trains: a bundled real dataset and a model that finish
# in a few minutes on a 2-core CPU machine with eight ranks.
RUN_DEFAULTS = {"model": "cnn", "dataset": "digits", "epochs": 15.0, "batch_size": 32}


def _workload_args(*, model, width, depth, dataset, data_dir, epochs, max_iters, batch_size, lr, target_acc,
                   stop_at_target, seed, prune_ratio, prune_method, ternary, topk_ratio, init, backend,
                   eval_every, compute_time, extra) -> list[str]:
    """The command line of `python -m workloads.train` (no shell ever sees it)."""
    args = ["--model", model, "--dataset", dataset, "--epochs", str(epochs), "--batch-size", str(batch_size),
            "--seed", str(seed), "--backend", backend]
    for flag, value in (("--width", width), ("--depth", depth), ("--data-dir", data_dir),
                        ("--max-iters", max_iters), ("--lr", lr), ("--target-acc", target_acc),
                        ("--prune-ratio", prune_ratio), ("--prune-method", prune_method),
                        ("--topk-ratio", topk_ratio), ("--init", init), ("--eval-every", eval_every),
                        ("--compute-time", compute_time)):
        if value is not None:
            args += [flag, str(value)]
    if ternary:
        args.append("--ternary")
    if stop_at_target:
        args.append("--stop-at-target")
    return args + list(extra)


def _with_prune_ratios(names: list[str], ratios: str) -> list[str]:
    """Each pactrain entry once per ratio: ``pactrain:ternary`` x 0.3,0.5 -> ``pactrain:0.3:ternary``, ..."""
    values = [x.strip() for x in ratios.split(",") if x.strip()]
    for v in values:
        try:
            ok = 0 <= float(v) < 1
        except ValueError:
            ok = False
        if not ok:
            raise TestbedError(f"--prune-ratios: {v!r} is not a ratio in [0, 1)", "e.g. --prune-ratios 0.1,0.3,0.5,0.7,0.9")
    if not values:
        raise TestbedError("--prune-ratios is empty", "e.g. --prune-ratios 0.1,0.3,0.5,0.7,0.9")
    from workloads.schemes import parse_variant

    out = []
    for name in names:
        base, *rest = name.split(":")
        if base != "pactrain":
            out.append(name)
            continue
        try:
            sets_ratio = "prune_ratio" in parse_variant(name)[1]
        except ValueError as e:
            raise TestbedError(f"--schemes: {e}") from None
        if sets_ratio:
            raise TestbedError(f"--schemes {name!r} sets a pruning ratio and --prune-ratios gives them too",
                               "write the pactrain entry without a ratio (e.g. pactrain or pactrain:ternary)")
        out += [":".join(["pactrain", v, *rest]) for v in values]
    if out == names:
        raise TestbedError("--prune-ratios needs a pactrain entry in --schemes", "e.g. --schemes allreduce,pactrain")
    return out


def _pretraining(workload: dict, dataset: Optional[str], epochs: float):
    """The shared checkpoint's description (testbed.runs.sweep.Pretraining), checked."""
    import math

    from testbed.runs.sweep import Pretraining

    if not (math.isfinite(epochs) and epochs > 0):
        raise TestbedError(f"--pretrain-epochs must be a number > 0, got {epochs}")
    dataset = dataset or workload["dataset"]
    from workloads import data

    if dataset not in data.DATASETS:
        raise TestbedError(f"--pretrain-dataset: unknown dataset {dataset!r}",
                           f"choose one of: {', '.join(data.DATASETS)}")
    return Pretraining(model=workload["model"], dataset=dataset, epochs=epochs, width=workload["width"],
                       depth=workload["depth"], data_dir=workload["data_dir"], seed=workload["seed"])


def _check_timeout(timeout: float) -> None:
    import math

    if not math.isfinite(timeout) or timeout <= 0:
        raise TestbedError(f"--timeout must be a number of seconds > 0, got {timeout}", "e.g. --timeout 300")


def _check_workload(scheme: str, args: list[str]) -> None:
    try:
        from workloads.train import check
    except ImportError as e:
        raise TestbedError(f"the training workloads cannot be imported ({e})",
                           "install torch first (pip install torch==2.13.0), then pip install '.[train]'") from None
    try:
        check(["--scheme", scheme, *args])
    except ValueError as e:
        raise TestbedError(f"workload: {e}", "see python -m workloads.train --help") from None


def _status_table(st) -> Table:
    t = Table.grid(padding=(0, 2))
    it = f"{st.iteration}/{st.total}" if st.total else str(st.iteration)
    t.add_row("iteration", it, "epoch", str(st.epoch), "loss", "-" if st.loss is None else f"{st.loss:.4f}",
              "accuracy", "-" if st.accuracy is None else f"{st.accuracy:.4f}")
    for name, u in sorted(st.utilisation.items()):
        t.add_row(*_lit("", "", "", "", "link", name, "utilisation", f"{u:.0%}"))
    return t


_WORKLOAD_OPTIONS = [  # (name, type, typer option): shared by `run` and `sweep`
    ("model", str, typer.Option(RUN_DEFAULTS["model"], "--model", help="cnn, resnet18, resnet152, vgg19, vit_b16.")),
    ("width", Optional[float], typer.Option(None, "--width", help="Model width multiplier.")),
    ("depth", Optional[int], typer.Option(None, "--depth", help="Model depth cap.")),
    ("dataset", str, typer.Option(RUN_DEFAULTS["dataset"], "--dataset",
                                  help="digits (bundled), cifar10, cifar100, synthetic.")),
    ("data_dir", Optional[Path], typer.Option(None, "--data-dir", help="Directory with the CIFAR python-pickle folders.")),
    ("epochs", float, typer.Option(RUN_DEFAULTS["epochs"], "--epochs", help="Epochs (fractions allowed).")),
    ("max_iters", Optional[int], typer.Option(None, "--max-iters", help="Stop after this many iterations.")),
    ("batch_size", int, typer.Option(RUN_DEFAULTS["batch_size"], "--batch-size", help="Per worker.")),
    ("lr", Optional[float], typer.Option(None, "--lr", help="Learning rate (workload default 0.05).")),
    ("target_acc", Optional[float], typer.Option(None, "--target-acc", help="Accuracy (0-1) for time-to-accuracy.")),
    ("stop_at_target", bool, typer.Option(False, "--stop-at-target", help="Stop once --target-acc is reached.")),
    ("seed", int, typer.Option(0, "--seed")),
    ("prune_ratio", Optional[float], typer.Option(None, "--prune-ratio", help="pactrain: fraction pruned (0.5).")),
    ("prune_method", Optional[str], typer.Option(None, "--prune-method", help="pactrain: magnitude or grasp.")),
    ("ternary", bool, typer.Option(False, "--ternary", help="pactrain: ternary compact tensor.")),
    ("topk_ratio", Optional[float], typer.Option(None, "--topk-ratio", help="topk: fraction sent (0.01).")),
    ("init", Optional[Path], typer.Option(None, "--init", help="Checkpoint from python -m workloads.pretrain.")),
    ("backend", str, typer.Option("auto", "--backend", help="auto, gloo or nccl.")),
    ("eval_every", Optional[int], typer.Option(None, "--eval-every",
                                               help="Iterations between evaluations (default: each epoch).")),
    ("compute_time", Optional[float], typer.Option(None, "--compute-time", help="Paper-scale traffic: forward and "
                                                   "backward replaced by this many seconds per iteration (e.g. "
                                                   "measured on your GPU); real parameters, buckets, hooks and "
                                                   "collectives; no accuracy. Needs --max-iters.")),
]


def _with_workload_options(fn):
    """Add the workload options to a command; it receives them as one dict, ``workload``."""
    import functools
    import inspect

    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.name != "workload"]
    extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=o, annotation=t)
             for n, t, o in _WORKLOAD_OPTIONS]
    cut = next(i for i, p in enumerate(own) if p.name == "as_json")  # --json stays last in --help
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if i >= cut else p for i, p in enumerate(own)]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        workload = {n: kwargs.pop(n) for n, _, _ in _WORKLOAD_OPTIONS}
        return fn(*args, workload=workload, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own[:cut] + extra + own[cut:])
    return wrapper


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
@_with_workload_options
def run(
    ctx: typer.Context,
    scheme: str = typer.Argument(..., help="allreduce, fp16, topk, powersgd, terngrad, pactrain, spardl, prunex or "
                                 "hier-allreduce; or a variant setting its hyper-parameters: topk:0.1, "
                                 "pactrain:0.8:ternary, powersgd:8, terngrad:clip=0."),
    bw: Optional[str] = typer.Option(None, "--bw", help="Rate of the bottleneck links for this run, e.g. 100mbit."),
    bw_trace: Optional[Path] = typer.Option(None, "--bw-trace", help="The bottleneck links follow this trace (CSV "
                                            "time_s,rate[,delay,loss] or Mahimahi) during the run."),
    trace_format: str = typer.Option("auto", "--trace-format", help="--bw-trace's format: csv, mahimahi or auto."),
    trace_window: float = typer.Option(1.0, "--trace-window", help="mahimahi: seconds per rate step."),
    trace_loop: bool = typer.Option(False, "--trace-loop", help="csv: repeat the trace until the run ends."),
    cross_traffic: Optional[List[str]] = typer.Option(None, "--cross-traffic", help="Background TCP flows during the "
                                                      "run, e.g. 'w0->w7,flows=2' or 'w1->w6,rate=20mbit,on=2s,off=3s' "
                                                      "(repeatable; 'none': not even the topology's traffic:)."),
    pretrain: Optional[bool] = typer.Option(None, "--pretrain/--no-pretrain", help="Start from a pre-trained "
                                            "checkpoint, made once and cached in OUT/checkpoints (default: yes for "
                                            "pactrain, which prunes a trained network; no for the others)."),
    pretrain_dataset: Optional[str] = typer.Option(None, "--pretrain-dataset", help="Pre-train on this dataset "
                                                   "(default: --dataset)."),
    pretrain_epochs: float = typer.Option(2.0, "--pretrain-epochs", help="Epochs of pre-training."),
    topology: Optional[Path] = typer.Option(None, "--topology", help="Topology to bring up (default three_switch)."),
    testbed: Optional[str] = typer.Option(None, "--testbed", "-t", help="Run on this running testbed; leave it up."),
    out_dir: Path = typer.Option(Path("runs"), "--out", help="Directory for run directories."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds without progress from any rank before the run is stopped."),
    exporter: bool = RunExporterOpt,
    as_json: bool = JsonOpt,
    workload: dict = None,
):
    """Train SCHEME across the emulated network, one rank per worker, and record everything.

    Without --testbed, brings up --topology (three_switch by default) and removes it after.
    Arguments after `--` go to `python -m workloads.train` unchanged.
    """
    with _guard(as_json):
        import math

        from testbed.runs.experiment import RunRequest
        from testbed.runs.experiment import run as run_experiment
        from testbed.model.units import Rate, UnitError

        try:
            rate = Rate.parse(bw) if bw is not None else None
        except UnitError as e:
            raise TestbedError(f"--bw: {e}") from None
        _check_timeout(timeout)
        wargs = _workload_args(**workload, extra=ctx.args)
        _check_workload(scheme, wargs)
        from workloads.schemes import parse_variant

        if pretrain is False and workload["init"] is not None:
            raise TestbedError("--no-pretrain and --init contradict each other", "give one of them")
        if pretrain is None:  # auto: pactrain prunes a trained network; --pretrain-dataset implies it
            pretrain = pretrain_dataset is not None or (parse_variant(scheme)[0].prunes and workload["init"] is None
                                                        and workload["compute_time"] is None)
        if pretrain and workload["compute_time"] is not None:
            raise TestbedError("--compute-time measures traffic, not accuracy: pre-training does not apply",
                               "drop --pretrain/--pretrain-dataset")
        elif pretrain_dataset is not None and not pretrain:
            raise TestbedError("--pretrain-dataset needs pre-training", "drop --no-pretrain")
        if pretrain and workload["init"] is None:
            from testbed.runs.experiment import check_out
            from testbed.runs.sweep import checkpoint

            pre = _pretraining(workload, pretrain_dataset, pretrain_epochs)
            check_out(out_dir)
            wargs += ["--init", str(checkpoint(out_dir, pre, lambda m: None if as_json else
                                               err.print(m, highlight=False, markup=False)))]
        model, dataset, epochs, batch_size = (workload[k] for k in ("model", "dataset", "epochs", "batch_size"))
        if not as_json:
            err.print(f"[bold]testbed run {escape(scheme)}[/]: model {escape(model)}, dataset {escape(dataset)}, "
                      f"{epochs:g} epochs, batch {batch_size}/worker, bottleneck {rate or (f'trace {escape(str(bw_trace))}' if bw_trace else 'as configured')}, topology "
                      f"{escape(str(testbed or topology or 'three_switch (default)'))}", highlight=False)
        if not (math.isfinite(trace_window) and trace_window > 0):
            raise TestbedError(f"--trace-window must be a positive number of seconds, got {trace_window}")
        flows = None
        if cross_traffic:
            from testbed.runs.traffic import parse_spec

            flows = [] if cross_traffic == ["none"] else [parse_spec(x) for x in cross_traffic]
        req = RunRequest(scheme=scheme, workload_args=wargs, topology=topology, testbed=testbed, bw=rate,
                         out=out_dir, timeout=timeout, exporter=exporter, bw_trace=bw_trace,
                         trace_format=trace_format, trace_window=trace_window, trace_loop=trace_loop,
                         cross_traffic=flows)
        summary = _run_with_display(req, run_experiment, as_json)
        if as_json:
            _emit(summary)
        else:
            _render_summary(summary)


def _run_with_display(req, run_experiment, as_json: bool) -> dict:
    from rich.live import Live

    live_on = not as_json and err.is_terminal
    with Live(console=err, refresh_per_second=2, transient=True) if live_on else contextlib.nullcontext() as live:
        def on_status(st):
            if live is not None:
                live.update(_status_table(st))

        def on_message(m):
            if not as_json:
                err.print(m, highlight=False, markup=False)
        return run_experiment(req, on_status=on_status, on_message=on_message)


def _render_summary(s: dict) -> None:
    t = Table("run", s["run_id"], show_header=True)
    tta = s.get("time_to_target_s")
    rows = [
        ("scheme", s["scheme"]), ("bottleneck", str(s.get("bw"))), ("ranks", str(s.get("world_size"))),
        ("iterations", str(s.get("iterations"))), ("final accuracy", f"{s.get('final_accuracy') or 0:.4f}" if s.get("accuracy_measured", True)
         else f"not measured (--compute-time {s.get('compute_time_s')} s)"),
        ("time to target", "not reached" if s.get("target_accuracy") and tta is None else
         ("-" if tta is None else f"{tta:.1f} s")),
        ("mean iteration", f"{s.get('mean_iter_s', 0) * 1000:.0f} ms"),
        ("payload / iteration", f"{s.get('mean_payload_bytes', 0):,.0f} B"),
        ("bottleneck bytes / iteration", f"{s['bottleneck'].get('bytes_per_iteration') or 0:,.0f} B"),
        ("bottleneck utilisation", f"mean {s['bottleneck'].get('mean_utilisation') or 0:.0%}, "
                                   f"max {s['bottleneck'].get('max_utilisation') or 0:.0%}"),
    ]
    for k, v in rows:
        t.add_row(*_lit(k, v))
    out.print(t)
    out.print(f"run directory: {s['run_dir']}  (`testbed report {s['run_dir']}`)", highlight=False, markup=False)


# --------------------------------------------------------------------------- sweep, report


@app.command(context_settings={"allow_extra_args": True})
@_with_workload_options
def sweep(
    ctx: typer.Context,
    schemes: str = typer.Option("allreduce,fp16,topk,pactrain", "--schemes", help="Comma-separated schemes or "
                                "variants, e.g. allreduce,topk:0.1,topk:0.01,pactrain:0.5:ternary."),
    bw: str = typer.Option("100mbit,500mbit,1gbit", "--bw", help="Comma-separated bottleneck rates."),
    repeats: int = typer.Option(1, "--repeats", help="Runs per scheme and rate; repeat k uses --seed + k. Report "
                                "shows the median and min-max."),
    pretrain_epochs: float = typer.Option(2.0, "--pretrain-epochs", help="Epochs of the shared pre-training."),
    pretrain_dataset: Optional[str] = typer.Option(None, "--pretrain-dataset", help="Pre-train on this dataset, "
                                                   "fine-tune on --dataset (default: the same dataset)."),
    prune_ratios: Optional[str] = typer.Option(None, "--prune-ratios", help="Comma-separated pruning ratios: each "
                                               "pactrain entry of --schemes runs at every one (the paper's Fig. 6)."),
    topology: Optional[Path] = typer.Option(None, "--topology", help="Topology to bring up (default three_switch)."),
    testbed: Optional[str] = typer.Option(None, "--testbed", "-t", help="Sweep on this running testbed."),
    out_dir: Path = typer.Option(Path("runs"), "--out", help="Where the sweep directory and checkpoints go."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds without progress before a run is stopped."),
    exporter: bool = RunExporterOpt,
    as_json: bool = JsonOpt,
    workload: dict = None,
):
    """Run every scheme at every bandwidth from one shared pre-trained checkpoint."""
    with _guard(as_json):
        from testbed.runs.sweep import SweepRequest
        from testbed.runs.sweep import sweep as run_sweep
        from testbed.model.units import Rate, UnitError

        names = [x.strip() for x in schemes.split(",") if x.strip()]
        if not names:
            raise TestbedError("--schemes is empty", "e.g. --schemes allreduce,fp16,topk,pactrain")
        rates = []
        for x in bw.split(","):
            try:
                rates.append(Rate.parse(x.strip()))
            except UnitError as e:
                raise TestbedError(f"--bw: {e}") from None
        if repeats < 1:
            raise TestbedError(f"--repeats must be >= 1, got {repeats}")
        _check_timeout(timeout)
        if prune_ratios is not None:
            names = _with_prune_ratios(names, prune_ratios)
        wargs = _workload_args(**{**workload, "init": None}, extra=ctx.args)
        for name in names:
            _check_workload(name, wargs)
        pre = _pretraining(workload, pretrain_dataset, pretrain_epochs)
        if workload["compute_time"] is not None:  # traffic only: no checkpoint to share
            if pretrain_dataset is not None:
                raise TestbedError("--compute-time measures traffic, not accuracy: --pretrain-dataset does not apply")
            pre = None
        req = SweepRequest(schemes=names, bws=rates, workload_args=wargs, repeats=repeats, topology=topology,
                           testbed=testbed, out=out_dir, timeout=timeout, init=workload["init"], pretrain=pre,
                           exporter=exporter)
        from rich.live import Live

        live_on = not as_json and err.is_terminal
        with Live(console=err, refresh_per_second=2, transient=True) if live_on else contextlib.nullcontext() as live:
            index = run_sweep(req, on_status=(lambda st: live.update(_status_table(st))) if live else None,
                              on_message=None if as_json else (lambda m: err.print(m, highlight=False, markup=False)))
        failed = [r for r in index["runs"] if r["status"] != "ok"]
        if as_json:
            _emit(index)
        else:
            out.print(f"sweep directory: {index['dir']} ({len(index['runs']) - len(failed)} runs ok, "
                      f"{len(failed)} failed); `testbed report {index['dir']}`", highlight=False, markup=False)
        if failed:
            raise typer.Exit(1)


@app.command()
def report(
    dirs: List[Path] = typer.Argument(..., help="Run directories, or directories holding them (a sweep)."),
    target_acc: Optional[float] = typer.Option(None, "--target-acc", help="Recompute time-to-accuracy for this target."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where tables and plots go (default: FIRST_DIR/report)."),
    as_json: bool = JsonOpt,
):
    """Tables and plots comparing schemes by time-to-accuracy, per bandwidth."""
    with _guard(as_json):
        from testbed.runs.report import find_runs, write

        if target_acc is not None and not 0 < target_acc <= 1:
            raise TestbedError(f"--target-acc is a fraction in (0, 1], got {target_acc}")
        runs = find_runs(dirs, warn=lambda m: err.print(Text(f"warning: {m}", style="yellow")))
        if not runs:
            raise TestbedError("no readable runs in " + ", ".join(map(str, dirs)), "see the warnings above")
        result = write(runs, out_dir or dirs[0] / "report", target_acc)
        if as_json:
            _emit(result)
            return
        def spread(r, key, fmt, scale=1.0):  # "median [min-max]" of key, key_min, key_max
            stem, unit = (key[:-2], "_s") if key.endswith("_s") else (key, "")
            mid, lo, hi = r[key], r.get(f"{stem}_min{unit}"), r.get(f"{stem}_max{unit}")
            if mid is None:
                return "-"
            text = format(mid * scale, fmt)
            if r["ok"] > 1 and lo is not None:
                text += f" [{format(lo * scale, fmt)}-{format(hi * scale, fmt) if hi is not None else 'not reached'}]"
            return text

        for bw in dict.fromkeys(r["bw"] for r in result["rows"]):
            t = Table("scheme", "runs", "TTA (s)", "TTA / allreduce", "final acc", "iter (ms)",
                      "iter / allreduce", "payload B/iter", "bottleneck B/iter",
                      title=Text(f"bottleneck {bw} (median [min-max] over repeats)"))
            for r in (x for x in result["rows"] if x["bw"] == bw):
                tta = ("-" if r["target_accuracy"] is None else
                       spread(r, "tta_s", ".1f") if r["tta_s"] is not None
                       else f"not reached ({r['reached']}/{r['ok']})")
                t.add_row(*_lit(r["scheme"], f"{r['ok']}/{r['runs']}", tta,
                                "-" if r["tta_vs_allreduce"] is None else f"{r['tta_vs_allreduce']:.2f}",
                                spread(r, "final_accuracy", ".4f"), spread(r, "mean_iter_s", ".0f", 1000),
                                "-" if r["iter_time_vs_allreduce"] is None else f"{r['iter_time_vs_allreduce']:.2f}",
                                "-" if r["payload_bytes_per_iter"] is None else f"{r['payload_bytes_per_iter']:,.0f}",
                                "-" if r["wire_bytes_per_iter"] is None else f"{r['wire_bytes_per_iter']:,.0f}"))
            out.print(t)
            for r in (x for x in result["rows"] if x["bw"] == bw and x["failed"]):
                out.print(Text(f"{r['scheme']}: {'; '.join(r['failed'])}", style="yellow"), highlight=False, markup=False)
        out.print(f"written to {result['out']}: {', '.join(result['files'])}", highlight=False, markup=False)


# --------------------------------------------------------------------------- doctor


@app.command()
def doctor(as_json: bool = JsonOpt):
    """Report what this machine can do (kernel features, docker, prometheus, GPUs, NCCL)."""
    from testbed.engine.doctor import as_dicts, run_checks

    checks = run_checks()
    ok = all(c.ok for c in checks if c.required)
    if as_json:
        _emit({"ok": ok, "checks": as_dicts(checks)})
    else:
        t = Table("check", "", "detail", "hint")
        for c in checks:
            mark = "[green]ok[/]" if c.ok else ("[red]MISSING[/]" if c.required else "[yellow]no[/]")
            t.add_row(*_lit(c.name + (" (required)" if c.required else ""), Text.from_markup(mark), c.detail,
                            c.hint or ""))
        out.print(t)
        out.print("[green]ready to build testbeds[/]" if ok else "[red]required features are missing[/]")
    raise typer.Exit(0 if ok else 1)


@app.command()
def version():
    """Print the version."""
    out.print(__version__)




@image_app.command("build")
def image_build(
    tag: str = typer.Option("testbed/worker:cpu", "--tag", help="Image tag to build."),
    force: bool = typer.Option(False, "--force", help="Rebuild the last step even if the content key matches."),
    vm: bool = typer.Option(False, "--vm", help="Build the guest of backend: vm instead (Debian's kernel, "
                            "fetched once with apt-get download, and a busybox initramfs)."),
    as_json: bool = JsonOpt,
):
    """Build the CPU worker image offline (debootstrap + pinned torch + workloads; cached by content)."""
    with _guard(as_json):
        if vm:
            from testbed.nodes import vmimage

            res = vmimage.build(say=(lambda m: None) if as_json else
                                (lambda m: err.print(m, highlight=False, markup=False)), force=force)
            if as_json:
                _emit(res)
            else:
                out.print(f"VM guest: kernel {res['kernel']}, initramfs {res['initrd']} "
                          f"({'cached' if res['cached'] else 'built'} in {res['seconds']:.1f} s)",
                          highlight=False, markup=False)
            return
        from testbed.nodes.images import build

        res = build(tag, say=(lambda m: None) if as_json else (lambda m: err.print(m, highlight=False, markup=False)),
                    force=force)
        if as_json:
            _emit(res)
        else:
            out.print(f"{res['tag']}: {res['id'][:19]} ({'cached' if res['cached'] else 'built'} in "
                      f"{res['seconds']:.1f} s)", highlight=False, markup=False)


MonitorDir = typer.Option(None, "--dir", help="Monitor directory: config, targets, TSDB "
                          "(default $TESTBED_MONITOR_DIR or /var/lib/testbed/monitor).")


@monitor_app.command("up")
def monitor_up(
    listen: str = typer.Option("127.0.0.1:9090", "--listen", help="Prometheus' HOST:PORT (loopback by default)."),
    runs: List[Path] = typer.Option([], "--runs", help="Also export the runs under this directory, e.g. runs "
                                    "of plain torchrun (repeatable; `testbed run` exports its own runs)."),
    exporter_listen: str = typer.Option("127.0.0.1:0", "--exporter-listen",
                                        help="HOST:PORT of the --runs exporter (port 0: any free port)."),
    scrape_interval: str = typer.Option("2s", "--scrape-interval", help="Prometheus scrape interval."),
    retention: str = typer.Option("15d", "--retention", help="How long Prometheus keeps samples."),
    mdir: Optional[Path] = MonitorDir,
    as_json: bool = JsonOpt,
):
    """Start Prometheus; it discovers the exporters of every testbed and run by itself."""
    with _guard(as_json):
        from testbed.monitor import prometheus as monitor

        st = monitor.up(mdir or monitor.DEFAULT_DIR, listen, runs, exporter_listen, scrape_interval, retention)
        if as_json:
            _emit(st)
            return
        out.print(f"Prometheus: {st['prometheus_url']}  (graph: {st['prometheus_url']}/graph)", highlight=False, markup=False)
        out.print(f"targets:    {', '.join(st['targets'])} (testbed up / run announce themselves there)",
                  highlight=False, markup=False)
        if st["exporter_url"]:
            out.print(f"runs:       {st['exporter_url']}", highlight=False, markup=False)
        out.print(f"data:       {st['dir']}/data; Grafana: `docker compose -f compose/docker-compose.yml up -d`, "
                  "then http://127.0.0.1:3000", highlight=False, markup=False)


@monitor_app.command("down")
def monitor_down(mdir: Optional[Path] = MonitorDir, as_json: bool = JsonOpt):
    """Stop what `monitor up` started; the metric history stays in the data directory."""
    with _guard(as_json):
        from testbed.monitor import prometheus as monitor

        stopped = monitor.down(mdir or monitor.DEFAULT_DIR)
        if as_json:
            _emit({"stopped": stopped})
        else:
            out.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"), highlight=False, markup=False)


@monitor_app.command("status")
def monitor_status(mdir: Optional[Path] = MonitorDir, as_json: bool = JsonOpt):
    """Whether Prometheus runs, its URL and the health of every scrape target."""
    with _guard(as_json):
        from testbed.monitor import prometheus as monitor

        st = monitor.status(mdir or monitor.DEFAULT_DIR)
        if as_json:
            _emit(st)
            return
        if not st["running"]:
            out.print(f"monitor not running ({st['dir']}); `testbed monitor up` starts it", highlight=False, markup=False)
            raise typer.Exit(1)
        out.print(f"Prometheus {st['prometheus_url']}", highlight=False, markup=False)
        if st["exporter_url"]:
            out.print(f"runs exporter {st['exporter_url']} ({'running' if st['exporter_running'] else 'NOT running'})",
                      highlight=False, markup=False)
        if not st["targets"]:
            out.print("no targets: bring a testbed up, or start a run", highlight=False, markup=False)
        for t in st["targets"]:
            out.print(f"  {t['exporter'] or 'target'} {t['url']}: {t['health']} {escape(t['last_error'])}",
                      highlight=False, markup=False)


def _quiet_exit() -> None:
    """On the way out after a failure or interrupt, a further Ctrl-C must not print a
    traceback from interpreter shutdown."""
    import signal

    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(s, signal.SIG_IGN)
        except ValueError:
            pass


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_host":  # a controller's request over SSH (testbed.engine.hostagent)
        from testbed.engine.hostagent import main as host_main

        sys.exit(host_main(sys.argv[2], sys.argv[3:]))
    try:
        app(standalone_mode=True)
    except _Fail as f:
        _quiet_exit()
        if f.as_json:
            _emit(f.error.to_dict())
        else:
            err.print(f"[red]error:[/] {escape(f.error.message)}", highlight=False)
            if f.error.hint:
                err.print(f"  [yellow]hint:[/] {escape(f.error.hint)}", highlight=False)
        sys.exit(1)
    except KeyboardInterrupt:
        _quiet_exit()
        err.print("[red]interrupted[/]")
        sys.exit(130)


if __name__ == "__main__":
    main()
