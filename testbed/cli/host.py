"""``testbed _host OP ARGS...``: what a controller asks of this host over SSH (hidden).

The argument vector is handed to :func:`testbed.engine.hostagent.main` exactly as it
came (``exec NAME NODE [OPTIONS] -- ARGV...`` carries a command line of its own, ``--``
and ``--help`` included), so :func:`dispatch` runs before click parses anything; the
hidden command registered here only answers a request that names no operation.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import typer

from testbed.common import rootless
from testbed.hosts import agentns


def dispatch(argv: Sequence[str]) -> None:
    """``argv`` (without the program name) a host request: answer it and exit with its status.
    An ordinary user's request is answered in their rootless namespaces on this host
    (:mod:`testbed.hosts.agentns`)."""
    if len(argv) > 1 and argv[0] == "_host":
        from testbed.engine.hostagent import main as host_main

        try:
            entered = agentns.enter()
        except rootless.RootlessError as e:
            sys.stdout.write(json.dumps(e.to_dict()) + "\n")
            sys.exit(1)
        try:
            code = host_main(argv[1], list(argv[2:]))
        finally:
            agentns.leave(entered)
        sys.exit(code)


def register(app: typer.Typer) -> None:
    app.command("_host", hidden=True, add_help_option=False)(host)


def host(op: str = typer.Argument(..., metavar="OP")):
    """Answer a controller's request over SSH (testbed.engine.hostagent)."""
    dispatch(["_host", op])
