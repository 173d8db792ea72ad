"""``testbed selftest``: what this machine does (shaping, live changes, netem, a proven run)."""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from testbed.cli import needs
from testbed.cli.params import JsonOpt
from testbed.cli.render import emit, err, guard, lit, out, plain, sayer

_MARKS = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]", "skip": "[yellow]skip[/]"}


def register(app: typer.Typer) -> None:
    app.command()(selftest)
    needs.namespaces("selftest")


def selftest(
    gpu: bool = typer.Option(False, "--gpu", help="Also run every scheme under NCCL on this machine's GPUs "
                             "(about 8 minutes at most); fails where there is no GPU."),
    as_json: bool = JsonOpt,
):
    """Check what this machine does, in about a minute: TCP goodput against the configured rate
    at 50mbit, 200mbit and 1gbit, a live rate change, netem delay and loss (where the kernel
    has netem), and a 2-rank all-reduce run with its tc-counter proof, on a testbed of its
    own (`selftest`) that it removes again. Exits 1 when a check failed: the machine would
    not give faithful results (one line per failed check says why)."""
    with guard(as_json):
        from testbed.runs.selftest import selftest as run_selftest

        result = run_selftest(gpu=gpu, say=sayer(as_json))
    if as_json:
        emit(result)
    else:
        _render(result)
    for line in result["failed"]:
        err.print(Text.assemble(("selftest failed: ", "red"), line), highlight=False)
    raise typer.Exit(0 if result["ok"] else 1)


def _render(result: dict) -> None:
    m = result["machine"]
    t = Table("check", "expected", "measured", "verdict", "detail",
              title=f"testbed selftest: kernel {m['kernel']}, {m['cpus']} CPUs"
                    f"{', rootless' if m['rootless'] else ''}")
    for r in result["rows"]:
        t.add_row(*lit(r["check"], r["expected"], r["measured"], Text.from_markup(_MARKS[r["verdict"]]),
                       r["detail"]))
    out.print(t)
    n = {v: sum(r["verdict"] == v for r in result["rows"]) for v in _MARKS}
    plain(f"{'faithful' if result['ok'] else 'NOT faithful'}: {n['pass']} passed, {n['fail']} failed, "
          f"{n['skip']} skipped in {result['seconds']:.0f} s")
