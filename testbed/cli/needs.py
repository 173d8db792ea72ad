"""What each command declares about an ordinary user's rootless namespaces
(:mod:`testbed.common.rootless`): whether it works inside them (a testbed's kernel objects
and state are there), and whether it first removes the folders ended Slurm jobs left.

A command module declares it where it registers the command (``namespaces("up")``, or a
predicate of the command's parsed parameters: ``graph`` of a FILE needs nothing). The
decision is made from click's own parse of the command line (:func:`parse`: nothing runs,
no default is filled in), before the command starts any thread: entering the namespaces
forks, and the rest of the program runs in the child.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

Need = Union[bool, Callable[[dict[str, Any]], bool]]

_NAMESPACES: dict[str, Need] = {}
_PRUNES: dict[str, Need] = {}
STATELESS = frozenset({"doctor"})
"""Commands that enter the namespaces but use no state directory (doctor reports on a
machine whatever its state directory; it also says why the namespaces could not be entered)."""


def namespaces(command: str, need: Need = True) -> None:
    """``command`` (a top-level name: ``up``, ``link``) works in the user's namespaces."""
    _NAMESPACES[command] = need


def prunes(command: str, need: Need = True) -> None:
    """``command`` first removes the ``host-NODE-jobID`` folders ended Slurm jobs left."""
    _PRUNES[command] = need


@dataclass(frozen=True)
class Parsed:
    command: str
    """The top-level command (``link`` for ``link set``)."""
    params: dict[str, Any]
    """The leaf command's parameters as given (None where not given: no default is filled in)."""

    def _asks(self, table: dict[str, Need]) -> bool:
        need = table.get(self.command, False)
        return bool(need(self.params)) if callable(need) else need

    @property
    def namespaces(self) -> bool:
        return self._asks(_NAMESPACES)

    @property
    def state(self) -> bool:
        """Works in the namespaces with their state directory."""
        return self.namespaces and self.command not in STATELESS

    @property
    def prunes(self) -> bool:
        return self._asks(_PRUNES)


def parse(group: Any, argv: Sequence[str]) -> Parsed | None:
    """``argv`` as click parses it for the app ``group`` (a click group), without running a
    callback; None for ``--help``, or a line click will refuse when it runs."""
    if not argv or argv[0].startswith("-") or {"--help", "-h"} & set(
            argv[:list(argv).index("--")] if "--" in argv else argv):
        return None  # the app's own options (--version, completion: eager, they act when parsed), help
    try:
        ctx = group.make_context("testbed", list(argv), resilient_parsing=True)
        rest = _rest(ctx)
        if not rest:
            return None
        top, cmd, rest = group.resolve_command(ctx, rest)
        while hasattr(cmd, "resolve_command"):  # a group (link, monitor): its subcommand
            ctx = cmd.make_context(top, rest, parent=ctx, resilient_parsing=True)
            rest = _rest(ctx)
            if not rest:
                return Parsed(str(top), {})
            _name, cmd, rest = cmd.resolve_command(ctx, rest)
        leaf = cmd.make_context(top, rest, parent=ctx, resilient_parsing=True)
        return Parsed(str(top), dict(leaf.params))
    except Exception:  # click's usage errors, a value its type refuses: click says so when it runs
        return None


def _rest(ctx: Any) -> list[str]:
    """What a group's context left for its subcommand (click 8.2 keeps the name apart, as
    ``_protected_args``; earlier ones as ``protected_args``)."""
    first = getattr(ctx, "_protected_args", None)
    if first is None:
        first = getattr(ctx, "protected_args", [])
    return [*first, *ctx.args]
