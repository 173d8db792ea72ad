"""``testbed link show|set|replay``: a running testbed's links, their shapes and counters."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from testbed.cli.params import DIRECTIONS, TRACE_FORMATS, Group, JsonOpt, TestbedOpt, choice, running
from testbed.cli.render import emit, guard, lit, out, plain, shape_str
from testbed.common.errors import TestbedError

app = typer.Typer(cls=Group, no_args_is_help=True, rich_markup_mode=None,
                  help="Show or change the links of a running testbed.")


DirectionOpt = choice("both", "--direction", choices=DIRECTIONS, help="forward (a->b), reverse (b->a) or both.")


@app.command("show")
def link_show(testbed: Optional[str] = TestbedOpt, as_json: bool = JsonOpt):
    """List links with their shape and live counters per direction."""
    with guard(as_json):
        from testbed.engine.core import Testbed

        tb = Testbed.attach(running(testbed))
        rows = tb.link_stats()
        if as_json:
            emit({"testbed": tb.name, "links": rows})
            return
        t = Table("link", "dir", "shape", "bytes", "packets", "drops", "overlimits", "backlog",
                  title=f"testbed {tb.name}: links", title_justify="left")
        for l in rows:
            for d in ("forward", "reverse"):
                x = l[d]
                c = x["counters"]
                t.add_row(*lit(l["name"] + (" *" if l["bottleneck"] else "") if d == "forward" else "",
                               f"{x['src']}->{x['dst']}", shape_str(x["shape"]), f"{c.get('bytes', 0):,}",
                               f"{c.get('packets', 0):,}", str(c.get("drops", 0)), str(c.get("overlimits", 0)),
                               f"{c.get('backlog_bytes', 0)}B"))
        out.print(t)
        out.print("* bottleneck link")


@app.command("set")
def link_set(
    link: Optional[str] = typer.Argument(None, metavar="[LINK]", help="Link name (e.g. s1-s0, or its 'name:'), "
                                         "or its index."),
    bottleneck: bool = typer.Option(False, "--bottleneck", help="Change every link marked bottleneck."),
    bw: Optional[str] = typer.Option(None, "--bw", metavar="RATE", help="Rate, e.g. 100mbit, 1gbit."),
    delay: Optional[str] = typer.Option(None, "--delay", metavar="TIME", help="One-way delay, e.g. 10ms (needs netem)."),
    jitter: Optional[str] = typer.Option(None, "--jitter", metavar="TIME", help="Delay variation, e.g. 1ms (needs "
                                         "netem)."),
    loss: Optional[str] = typer.Option(None, "--loss", metavar="PERCENT", help="Packet loss, e.g. 0.1% (needs netem)."),
    limit: Optional[int] = typer.Option(None, "--limit", metavar="PACKETS", help="Queue limit in packets "
                                        "(1..10000000)."),
    direction: str = DirectionOpt,
    testbed: Optional[str] = TestbedOpt,
    as_json: bool = JsonOpt,
):
    """Change a running link's shape in place (flows keep running)."""
    with guard(as_json):
        from testbed.engine.core import Testbed
        from testbed.model.topology import parse_shape_values

        if link is not None and bottleneck:
            raise TestbedError("give a link or --bottleneck, not both")
        changes = parse_shape_values(dict(rate=bw, delay=delay, jitter=jitter, loss=loss, limit=limit),
                                     {"rate": "--bw", "delay": "--delay", "jitter": "--jitter", "loss": "--loss",
                                      "limit": "--limit"})
        tb = Testbed.attach(running(testbed))
        links = tb.set_links(tb.find_links(link, bottleneck=bottleneck), direction=direction, **changes)
        if as_json:
            emit({"testbed": tb.name, "changed": [{"name": l.name, "forward": l.forward.to_dict(),
                                                   "reverse": l.reverse.to_dict()} for l in links]})
            return
        for l in links:
            plain(f"{l.name}: {l.a}->{l.b} {l.forward.describe()}, {l.b}->{l.a} {l.reverse.describe()}")


@app.command("replay")
def link_replay(
    args: Optional[List[str]] = typer.Argument(None, metavar="[LINK] TRACE", help="The link (or --bottleneck) "
                                               "and the trace file."),
    bottleneck: bool = typer.Option(False, "--bottleneck", help="Drive every link marked bottleneck."),
    fmt: str = choice("auto", "--format", choices=TRACE_FORMATS, help="csv (time_s,rate[,delay[,loss]]), "
                      "mahimahi, or auto (mahimahi when every line is an integer)."),
    window: float = typer.Option(1.0, "--window", metavar="SECONDS", help="mahimahi: seconds per rate step."),
    loop: bool = typer.Option(False, "--loop", help="csv: repeat (the last line, equal to the first, marks the "
                              "period)."),
    duration: Optional[float] = typer.Option(None, "--duration", metavar="SECONDS",
                                             help="Stop after this many seconds."),
    direction: str = DirectionOpt,
    restore: bool = typer.Option(False, "--restore", help="Put the shapes from before back at the end."),
    log: Optional[Path] = typer.Option(None, "--log", metavar="FILE", help="Append each applied step as a JSON "
                                       "line here."),
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
    with guard(as_json):
        from testbed.engine import replay as rp
        from testbed.engine.core import Testbed
        from testbed.model.trace import load_trace

        if stop:
            rp.check_stop(args or [], bottleneck=bottleneck, background=background)
            return _stop(running(testbed), as_json)
        target = rp.parse_target(args or [], bottleneck=bottleneck, from_topology=from_topology)
        rp.check_options(duration_s=duration, while_pid=while_pid)
        trace = load_trace(target.trace_file, fmt, window, loop) if target.trace_file is not None else None
        tb = Testbed.attach(running(testbed))
        links = tb.find_links(target.link, bottleneck=bottleneck)
        trace = trace or rp.schedule_of(links[0])
        source = trace.source or str(target.trace_file)
        if background:
            rp.check(links, trace, direction)  # refused here, not in a process nobody watches
            bg = rp.start_background(tb.name, target.trace_file, link=target.link, fmt=fmt, window_s=window,
                                     loop=loop, duration_s=duration, direction=direction, restore=restore, log=log)
            return _started(tb.name, links, source, bg, as_json)
        if trace.loop and duration is None and as_json:
            raise TestbedError("a looping trace with --json needs --duration (the JSON comes at the end)")
        stopped = None if while_pid is None else (lambda: not Path(f"/proc/{while_pid}").exists())
        _foreground(tb, links, trace, source, as_json, direction=direction, duration_s=duration, restore=restore,
                    log=log, stop=stopped, start_when=None if start_on is None else start_on.exists)


def _stop(name: str, as_json: bool) -> None:
    from testbed.engine.replay import stop_background

    pids = stop_background(name)
    if as_json:
        emit({"testbed": name, "stopped": pids})
    else:
        plain(f"stopped {len(pids)} background replay(s) of {name}"
              + ("; each put the shapes from before back" if pids else ""))


def _started(name: str, links, source: str, bg, as_json: bool) -> None:
    if as_json:
        emit({"testbed": name, "links": [l.name for l in links], "trace": source, "pid": bg.proc.pid,
              "log": str(bg.log), "output": str(bg.output)})
    else:
        plain(f"replaying {source} on {', '.join(l.name for l in links)} in the background (pid {bg.proc.pid}); "
              f"steps are logged to {bg.log}; `testbed link replay --stop` or `testbed down` ends it")


def _foreground(tb, links, trace, source: str, as_json: bool, *, log: Optional[Path], **kw) -> None:
    """Replay in this process, a line per step (or the JSON at the end)."""
    from testbed.engine.replay import open_log, replay

    names = ", ".join(l.name for l in links)

    def show(rec):
        if not as_json:
            plain(f"{rec['at_s']:9.3f} s  {names}: {rec['rate']}"
                  + "".join(f" {k} {rec[k]}" for k in ("delay", "loss") if k in rec)
                  + f"  (in force {rec['late_s'] * 1000:.1f} ms after its time)")

    logf = open_log(log)
    try:
        res = replay(tb, links, trace, log=logf, on_step=show, **kw)
    except KeyboardInterrupt:
        raise TestbedError(f"interrupted: the shapes from before were put back on {names}") from None
    finally:
        if logf:
            logf.close()
    if as_json:
        emit({"testbed": tb.name, "links": [l.name for l in links], "trace": source, "period_s": trace.period_s,
              **res.to_dict()})
        return
    late = res.lateness()
    plain(f"{late['steps']} steps applied" + (f"; in force after their time: median {late['median_s'] * 1000:.1f} "
          f"ms, p95 {late['p95_s'] * 1000:.1f} ms, max {late['max_s'] * 1000:.1f} ms" if late["steps"] else "")
          + ("; shapes from before restored" if res.restored else ""))
