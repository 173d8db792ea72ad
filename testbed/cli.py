"""The `testbed` command: parse -> call the library -> render. No logic here.

Exit codes: 0 ok, 1 failure, 2 usage. With --json, stdout carries exactly one JSON
object (errors too: {"error": ..., "hint": ...}); progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__
from .errors import TestbedError

out = Console()
err = Console(stderr=True, soft_wrap=True)

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Emulated networks for distributed training: namespaces, bridges, shaped links.")
link_app = typer.Typer(no_args_is_help=True, help="Show or change the links of a running testbed.")
app.add_typer(link_app, name="link")

JsonOpt = typer.Option(False, "--json", help="Print one JSON object on stdout and nothing else.")
TestbedOpt = typer.Option(None, "--testbed", "-t", help="Testbed name (default: the only one that is up).")


class _Fail(Exception):
    def __init__(self, error: TestbedError, as_json: bool):
        self.error, self.as_json = error, as_json


def _emit(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=1, default=str) + "\n")


def _resolve_name(name: Optional[str]) -> str:
    from .core import list_testbeds

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
    as_json: bool = JsonOpt,
):
    """Build the emulated network described by FILE."""
    with _guard(as_json):
        from .topology import load_topology

        topo = load_topology(file)
        if dry_run:
            from .core import host_routes
            from .plan import action_to_dict, choose_subnet, make_plan

            try:
                routes = host_routes()
            except Exception:
                routes = []
            plan = make_plan(topo, choose_subnet(topo, routes))
            if as_json:
                _emit({"name": topo.name, "subnet": str(plan.subnet),
                       "actions": [action_to_dict(a) for a in plan.actions]})
            else:
                out.print(f"plan for [bold]{topo.name}[/]: {len(plan.actions)} actions, subnet {plan.subnet}")
                for i, a in enumerate(plan.actions):
                    out.print(f"{i:5d}  {a.describe()}", highlight=False, markup=False)
            return
        from .core import Testbed

        with Progress(TextColumn("[bold]up {task.fields[name]}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("{task.description}"), console=err,
                      transient=True, disable=as_json or not err.is_terminal) as prog:
            task = prog.add_task("", total=None, name=topo.name)

            def step(done: int, total: int, what: str) -> None:
                prog.update(task, completed=done, total=total, description=what[:60])

            tb = Testbed.up(topo, progress=step)
        if as_json:
            _emit(tb.to_dict())
        else:
            _render_testbed(tb.to_dict())
            out.print(f"[green]testbed {tb.name} is up[/]: `testbed exec {tb.workers[0].name} -- CMD`, "
                      f"`testbed link show`, `testbed down {tb.name}`")


# --------------------------------------------------------------------------- down


@app.command()
def down(
    name: Optional[str] = typer.Argument(None, help="Testbed name (default: the only one that is up)."),
    all_: bool = typer.Option(False, "--all", help="Remove every testbed, and any namespace tagged as testbed's."),
    as_json: bool = JsonOpt,
):
    """Remove a testbed: every namespace, link, bridge, qdisc and process it created."""
    with _guard(as_json):
        from .core import down as _down
        from .core import down_all

        if all_:
            removed = down_all()
        else:
            if name is None:
                name = _resolve_name(None)
            removed = [name] if _down(name) else []
        if as_json:
            _emit({"removed": removed})
        elif removed:
            out.print(f"removed: {', '.join(removed)}")
        else:
            out.print(f"nothing to remove{f' (testbed {name} is not up)' if name else ''}")


# --------------------------------------------------------------------------- status


@app.command()
def status(
    name: Optional[str] = typer.Argument(None, help="Testbed name; without it, list all testbeds."),
    as_json: bool = JsonOpt,
):
    """Show running testbeds, or one testbed's nodes (kernel names, addresses) and links."""
    with _guard(as_json):
        from .core import Testbed, list_testbeds

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
                t.add_row(x["name"], "up" if x["ready"] else "[red]incomplete (run down)[/]", str(x["workers"]),
                          str(x["links"]), x["source"] or "")
            out.print(t)
            return
        tb = Testbed.attach(name)
        if as_json:
            _emit(tb.to_dict())
        else:
            _render_testbed(tb.to_dict())


def _render_testbed(d: dict) -> None:
    nodes = Table("node", "kind", "rank", "backend", "netns", "interface", "address", title=f"testbed {d['name']}: nodes",
                  title_justify="left")
    for n in d["nodes"]:
        nodes.add_row(n["name"], n["kind"], "" if n["rank"] is None else str(n["rank"]), n["backend"] or "",
                      n["netns"], n["iface"] or "", f"{n['address']}/{d['subnet'].split('/')[1]}" if n["address"] else "")
    out.print(nodes)
    links = Table("link", "endpoints", "bottleneck", "forward (a->b)", "reverse (b->a)", "interfaces",
                  title="links", title_justify="left")
    for l in d["links"]:
        links.add_row(l["name"], f"{l['a']} - {l['b']}", "yes" if l["bottleneck"] else "",
                      _shape_str(l["forward"]["shape"]), _shape_str(l["reverse"]["shape"]),
                      f"{l['forward']['ifname']} / {l['reverse']['ifname']}")
    out.print(links)


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
        from .core import Testbed

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
                t.add_row(l["name"] + (" *" if l["bottleneck"] else "") if d == "forward" else "",
                          f"{x['src']}->{x['dst']}", _shape_str(x["shape"]), f"{c.get('bytes', 0):,}",
                          f"{c.get('packets', 0):,}", str(c.get("drops", 0)), str(c.get("overlimits", 0)),
                          f"{c.get('backlog_bytes', 0)}B")
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
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Queue limit in packets."),
    direction: str = typer.Option("both", "--direction", help="both, forward (a->b) or reverse (b->a)."),
    testbed: Optional[str] = TestbedOpt,
    as_json: bool = JsonOpt,
):
    """Change a running link's shape in place (flows keep running)."""
    with _guard(as_json):
        from .core import Testbed
        from .units import Duration, Loss, Rate, UnitError

        if link is not None and bottleneck:
            raise TestbedError("give a link or --bottleneck, not both")

        def parse(opt: str, value: Optional[str], parser):
            if value is None:
                return None
            try:
                return parser(value)
            except UnitError as e:
                raise TestbedError(f"{opt}: {e}") from None

        changes = dict(rate=parse("--bw", bw, Rate.parse), delay=parse("--delay", delay, Duration.parse),
                       jitter=parse("--jitter", jitter, Duration.parse), loss=parse("--loss", loss, Loss.parse),
                       limit=limit)
        tb = Testbed.attach(_resolve_name(testbed))
        links = tb.set_links(tb.find_links(link, bottleneck=bottleneck), direction=direction, **changes)
        if as_json:
            _emit({"testbed": tb.name, "changed": [{"name": l.name, "forward": l.forward.to_dict(),
                                                    "reverse": l.reverse.to_dict()} for l in links]})
        else:
            for l in links:
                out.print(f"{l.name}: {l.a}->{l.b} {l.forward.describe()}, {l.b}->{l.a} {l.reverse.describe()}")


# --------------------------------------------------------------------------- exec


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec(
    node: str = typer.Argument(..., help="Node name (a worker; a switch runs in the switches' namespace)."),
    cmd: List[str] = typer.Argument(..., help="Command and arguments, after '--'."),
    testbed: Optional[str] = TestbedOpt,
):
    """Run a command inside a node: `testbed exec w0 -- ping -c1 10.200.0.2`."""
    with _guard(False):
        from .core import Testbed

        tb = Testbed.attach(_resolve_name(testbed))
        info = tb.node(node)
        out.file.flush()
        if threading.active_count() == 1:
            from .net import netns

            netns.enter(info.netns)
            try:
                os.execvp(cmd[0], cmd)
            except FileNotFoundError:
                raise TestbedError(f"command not found: {cmd[0]}", "is it installed on this host?") from None
        argv = tb.command(node, cmd)
        os.execv(argv[0], argv)


# --------------------------------------------------------------------------- doctor


@app.command()
def doctor(as_json: bool = JsonOpt):
    """Report what this machine can do (kernel features, docker, prometheus, GPUs, NCCL)."""
    from .doctor import as_dicts, run_checks

    checks = run_checks()
    ok = all(c.ok for c in checks if c.required)
    if as_json:
        _emit({"ok": ok, "checks": as_dicts(checks)})
    else:
        t = Table("check", "", "detail", "hint")
        for c in checks:
            mark = "[green]ok[/]" if c.ok else ("[red]MISSING[/]" if c.required else "[yellow]no[/]")
            t.add_row(c.name + (" (required)" if c.required else ""), mark, c.detail, c.hint or "")
        out.print(t)
        out.print("[green]ready to build testbeds[/]" if ok else "[red]required features are missing[/]")
    raise typer.Exit(0 if ok else 1)


@app.command()
def version():
    """Print the version."""
    out.print(__version__)


def main() -> None:
    try:
        app(standalone_mode=True)
    except _Fail as f:
        if f.as_json:
            _emit(f.error.to_dict())
        else:
            err.print(f"[red]error:[/] {f.error.message}", highlight=False)
            if f.error.hint:
                err.print(f"  [yellow]hint:[/] {f.error.hint}", highlight=False)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("[red]interrupted[/]")
        sys.exit(130)


if __name__ == "__main__":
    main()
