"""``python -m collectors``: serve link and training metrics over HTTP for Prometheus."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from collectors.listen import listen
from testbed.common.errors import TestbedError
from testbed.monitor.sd import parse_listen, write_target

# The HTTP server (wsgiref, prometheus_client) and the collectors (netlink, the engine: most
# of this process's start) are imported once the address is announced: `testbed up` waits
# for that announcement (its --sd-file), and a scrape that comes before they are ready
# waits in the listening socket's backlog.


def _listen_arg(value: str) -> tuple[str, int]:
    try:
        return parse_listen(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--listen {value!r}: write HOST:PORT, e.g. 127.0.0.1:9464") from None


def registry(testbeds: list[str] | None, runs: list[Path], keep_s: float, all_testbeds: bool = False, reg=None):
    """``reg`` (a new CollectorRegistry if None) with the collectors of what is exported."""
    if reg is None:
        from prometheus_client import CollectorRegistry

        reg = CollectorRegistry(auto_describe=False)
    if testbeds or all_testbeds:
        from .links import LinkCollector

        reg.register(LinkCollector(None if all_testbeds else testbeds))
    if runs:
        from .training import TrainingCollector

        reg.register(TrainingCollector(runs, keep_s))
    return reg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m collectors", description=__doc__)
    p.add_argument("--listen", type=_listen_arg, default=("127.0.0.1", 9464),
                   help="HOST:PORT to serve /metrics on (default 127.0.0.1:9464; loopback only)")
    p.add_argument("--testbed", action="append", help="export this testbed's links (repeatable)")
    p.add_argument("--all-testbeds", action="store_true", help="export the links of every running testbed")
    p.add_argument("--runs", type=Path, action="append", default=[],
                   help="run directory or a directory of runs to export (repeatable)")
    p.add_argument("--keep", type=float, default=3600.0, help="seconds a finished run stays exported")
    p.add_argument("--sd-file", type=Path, help="once listening, announce the address in this Prometheus "
                   "file-SD target file (removed at exit); with --listen HOST:0 the port is the one bound")
    p.add_argument("--token-file", type=Path, help="answer only requests with this file's token "
                   "(Authorization: Bearer TOKEN): an ordinary user's exporter (testbed.monitor.auth)")
    p.add_argument("--sd-label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label for the target file (repeatable)")
    args = p.parse_args(argv)
    labels = {}
    for kv in args.sd_label:
        k, sep, v = kv.partition("=")
        if not sep or not k.isidentifier():
            p.error(f"--sd-label {kv!r}: write KEY=VALUE, e.g. exporter=links")
        labels[k] = v
    if not (args.testbed or args.all_testbeds or args.runs):
        p.error("nothing to export: give --testbed NAME, --all-testbeds or --runs DIR")
    try:  # a netlink handle per namespace stays open between scrapes
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    token = None
    if args.token_file:  # an ordinary user's exporter
        from testbed.monitor.auth import read_token

        try:
            token = read_token(args.token_file)
        except (OSError, TestbedError) as e:
            print(f"error: --token-file {args.token_file}: {getattr(e, 'message', None) or e}", file=sys.stderr)
            return 1
    host, port = args.listen
    try:
        sock = listen(host, port)  # bound: the port is known
    except OSError as e:
        print(f"error: cannot listen on {host}:{port}: {e.strerror}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda *_: stop.set())
    print(f"serving http://{host}:{port}/metrics", flush=True)
    server = None
    try:
        if args.sd_file:
            write_target(args.sd_file, host, port, labels)
        from prometheus_client import CollectorRegistry

        from collectors.serve import serve

        reg = CollectorRegistry(auto_describe=False)
        server, thread = serve(reg, host, port, token, start=False, sock=sock)
        registry(args.testbed, args.runs, args.keep, args.all_testbeds, reg)
        thread.start()
        stop.wait()
    finally:
        if args.sd_file:
            args.sd_file.unlink(missing_ok=True)
        # not shutdown(): that waits out serve_forever's 0.5 s poll; the thread is a daemon
        server.server_close() if server is not None else sock.close()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter shutdown (module teardown, the scrape threads): `down` waits for this
    # process to exit after SIGTERM, and the kernel closes the sockets and netlink handles
    os._exit(code)
