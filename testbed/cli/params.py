"""What the commands' parameters share: one way to name the testbed, ``--json``, choices
read from the library's registries, and help that reads well.

The testbed is named the same way on every command: ``-t/--testbed NAME``, where NAME may
also be a topology FILE (its ``name:`` is used); ``down NAME`` and ``status NAME`` take it
positionally as well. A choice (``--direction``, ``--model``, a scheme ...) is checked when
the command line is parsed, so a bad one exits 2 naming the valid values before anything
is looked at, and shell completion offers them. Its values come from the registry that
defines them, never from a list written here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

from testbed.cli.render import usage
from testbed.common.errors import TestbedError, TopologyError


def complete_testbed(incomplete: str) -> list[str]:
    """The testbeds that are up (shell completion of -t and NAME)."""
    from testbed.engine.teardown import list_testbeds

    return [t["name"] for t in list_testbeds() if t["name"].startswith(incomplete)]


def testbed_option(help: str):
    """``-t/--testbed NAME|FILE``, the same on every command."""
    return typer.Option(None, "--testbed", "-t", metavar="NAME|FILE", autocompletion=complete_testbed, help=help)


JsonOpt = typer.Option(False, "--json", help="Print one JSON object on stdout and nothing else.")
TestbedOpt = testbed_option("The testbed: its name, or the topology FILE it came from (its name: is used). "
                            "Default: the only one that is up.")
NamedTestbedOpt = testbed_option("The same as NAME: a testbed's name, or the topology FILE it came from.")


# --------------------------------------------------------------------------- the testbed


def testbed_name(value: str, where: str = "--testbed") -> str:
    """``-t VALUE``: a testbed's name, or a topology file (then its ``name:``). A value that
    is a valid name is a name, even where a file of that name exists."""
    from testbed.model.topology import NAME_RE, check_testbed_name, load_topology

    if not NAME_RE.fullmatch(value) and Path(value).is_file():
        return load_topology(value).name
    try:
        return check_testbed_name(value, where)
    except TopologyError as e:  # not a name, and no file either
        if NAME_RE.fullmatch(value):
            raise
        raise TestbedError(e.message, f"{e.hint}; or give the path of a topology file") from None


def one_testbed(positional: Optional[str], option: Optional[str]) -> Optional[str]:
    """``down NAME`` or ``down -t NAME``: the name given either way (both: they must agree)."""
    names = {testbed_name(v, where) for v, where in ((positional, "NAME"), (option, "--testbed")) if v is not None}
    if len(names) > 1:
        raise usage(f"the testbed is named twice, differently: {positional!r} and -t {option!r}")
    return names.pop() if names else None


def running(value: Optional[str]) -> str:
    """The testbed a command acts on: the one named, or the only one that is up."""
    if value:
        return testbed_name(value)
    from testbed.engine.teardown import list_testbeds

    up = [t["name"] for t in list_testbeds()]
    if len(up) == 1:
        return up[0]
    if not up:
        raise TestbedError("no testbed is up", "start one with `testbed up topologies/three_switch.yaml`")
    raise TestbedError(f"several testbeds are up ({', '.join(up)})", "choose one with -t NAME")


# --------------------------------------------------------------------------- choices

_LAZY: dict[str, "Choices"] = {}
"""Choices whose registry is read only when used, by metavar: their help lists them then."""


class Choices:
    """One of a registry's names: checked when the command line is parsed (a usage error,
    exit 2, naming them), offered to shell completion, shown in help.

    ``values``: the names, or a function returning them, for a registry that is costly to
    import (the models and datasets import torch): it is read only when the option is
    used, completed, or its help shown; if it cannot be imported the value is let through
    for the library to refuse (it says what to install)."""

    def __init__(self, what: str, values: Sequence[str] | Callable[[], Iterable[str]], metavar: str | None = None):
        self.what = what
        self._values = values
        if callable(values):
            self.metavar = metavar or what.upper()
            _LAZY[self.metavar] = self
        else:
            self.metavar = metavar or f"[{'|'.join(values)}]"

    @property
    def values(self) -> tuple[str, ...] | None:
        if callable(self._values):
            try:
                self._values = tuple(self._values())
            except ImportError:
                return None
        return tuple(self._values)

    def __call__(self, value: str) -> str:
        names = self.values
        if names is not None and value not in names:
            raise typer.BadParameter(f"unknown {self.what} {value!r}; choose one of: {', '.join(names)}")
        return value

    def complete(self, incomplete: str) -> list[str]:
        return [v for v in self.values or () if v.startswith(incomplete)]


def _directions():
    from testbed.engine.replay import DIRECTION_CHOICES

    return DIRECTION_CHOICES


def _trace_formats():
    from testbed.model.trace import TRACE_FORMATS

    return TRACE_FORMATS


DIRECTIONS = Choices("direction", _directions, metavar="DIRECTION")
TRACE_FORMATS = Choices("trace format", _trace_formats, metavar="FORMAT")


def choice(default, *decls: str, choices: Choices, help: str, **kw):
    """An option taking one of ``choices``."""
    return typer.Option(default, *decls, parser=choices, autocompletion=choices.complete, metavar=choices.metavar,
                        help=help, **kw)


# --------------------------------------------------------------------------- schemes


def scheme_variant(spec: str) -> str:
    """A scheme or a variant (``topk:0.1``), checked against workloads.schemes: an unknown
    scheme or parameter is a usage error naming the valid ones."""
    from workloads.schemes import parse_variant

    try:
        parse_variant(spec)[0].check_installed()
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return spec


def scheme_list(value: str) -> str:
    """``--schemes a,b:0.1,...``: each entry a scheme or variant."""
    names = split_list(value)
    if not names:
        raise typer.BadParameter("no scheme given, e.g. --schemes allreduce,fp16,topk,pactrain")
    for name in names:
        scheme_variant(name)
    return value


def scheme_help() -> str:
    from workloads.schemes import VARIANT_HELP, names

    return f"{VARIANT_HELP[0].upper()}{VARIANT_HELP[1:]}. Schemes: {', '.join(names())}."


def complete_scheme(incomplete: str) -> list[str]:
    from workloads.schemes import names

    return [n for n in names() if n.startswith(incomplete)]


def split_list(value: str) -> list[str]:
    """``a, b,,c`` -> [a, b, c]."""
    return [x.strip() for x in value.split(",") if x.strip()]


# --------------------------------------------------------------------------- help


class Group(TyperGroup):
    """A command group whose commands' help reads well: an argument shows its metavar as
    the command spells it (``DIR...``, not ``dirs... <list[Path]>``) and a choice read
    lazily lists its values."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for cmd in [self, *self.commands.values()]:
            for p in getattr(cmd, "params", ()):
                if type(p) is TyperArgument:
                    p.__class__ = _Argument
                elif type(p) is TyperOption:
                    p.__class__ = _Option


class _Argument(TyperArgument):
    def get_help_record(self, ctx):
        record = super().get_help_record(ctx)
        return record if record is None or not self.metavar else (self.metavar, record[1])

    def get_usage_pieces(self, ctx) -> list[str]:
        return [self.metavar] if self.metavar else super().get_usage_pieces(ctx)


class _Option(TyperOption):
    def get_help_record(self, ctx):
        record = super().get_help_record(ctx)
        lazy = _LAZY.get(self.metavar or "")
        if record is None or lazy is None or not lazy.values:
            return record
        return record[0], f"{record[1]}  [one of: {', '.join(lazy.values)}]"
