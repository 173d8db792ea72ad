"""``testbed report RUN_DIR...``: schemes compared by time-to-accuracy, per bandwidth."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from rich.text import Text

from testbed.cli.params import JsonOpt
from testbed.cli.render import emit, err, guard, lit, out, plain
from testbed.common.errors import TestbedError

_COLUMNS = ("scheme", "runs", "TTA (s)", "TTA / allreduce", "final acc", "iter (ms)", "iter / allreduce",
            "payload B/iter", "bottleneck B/iter")


def register(app: typer.Typer) -> None:
    app.command()(report)
    app.command()(compose)


def compose(
    accuracy_run: Path = typer.Argument(..., metavar="ACCURACY_RUN", help="A real run (accuracy per iteration, "
                                        "at any speed)."),
    time_run: Path = typer.Argument(..., metavar="TIME_RUN", help="A paper-scale run of the same scheme, model and "
                                    "ranks (--compute-time T: the GPU's step), proven."),
    target_acc: Optional[float] = typer.Option(None, "--target-acc", metavar="FRACTION",
                                               help="Time to this accuracy, sustained (3 evaluations in a row)."),
    as_json: bool = JsonOpt,
):
    """Time-to-accuracy in a GPU's regime: the accuracy of a real run against the emulated
    time of a paper-scale run, iteration by iteration (docs/dilation.md)."""
    with guard(as_json):
        from testbed.runs.reports.compose import compose as composed

        if target_acc is not None and not 0 < target_acc <= 1:
            raise TestbedError(f"--target-acc is a fraction in (0, 1], got {target_acc}")
        c = composed(accuracy_run, time_run)
        tta = c.tta(target_acc) if target_acc is not None else None
        result = {"accuracy_run": str(accuracy_run), "time_run": str(time_run), "points": c.points,
                  "seconds_per_state": {str(k): v for k, v in c.seconds_per_state.items()}, "flags": c.flags,
                  "target_accuracy": target_acc, "time_to_target_s": tta}
        if as_json:
            emit(result)
            return
        t = Table("iteration", "accuracy", "emulated s", title=Text("composed: accuracy against the GPU's time"))
        for p in c.points:
            t.add_row(*lit(str(p["iter"]), f"{p['accuracy']:.4f}", f"{p['train_s']:.2f}"))
        out.print(t)
        for k, v in c.seconds_per_state.items():
            plain(f"time run: {v * 1000:.1f} ms an iteration at {k:,} bytes")
        if target_acc is not None:
            plain(f"time to a sustained {target_acc:g}: " + (f"{tta:.2f} s" if tta is not None else "not reached"))
        for f in c.flags:
            err.print(Text(f"warning: {f}", style="yellow"), highlight=False)


def report(
    dirs: List[Path] = typer.Argument(..., metavar="DIR...", help="Run directories, or directories holding them "
                                      "(a sweep)."),
    target_acc: Optional[float] = typer.Option(None, "--target-acc", metavar="FRACTION",
                                               help="Recompute time-to-accuracy for this target."),
    out_dir: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help="Where tables and plots go "
                                           "(default: FIRST_DIR/report)."),
    include_unproven: bool = typer.Option(False, "--include-unproven", help="Rank runs whose proof had nothing "
                                          "to compare with (status unproven) beside proven ones; bypassed and "
                                          "failed runs are never ranked."),
    baseline: str = typer.Option("allreduce", "--baseline", metavar="SCHEME", help="The scheme (or variant label) "
                                 "every row is set against over paired repeats: median ratio, its interval (95 % "
                                 "from 6 pairs, else the min-max, said so), verdict."),
    tensorboard: Optional[Path] = typer.Option(None, "--tensorboard", metavar="DIR", help="Also write TensorBoard "
                                               "event files from every run's records into DIR, one TensorBoard "
                                               "run per testbed run (`tensorboard --logdir DIR`)."),
    as_json: bool = JsonOpt,
):
    """Tables and plots comparing schemes by time-to-accuracy, per bandwidth (proven runs only)."""
    with guard(as_json):
        from testbed.runs.reports import tensorboard as events
        from testbed.runs.reports.report import find_runs, write

        if tensorboard is not None:
            events.require()
        if target_acc is not None and not 0 < target_acc <= 1:
            raise TestbedError(f"--target-acc is a fraction in (0, 1], got {target_acc}")
        runs = find_runs(dirs, warn=lambda m: err.print(Text(f"warning: {m}", style="yellow")))
        if not runs:
            raise TestbedError("no readable runs in " + ", ".join(map(str, dirs)), "see the warnings above")
        result = write(runs, out_dir or dirs[0] / "report", target_acc, include_unproven, baseline)
        if tensorboard is not None:
            result["tensorboard"] = events.write(events.folders([r.path for r in runs]), tensorboard)
        if as_json:
            emit(result)
            return
        for bw in dict.fromkeys(r["bw"] for r in result["rows"]):
            rows = [r for r in result["rows"] if r["bw"] == bw]
            t = Table(*_COLUMNS, title=Text(f"bottleneck {bw} (median [min-max] over repeats)"))
            for r in rows:
                t.add_row(*lit(*_cells(r)))
            out.print(t)
            _paired_lines(rows, baseline)
            for r in (x for x in rows if x["failed"]):
                out.print(Text(f"{r['scheme']}: {'; '.join(r['failed'])}", style="yellow"), highlight=False,
                          markup=False)
        plain(f"written to {result['out']}: {', '.join(result['files'])}")
        if tensorboard is not None:
            plain(f"TensorBoard event files of {len(runs)} run{'s' if len(runs) != 1 else ''} in {tensorboard}: "
                  f"`tensorboard --logdir {tensorboard}`")


def _cells(r: dict) -> list[str]:
    """One report row as table cells."""
    tta = ("-" if r["target_accuracy"] is None else
           _spread(r, "tta_s", ".1f") if r["tta_s"] is not None else f"not reached ({r['reached']}/{r['ok']})")
    return [r["scheme"], f"{r['ok']}/{r['runs']}", tta, _num(r["tta_vs_allreduce"], ".2f"),
            _spread(r, "final_accuracy", ".4f"), _spread(r, "mean_iter_s", ".0f", 1000),
            _num(r["iter_time_vs_allreduce"], ".2f"), _num(r["payload_bytes_per_iter"], ",.0f"),
            _num(r["wire_bytes_per_iter"], ",.0f")]


def _paired_lines(rows: list[dict], baseline: str) -> None:
    """Under a bandwidth's table: each row against the baseline over paired repeats."""
    res = next((r["accuracy_resolution"] for r in rows if r.get("accuracy_resolution")), None)
    if res:
        plain(f"accuracy resolution: {res * 100:.2f} points (one test sample)")
    for r in rows:
        parts = []
        for name, what in (("iter", "iteration time"), ("tta_sustained", "sustained time to target")):
            ratio, n = r.get(f"{name}_ratio"), r.get(f"{name}_pairs") or 0
            if ratio is None:
                continue
            ci = (f" [{r[f'{name}_ci_low']:.2f}-{r[f'{name}_ci_high']:.2f}: {r[f'{name}_interval']}]"
                  if r.get(f"{name}_ci_low") is not None else "")
            parts.append(f"{what} x{ratio:.2f}{ci} ({n} pair{'s' if n != 1 else ''}: {r[f'{name}_verdict']})")
        if parts and r["variant"] != baseline and r["base_scheme"] != baseline:
            plain(f"{r['scheme']} / {baseline}: " + "; ".join(parts))


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _spread(r: dict, key: str, fmt: str, scale: float = 1.0) -> str:
    """``median [min-max]`` of ``key`` (its ``_min``/``_max`` siblings), the range only over repeats."""
    stem, unit = (key[:-2], "_s") if key.endswith("_s") else (key, "")
    mid, lo, hi = r[key], r.get(f"{stem}_min{unit}"), r.get(f"{stem}_max{unit}")
    if mid is None:
        return "-"
    text = format(mid * scale, fmt)
    if r["ok"] > 1 and lo is not None:
        text += f" [{format(lo * scale, fmt)}-{format(hi * scale, fmt) if hi is not None else 'not reached'}]"
    return text
