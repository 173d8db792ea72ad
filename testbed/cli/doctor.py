"""``testbed doctor`` (what this machine can do) and ``testbed version``."""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from testbed.cli import needs
from testbed.cli.params import JsonOpt
from testbed.cli.render import emit, lit, out
from testbed.common.version import __version__


def register(app: typer.Typer) -> None:
    app.command()(doctor)
    needs.namespaces("doctor")
    app.command()(version)


def doctor(as_json: bool = JsonOpt):
    """Report what this machine can do (kernel features, docker, prometheus, GPUs, NCCL), naming
    the machine (and its Slurm node: `srun -l -N 2 testbed doctor` checks each node of a job)."""
    from testbed.engine.doctor import as_dicts, describe, run_checks, where

    place = where()  # a Slurm variable that is not Slurm's is refused before the checks take their time
    checks = run_checks()
    ok = all(c.ok for c in checks if c.required)
    if as_json:
        emit({"ok": ok, **place, "checks": as_dicts(checks)})
    else:
        out.print(Text(f"testbed doctor on {describe(place)}"))  # a hostname is text, never markup
        t = Table("check", "", "detail", "hint")
        for c in checks:
            mark = "[green]ok[/]" if c.ok else ("[red]MISSING[/]" if c.required else "[yellow]no[/]")
            t.add_row(*lit(c.name + (" (required)" if c.required else ""), Text.from_markup(mark), c.detail,
                           c.hint or ""))
        out.print(t)
        verdict = "[green]ready to build testbeds[/]" if ok else "[red]required features are missing[/]"
        out.print(Text(f"{describe(place)}: ") + Text.from_markup(verdict))
    raise typer.Exit(0 if ok else 1)


def version():
    """Print the version (also `testbed --version`)."""
    out.print(__version__)
