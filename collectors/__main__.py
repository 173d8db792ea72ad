"""``python -m collectors``: serve link and training metrics over HTTP for Prometheus."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from . import parse_listen
from .links import LinkCollector
from .training import TrainingCollector


def _listen_arg(value: str) -> tuple[str, int]:
    try:
        return parse_listen(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--listen {value!r}: write HOST:PORT, e.g. 127.0.0.1:9464") from None


def registry(testbeds: list[str] | None, runs: list[Path], keep_s: float) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LinkCollector(testbeds))
    if runs:
        reg.register(TrainingCollector(runs, keep_s))
    return reg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m collectors", description=__doc__)
    p.add_argument("--listen", type=_listen_arg, default=("127.0.0.1", 9464),
                   help="HOST:PORT to serve /metrics on (default 127.0.0.1:9464; loopback only)")
    p.add_argument("--testbed", action="append", help="export only this testbed's links (repeatable)")
    p.add_argument("--runs", type=Path, action="append", default=[],
                   help="run directory or a directory of runs to export (repeatable)")
    p.add_argument("--keep", type=float, default=3600.0, help="seconds a finished run stays exported")
    args = p.parse_args(argv)
    reg = registry(args.testbed, args.runs, args.keep)
    host, port = args.listen
    try:
        server, thread = start_http_server(port, addr=host, registry=reg)
    except OSError as e:
        print(f"error: cannot listen on {host}:{port}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"serving http://{host}:{server.server_port}/metrics", flush=True)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
