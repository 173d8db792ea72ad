"""Testbeds: ``up`` (and ``--dry-run``), ``validate``, ``down``, ``status``, ``exec``."""

from __future__ import annotations

import os
from typing import List, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from testbed.cli import needs
from testbed.cli.params import JsonOpt, NamedTestbedOpt, TestbedOpt, complete_testbed, one_testbed, running
from testbed.cli.render import emit, err, guard, lit, out, plain, sayer, shape_str, usage

ExporterOpt = typer.Option(True, "--exporter/--no-exporter",
                           help="Start the testbed's Prometheus exporter on the host (announced to "
                                "`testbed monitor` through file-based discovery; stopped by `down`).")
ExporterListenOpt = typer.Option("127.0.0.1:0", "--exporter-listen", metavar="HOST:PORT",
                                 help="Where the exporter listens (port 0: any free port; loopback by default).")
HostsOpt = typer.Option(None, "--hosts", metavar="slurm",
                        help="slurm: the topology's hosts are the nodes of the Slurm job this runs in (salloc / "
                             "sbatch), in SLURM_JOB_NODELIST's order, reached through srun (docs/slurm.md).")
TopologyArg = typer.Argument(None, metavar="FILE", show_default=False,
                             help="Topology YAML file (e.g. topologies/three_switch.yaml), or a shipped "
                                  "topology's name (three_switch); -t FILE says the same.")


def register(app: typer.Typer) -> None:
    for fn in (up, validate, down, status):
        app.command()(fn)
    app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(exec_)
    for name in ("up", "validate", "down", "status", "exec"):
        needs.namespaces(name)  # validate loads the topology there, as up does (a link's type depends on it)
    needs.prunes("down")


def _topology(file: Optional[str], testbed: Optional[str], hosts: Optional[str] = None):
    """The topology of ``up FILE`` / ``up -t FILE`` (one of them); ``--hosts slurm``: its
    hosts made the nodes of this Slurm job."""
    from testbed.model.topology import load_topology, load_topology_dict, read_topology_file

    given = [v for v in (file, testbed) if v is not None]
    if len(given) != 1:
        raise usage("give the topology once: FILE, or -t FILE")
    if hosts is None:
        return load_topology(given[0])
    data, source = read_topology_file(given[0])
    return load_topology_dict(_host_source(hosts).assign_hosts(data), source=source)


def _host_source(hosts: str):
    from testbed.hosts import sources

    found = sources.source(hosts)
    if found is None:
        raise usage(f"--hosts takes {' or '.join(sources.names())} (docs/slurm.md), not {hosts!r}")
    return found


def up(
    file: Optional[str] = TopologyArg,
    testbed: Optional[str] = typer.Option(None, "--testbed", "-t", metavar="FILE", help="The same as FILE."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Make every check `up` makes (root, netem when asked "
                                 "for, names free, subnet clear of the host's routes, backends ready), print the "
                                 "plan; create nothing."),
    exporter: bool = ExporterOpt,
    exporter_listen: str = ExporterListenOpt,
    hosts: Optional[str] = HostsOpt,
    as_json: bool = JsonOpt,
):
    """Build the emulated network described by FILE (and start its link exporter)."""
    with guard(as_json):
        topo = _topology(file, testbed, hosts)
        if dry_run:
            _print_plan(_preflight(topo, exporter_listen if exporter else None), as_json)
            return
        tb = _build(topo, exporter_listen if exporter else None, as_json)
        if hosts is not None:
            _host_source(hosts).after_up(tb.name, topo)
        if as_json:
            emit(tb.to_dict())
            return
        render_testbed(tb.to_dict())
        out.print(f"[green]testbed {escape(tb.name)} is up[/]: `testbed exec {escape(tb.workers[0].name)} -- CMD`, "
                  f"`testbed link show`, `testbed down {escape(tb.name)}`")
        if tb.to_dict()["exporter"]:
            out.print("(`testbed monitor up` starts a Prometheus that scrapes the link metrics)")


def validate(
    file: Optional[str] = TopologyArg,
    testbed: Optional[str] = typer.Option(None, "--testbed", "-t", metavar="FILE", help="The same as FILE."),
    exporter: bool = ExporterOpt,
    exporter_listen: str = ExporterListenOpt,
    hosts: Optional[str] = HostsOpt,
    as_json: bool = JsonOpt,
):
    """Check FILE, and this host, as `testbed up FILE` would before building anything."""
    with guard(as_json):
        topo = _topology(file, testbed, hosts)
        plan = _preflight(topo, exporter_listen if exporter else None)
        if as_json:
            emit({"name": topo.name, "valid": True, "subnet": str(plan.subnet), "hosts": plan.hosts,
                  "actions": len(plan.actions)})
        else:
            plain(f"{topo.source}: testbed {topo.name} can be built here ({len(topo.workers)} workers, "
                  f"{len(topo.links)} links, {len(plan.actions)} actions, subnet {plan.subnet})")


def _preflight(topo, exporter: Optional[str]):
    """What `up` checks before it builds anything (the library's own checks); the plan."""
    from testbed.engine.core import Testbed

    return Testbed.preflight(topo, exporter)


def _print_plan(plan, as_json: bool) -> None:
    topo = plan.topology
    where = plan.placement or ["local"] * len(plan.actions)
    if as_json:
        emit({"name": topo.name, "subnet": str(plan.subnet), "hosts": plan.hosts,
              "actions": [{**a.to_dict(), "host": h} for a, h in zip(plan.actions, where)]})
        return
    out.print(f"plan for [bold]{escape(topo.name)}[/]: {len(plan.actions)} actions, subnet {plan.subnet}")
    for i, (a, h) in enumerate(zip(plan.actions, where)):
        plain(f"{i:5d}  {f'{h}: ' if topo.multi_host else ''}{a.describe()}")


def _build(topo, exporter: Optional[str], as_json: bool):
    from testbed.engine.core import Testbed

    with Progress(TextColumn("[bold]up {task.fields[name]}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.description}"), console=err,
                  transient=True, disable=as_json or not err.is_terminal) as prog:
        task = prog.add_task("", total=None, name=topo.name)

        def step(done: int, total: int, what: str) -> None:
            prog.update(task, completed=done, total=total, description=what[:60])

        return Testbed.up(topo, progress=step, exporter=exporter)


def down(
    name: Optional[str] = typer.Argument(None, metavar="[NAME]", autocompletion=complete_testbed,
                                         help="Testbed name or topology FILE; -t says the same (default: the only "
                                              "one that is up)."),
    testbed: Optional[str] = TestbedOpt,
    all_: bool = typer.Option(False, "--all", help="Remove every testbed of this state directory, and what its "
                              "lost ledgers left (tagged namespaces, labelled containers)."),
    as_json: bool = JsonOpt,
):
    """Remove a testbed: every namespace, link, bridge, qdisc and process it created."""
    with guard(as_json):
        from testbed.engine.teardown import down as take_down  # (not engine.core: no netlink imported for this)
        from testbed.engine.teardown import down_all

        name = one_testbed(name, testbed)
        if all_:
            if name is not None:
                raise usage("--all removes every testbed: give no NAME with it")
            removed = down_all()
        else:
            name = running(name)
            removed = [name] if take_down(name, sayer(as_json)) else []
        if as_json:
            emit({"removed": removed})
        elif removed:
            plain(f"removed: {', '.join(removed)}")
        else:
            plain(f"nothing to remove{f' (testbed {name} is not up)' if name else ''}")


def status(
    name: Optional[str] = typer.Argument(None, metavar="[NAME]", autocompletion=complete_testbed,
                                         help="Testbed name or topology FILE; -t says the same. Without it, list "
                                              "all testbeds."),
    testbed: Optional[str] = NamedTestbedOpt,
    as_json: bool = JsonOpt,
):
    """Show running testbeds, or one testbed's nodes (kernel names, addresses) and links."""
    with guard(as_json):
        from testbed.engine.teardown import list_testbeds

        name = one_testbed(name, testbed)
        if name is not None:
            from testbed.engine.core import Testbed

            d = Testbed.attach(name).to_dict()
            emit(d) if as_json else render_testbed(d)
            return
        tbs = list_testbeds()
        if as_json:
            emit({"testbeds": tbs})
        elif not tbs:
            out.print("no testbed is up")
        else:
            t = Table("name", "state", "workers", "links", "topology file")
            for x in tbs:
                t.add_row(*lit(x["name"], "up" if x["ready"] else Text("incomplete (run down)", style="red"),
                               str(x["workers"]), str(x["links"]), x["source"] or ""))
            out.print(t)


def render_testbed(d: dict) -> None:
    """A testbed's ``to_dict()`` as two tables: nodes, links."""
    hosts = any(n.get("host", "local") != "local" for n in d["nodes"])
    nodes = Table("node", "kind", "rank", "backend", *(("host",) if hosts else ()), "netns", "interface", "address",
                  title=f"testbed {d['name']}: nodes", title_justify="left")
    for n in d["nodes"]:
        nodes.add_row(*lit(n["name"], n["kind"], "" if n["rank"] is None else str(n["rank"]), n["backend"] or "",
                           *((n.get("host", "local"),) if hosts else ()), n["netns"], n["iface"] or "",
                           f"{n['address']}/{d['subnet'].split('/')[1]}" if n["address"] else ""))
    out.print(nodes)
    links = Table("link", "endpoints", "bottleneck", "forward (a->b)", "reverse (b->a)", "interfaces",
                  title="links", title_justify="left")
    for l in d["links"]:
        links.add_row(*lit(l["name"], f"{l['a']} - {l['b']}", "yes" if l["bottleneck"] else "",
                           shape_str(l["forward"]["shape"]), shape_str(l["reverse"]["shape"]),
                           f"{l['forward']['ifname']} / {l['reverse']['ifname']}"))
    out.print(links)
    if d.get("exporter"):
        plain(f"link metrics: {d['exporter']}")


def exec_(
    node: str = typer.Argument(..., metavar="NODE", help="Node name (a worker; a switch runs in the switches' "
                               "namespace)."),
    cmd: List[str] = typer.Argument(..., metavar="-- CMD...", help="Command and arguments, after '--'."),
    testbed: Optional[str] = TestbedOpt,
):
    """Run a command inside a node: `testbed exec w0 -- ping -c1 10.200.0.2`."""
    with guard(False):
        from testbed.engine.core import Testbed

        tb = Testbed.attach(running(testbed))
        argv = tb.command(node, cmd, cwd=None)  # through the node's backend (netns, container)
        out.file.flush()
        os.execv(argv[0], argv)

