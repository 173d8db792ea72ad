"""``testbed graph``: a testbed (or a topology file) drawn as one HTML page, live with --serve."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from testbed.cli import needs
from testbed.cli.params import JsonOpt, NamedTestbedOpt, running
from testbed.cli.render import emit, guard, plain
from testbed.common.errors import TestbedError


def register(app: typer.Typer) -> None:
    app.command()(graph)
    needs.namespaces("graph", lambda p: p.get("topology") is None or bool(p.get("serve")))  # a running testbed's


def graph(
    topology: Optional[Path] = typer.Argument(None, metavar="[FILE]", help="A topology file to draw (no testbed "
                                              "needed); without it, the running testbed of -t."),
    testbed: Optional[str] = NamedTestbedOpt,
    out_file: Optional[Path] = typer.Option(None, "--out", metavar="FILE", help="Where the page goes (default: "
                                            "NAME.html here)."),
    serve: bool = typer.Option(False, "--serve", help="Serve the page live instead (the running testbed of -t): "
                               "each link's utilisation and the run's iteration and accuracy every second, from "
                               "the testbed's own exporters, on the loopback under a secret URL. Ctrl-C ends it."),
    listen: str = typer.Option("127.0.0.1:0", "--listen", metavar="HOST:PORT", help="Where --serve listens, on "
                               "the loopback (port 0: any free one; [::1]:PORT for IPv6)."),
    as_json: bool = JsonOpt,
):
    """Draw the testbed's nodes and links with each link's shape (rate, delay, loss) as a
    self-contained HTML page (no network needed to open it), as containerlab's graph does."""
    with guard(as_json):
        from testbed.runs import graph as g

        topo, tb = _topology(topology, testbed, serve)  # a loaded topology has workers and their links
        m = g.model(topo)
        if tb is not None and serve:
            _serve(m, topo, tb.to_dict().get("exporter"), listen, as_json)
            return
        target = out_file or Path(f"{topo.name}.html")
        g.write(m, target)
        if as_json:
            emit({"page": str(target), **m})
        else:
            plain(f"{topo.name}: {len(m['nodes'])} nodes, {len(m['links'])} links drawn in {target}")


def _topology(file: Optional[Path], testbed: Optional[str], serve: bool):
    """(the topology to draw, the running testbed it is, or None for a FILE)."""
    from testbed.model.topology import load_topology

    if file is not None and (testbed is not None or serve):
        raise TestbedError("give a topology FILE, or -t for a running testbed, not both",
                           "--serve draws a running testbed: -t NAME")
    if file is not None:
        return load_topology(file), None
    from testbed.engine.core import Testbed

    tb = Testbed.attach(running(testbed))  # the one named, or the only one up
    return tb.topology, tb


def _serve(m: dict, topo, exporter: str | None, listen: str, as_json: bool) -> None:
    from testbed.monitor.sd import parse_listen

    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        raise TestbedError(f"--listen: {e}", "e.g. --listen 127.0.0.1:8765") from None
    if not exporter:
        raise TestbedError(f"testbed {topo.name!r} has no link exporter to read the utilisation from",
                           f"bring it up with --exporter (the default): `testbed down {topo.name}` and up again")
    from testbed.runs import graph_live

    live = graph_live.Live(topo.name, exporter, {l.name: l.index for l in topo.links})
    try:
        server, url = graph_live.serve(m, live, host, port)
    except OSError as e:
        raise TestbedError(f"--listen {listen}: {e.strerror or e}", "another HOST:PORT, or port 0") from None
    if as_json:
        emit({"url": url, "testbed": topo.name})
    else:
        plain(f"the live graph of {topo.name}: {url}  (Ctrl-C ends it)")
    sys.stdout.flush()  # the URL now, to whoever reads a pipe
    live.start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        live.stop()
        server.server_close()
