"""What the CLI prints, and how an outcome becomes an exit status.

Results go to stdout: Rich tables, or with ``--json`` exactly one JSON object and nothing
else (errors too: ``{"error": ..., "hint": ...}``). Progress and messages go to stderr.

Exit status: 0 ok; 1 failure (a :class:`TestbedError`: its message, and a hint saying how to
fix it); 2 usage (click refused the command line: an unknown option, a missing argument, a
value outside its choices, which the message names); 130 interrupted.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from testbed.common.digits import ascii_int
from testbed.common.errors import TestbedError

if TYPE_CHECKING:  # the click typer>=0.28,<0.29 vendors (pyproject), which the lookup below finds
    from typer._click.exceptions import ClickException as _ClickException
    from typer._click.exceptions import UsageError as _UsageError

PIPED_WIDTH = 200
"""Columns for stdout that is not a terminal (a file, a pipe, ``su -c``): Rich would take 80
and cut a report's table cells to ``pactr…``; COLUMNS still decides where it is set."""


MAX_SIZE_DIGITS = 4
"""COLUMNS and LINES of at most 9999 are taken; a larger or malformed one is left out."""


def _environ() -> dict[str, str]:
    """The environment Rich reads, less a COLUMNS or LINES that is no size: Rich passes what
    ``str.isdigit`` takes to ``int`` (``COLUMNS=²`` failed every command at import), and a
    huge width would pad lines to it; without them it asks the terminal, as where unset."""
    env = dict(os.environ)
    for name in ("COLUMNS", "LINES"):
        if name in env and not ascii_int(env[name], MAX_SIZE_DIGITS):
            del env[name]
    return env


ENVIRON = _environ()


def _width() -> int | None:
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return None if tty or "COLUMNS" in ENVIRON else PIPED_WIDTH


out = Console(emoji=False, width=_width(), _environ=ENVIRON)  # emoji off: ":factory:" in a message stays text
err = Console(stderr=True, soft_wrap=True, emoji=False, _environ=ENVIRON)

_click = typer.BadParameter.__module__.rpartition(".")[0]  # click, or the copy typer vendors
ClickException: type[_ClickException] = importlib.import_module(f"{_click}.exceptions").ClickException
UsageError: type[_UsageError] = importlib.import_module(f"{_click}.exceptions").UsageError
_current_context = importlib.import_module(f"{_click}.globals").get_current_context


def usage(message: str) -> _UsageError:
    """A usage error (exit status 2) raised from inside a command, e.g. two arguments that
    contradict each other: printed with the command's usage line, or as JSON."""
    return UsageError(message, ctx=_current_context(silent=True))


class Fail(Exception):
    """A TestbedError on its way out of a command, with the form it is to be printed in."""

    def __init__(self, error: TestbedError, as_json: bool):
        super().__init__(error.message)
        self.error, self.as_json = error, as_json


@contextlib.contextmanager
def guard(as_json: bool) -> Iterator[None]:
    """Inside a command: a TestbedError ends it with exit status 1 (message and hint, or
    JSON). So do what hostile input can still cause where no check names it: an OSError
    (a path too long, a file where a directory should be), input nested past Python's
    recursion limit, a number past float's range."""
    try:
        yield
    except TestbedError as e:
        raise Fail(e, as_json) from None
    except OSError as e:
        where = f": {e.filename}" if e.filename is not None else ""
        raise Fail(TestbedError(f"{e.strerror or e}{where}", "check the path, and that it is the kind of file "
                                "(or directory) the command expects"), as_json) from None
    except RecursionError:
        raise Fail(TestbedError("an input is nested too deeply to read", "inputs are a few levels of mappings "
                                "and lists"), as_json) from None
    except OverflowError as e:
        raise Fail(TestbedError(f"a number in the input is out of range ({e})", "use a value of a sensible size"),
                   as_json) from None


def emit(obj) -> None:
    """The one JSON object of a ``--json`` command."""
    sys.stdout.write(json.dumps(obj, indent=1, default=str) + "\n")


def plain(text: str) -> None:
    """A line on stdout printed literally (names from topologies are never Rich markup), unwrapped."""
    out.print(text, highlight=False, markup=False, soft_wrap=True)


def say(text: str) -> None:
    """A message on stderr, printed literally."""
    err.print(text, highlight=False, markup=False)


def sayer(as_json: bool) -> Callable[[str], None]:
    """Where the library's progress messages go: stderr; under ``--json`` only its warnings
    (``warning: ...``, e.g. a link exporter that stopped mid-run) still go there, since
    stdout then carries nothing but the JSON."""
    return _warnings_only if as_json else say


def _warnings_only(text: str) -> None:
    if text.startswith("warning:"):
        say(text)


def lit(*cells):
    """Table cells printed literally: a user's link name ``[/x]`` is text, never Rich markup."""
    return tuple(Text(c) if isinstance(c, str) else c for c in cells)


def shape_str(s: dict) -> str:
    """One direction's shape (its ``to_dict()``) in a table cell: ``100mbit delay 10ms±1ms loss 1%``."""
    parts = [s["rate"]]
    if "delay" in s:
        parts.append(f"delay {s['delay']}" + (f"±{s['jitter']}" if "jitter" in s else ""))
    if "loss" in s:
        parts.append(f"loss {s['loss']}")
    if "limit" in s:
        parts.append(f"limit {s['limit']}")
    return " ".join(parts)


# --------------------------------------------------------------------------- the way out


def failure(error: TestbedError, as_json: bool) -> int:
    """Print a failure (exit status 1)."""
    quiet_exit()
    if as_json:
        emit(error.to_dict())
    else:
        err.print(f"[red]error:[/] {escape(error.message)}", highlight=False)
        if error.hint:
            err.print(f"  [yellow]hint:[/] {escape(error.hint)}", highlight=False)
    return 1


def refusal(e: _ClickException, as_json: bool) -> int:
    """Print what click refused (a usage error: exit status 2, or another click error's)."""
    code = getattr(e, "exit_code", 1)
    if not as_json:
        e.show()  # usage line, "Try ... --help", "Error: ..." on stderr
        return code
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else "testbed"
    emit({"error": e.format_message(), "hint": f"see `{where} --help`", "type": "UsageError"})
    return code


def interrupted() -> int:
    quiet_exit()
    err.print("[red]interrupted[/]")
    return 130


def quiet_exit() -> None:
    """On the way out after a failure or interrupt, a further Ctrl-C must not print a
    traceback from interpreter shutdown."""
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(s, signal.SIG_IGN)
        except ValueError:
            pass
