"""``testbed monitor up|down|status``: a real Prometheus scraping the testbeds' links and the runs."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from testbed.cli.params import Group, JsonOpt
from testbed.cli.render import emit, guard, plain

app = typer.Typer(cls=Group, no_args_is_help=True, rich_markup_mode=None,
                  help="A real Prometheus scraping testbed's links and runs.")

MonitorDir = typer.Option(None, "--dir", metavar="DIR", help="Monitor directory: config, targets, TSDB "
                          "(default $TESTBED_MONITOR_DIR, else /var/lib/testbed/monitor, or ~/.local/state/testbed/monitor for an ordinary user).")


def _dir(mdir: Optional[Path]) -> Path:
    from testbed.monitor import prometheus

    return mdir or prometheus.default_dir()


@app.command("up")
def monitor_up(
    listen: str = typer.Option("127.0.0.1:9090", "--listen", metavar="HOST:PORT",
                               help="Where Prometheus listens (loopback by default)."),
    runs: List[Path] = typer.Option([], "--runs", metavar="DIR", help="Also export the runs under this directory, "
                                    "e.g. runs of plain torchrun (repeatable; `testbed run` exports its own runs)."),
    exporter_listen: str = typer.Option("127.0.0.1:0", "--exporter-listen", metavar="HOST:PORT",
                                        help="Where the --runs exporter listens (port 0: any free port)."),
    scrape_interval: str = typer.Option("2s", "--scrape-interval", metavar="TIME", help="Prometheus scrape interval."),
    retention: str = typer.Option("15d", "--retention", metavar="TIME", help="How long Prometheus keeps samples."),
    mdir: Optional[Path] = MonitorDir,
    as_json: bool = JsonOpt,
):
    """Start Prometheus; it discovers the exporters of every testbed and run by itself."""
    with guard(as_json):
        from testbed.monitor import prometheus

        st = prometheus.up(_dir(mdir), listen, runs, exporter_listen, scrape_interval, retention)
        if as_json:
            emit(st)
            return
        plain(f"Prometheus: {st['prometheus_url']}  (graph: {st['prometheus_url']}/graph)")
        plain(f"targets:    {', '.join(st['targets'])} (testbed up / run announce themselves there)")
        if st["exporter_url"]:
            plain(f"runs:       {st['exporter_url']}")
        plain(f"data:       {st['dir']}/data")
        plain(f"Grafana:    {prometheus.GRAFANA_HINT}")


@app.command("down")
def monitor_down(mdir: Optional[Path] = MonitorDir, as_json: bool = JsonOpt):
    """Stop what `monitor up` started; the metric history stays in the data directory."""
    with guard(as_json):
        from testbed.monitor import prometheus

        stopped = prometheus.down(_dir(mdir))
        if as_json:
            emit({"stopped": stopped})
        else:
            plain("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@app.command("status")
def monitor_status(mdir: Optional[Path] = MonitorDir, as_json: bool = JsonOpt):
    """Whether Prometheus runs, its URL and the health of every scrape target."""
    with guard(as_json):
        from testbed.monitor import prometheus

        st = prometheus.status(_dir(mdir))
        if as_json:
            emit(st)
            return
        if not st["running"]:
            plain(f"monitor not running ({st['dir']}); `testbed monitor up` starts it")
            raise typer.Exit(1)
        plain(f"Prometheus {st['prometheus_url']}")
        if st["exporter_url"]:
            plain(f"runs exporter {st['exporter_url']} ({'running' if st['exporter_running'] else 'NOT running'})")
        if not st["targets"]:
            plain("no targets: bring a testbed up, or start a run")
        for t in st["targets"]:
            plain(f"  {t['exporter'] or 'target'} {t['url']}: {t['health']} {escape(t['last_error'])}")
