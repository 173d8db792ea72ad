"""The ``testbed`` command: parse -> call the library -> render. No logic here.

One Typer sub-app or module per command group:

    testbeds   up (--dry-run), validate, down, status, exec
    links      link show | set | replay
    runs       run                    sweeps   sweep (--slurm), _sweep-element (hidden)
    reports    report                 graph    graph (--serve)
    images     image build            monitor  monitor up | down | status
    doctor     doctor, version        host     _host (hidden: a controller's request over SSH)
    params     what parameters share: -t/--testbed NAME|FILE, --json, choices from registries
    workload   the training options of run and sweep (scheme flags from workloads.schemes)
    render     output (tables, --json) and exit statuses
    needs      what each command declares: the user's rootless namespaces, Slurm's ended jobs

Exit codes: 0 ok, 1 failure, 2 usage. With --json, stdout carries exactly one JSON
object (errors too: {"error": ..., "hint": ...}); progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal
import sys
from collections.abc import Sequence
from typing import Optional

import typer

from testbed.cli import doctor, graph, host, images, links, monitor, needs, reports, runs, selftest, sweeps, \
    testbeds
from testbed.cli.params import Group
from testbed.cli.render import ClickException, Fail, failure, interrupted, out, refusal
from testbed.common import rootless
from testbed.common.errors import TestbedError
from testbed.common.state import check_root
from testbed.common.version import __version__
from testbed.common.writes import disk_error, is_disk_error
from testbed.plan.ledger import Ledger

__all__ = ["app", "main"]

app = typer.Typer(cls=Group, add_completion=True, no_args_is_help=True, rich_markup_mode=None,
                  help="Emulated networks for distributed training: namespaces, bridges, shaped links.")


def _print_version(value: bool) -> None:
    if value:
        out.print(__version__)
        raise typer.Exit()


@app.callback()
def _root(version: Optional[bool] = typer.Option(None, "--version", is_eager=True, callback=_print_version,
                                                 help="Print the version and exit.")):
    """Emulated networks for distributed training: namespaces, bridges, shaped links."""


testbeds.register(app)
runs.register(app)
sweeps.register(app)
reports.register(app)
graph.register(app)
doctor.register(app)
selftest.register(app)
host.register(app)
app.add_typer(links.app, name="link")
app.add_typer(monitor.app, name="monitor")
needs.namespaces("link")  # each of their subcommands works on a testbed, or beside the user's
needs.namespaces("monitor")
app.add_typer(images.app, name="image")


def _own(argv: Sequence[str]) -> Sequence[str]:
    """The arguments before ``--`` (what follows is a workload's)."""
    return argv[:list(argv).index("--")] if "--" in argv else argv


def _wants_json(argv: Sequence[str]) -> bool:
    """--json among the testbed's own arguments (not after `--`, which go to a command)."""
    return "--json" in _own(argv)


@functools.lru_cache(maxsize=1)
def _click_app():
    """The click command Typer makes of ``app`` (made once: the parse below and the run share it)."""
    return typer.main.get_command(app)


def _parsed(argv: Sequence[str]) -> needs.Parsed | None:
    """What the command line asks, as click parses it (nothing runs); None for --help or a
    line click will refuse."""
    return needs.parse(_click_app(), argv)


def _testbeds_up() -> bool:
    """Whether a testbed is up in the state directory; False where it cannot be read (none
    can have been made there: :func:`check_root` refuses such a directory first)."""
    try:
        return bool(Ledger.all_names())
    except (OSError, TestbedError):
        return False


def main(argv: Optional[Sequence[str]] = None) -> None:
    try:
        _main(argv)
    except BrokenPipeError:  # whoever read stdout went away (`| head`, a killed parent): no traceback
        _stdout_gone()
    finally:
        if argv is None:  # the command's process, which ends now (not a caller's, in-process)
            # Interpreter shutdown's garbage collections go over every object the imports
            # made: about 100 ms of each command on the 2-core machine (`testbed up`, 8 runs
            # each way: 465 -> 360 ms median, docs/results/cli.md). Frozen, they
            # are skipped; atexit handlers, thread joins and the flush of stdout still run, and
            # testbed closes its files itself (with-blocks, atomic writes), not through the GC.
            gc.freeze()


def _plugins() -> None:
    """Backends, link types and schemes of installed packages registered; one warning line
    per plugin skipped (testbed.engine.plugins)."""
    from testbed.engine import plugins
    from workloads.schemes import PLUGIN_WARNINGS, names

    names()  # the schemes' entry points read (the warnings of those skipped)
    lines = [*plugins.load(), *PLUGIN_WARNINGS]
    if lines:
        from rich.text import Text

        from testbed.cli.render import err

        for line in lines:
            err.print(Text(f"warning: {line}", style="yellow"), highlight=False)


def _stdout_gone() -> None:
    """Exit as a command killed by SIGPIPE would (141), with stdout pointed at /dev/null so
    that the interpreter's last flush does not fail again."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(128 + signal.SIGPIPE)


def _main(argv: Optional[Sequence[str]]) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    host.dispatch(argv)  # `testbed _host OP ...` over SSH: never parsed here
    as_json = _wants_json(argv)
    entered = False
    try:
        parsed = _parsed(argv)  # what the command declares (testbed.cli.needs), from click's parse
        if rootless.needed() and parsed is not None and parsed.prunes:
            rootless.prune_job_bases(ask_slurm=True)  # the folders of ended jobs (a sweep's elements'), any node
        if rootless.needed() and parsed is not None and parsed.namespaces:
            try:
                rootless.enter()  # before any thread starts; from here on, a child inside them
                entered = True
            except rootless.RootlessError as e:
                if parsed.command not in needs.STATELESS:
                    raise
                rootless.enter_failure = e  # doctor says why, among the rest
        _plugins()  # after entering: a plugin's import may start a thread, and setns needs one
        if parsed is not None and parsed.state:
            check_root()  # one line with a hint, before anything is made
        code = _click_app().main(args=argv, prog_name="testbed", standalone_mode=False)
    except Fail as f:
        code = failure(f.error, f.as_json)
    except TestbedError as e:  # entering the rootless namespaces failed
        code = failure(e, as_json)
    except ClickException as e:
        code = refusal(e, as_json)
    except KeyboardInterrupt:
        code = interrupted()
    except OSError as e:
        if not is_disk_error(e):
            raise
        code = failure(disk_error(e), as_json)  # a full disk where no writer expected it
    finally:
        if entered:
            rootless.release(busy=_testbeds_up())
    sys.exit(interrupted() if code == 130 else code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
