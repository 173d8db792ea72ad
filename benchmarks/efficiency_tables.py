"""docs/results/efficiency.md's tables, from the records of ``benchmarks.claims --sections
eff,eff_prunex`` (issue 41: every figure from committed records).

Every scheme is set against its own two bounds (``benchmarks.bounds``): with C its compute
per iteration (its own median steady iteration time with the bottleneck at 10 Gbit) and W its
bytes per iteration on the busiest bottleneck direction at rate R, the perfect-overlap bound
max(C, W / R) and the no-overlap time C + W / R. T is a run's median iteration time after
the first ``paper_sweep.WARMUP``; W the median over a cell's runs of the tc counters' busiest
direction over the whole run (start-up and evaluation included) per iteration. DDP's timers
are rank 0's medians (after the same warm-up), then the median over the cell's runs.

``ternary_table`` pairs ternary and exact PacTrain by repeat (same checkpoint, back to back):
the median ratio of their steady iteration times with its interval (95 % from 6 pairs, else
the min-max, marked so: ``testbed.runs.reports.stats``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from benchmarks import bounds
from benchmarks.archive import runs_of
from benchmarks.claims_tables import RATE_NAMES, cell, paired
from benchmarks.paper_sweep import busiest_bytes_per_iter, median_of, steady, steady_iter_s
from testbed.common.errors import TestbedError
from testbed.model.units import Rate
from testbed.runs.reports.rundata import RunData

FREE = "10gbit"
PACTRAIN = ("allreduce", "fp16", "topk 0.01", "pactrain 0.5 exact", "pactrain 0.5 ternary")
PRUNEX = ("allreduce", "hier-allreduce", "prunex 0.5")
HEADER = ("| rate | scheme | runs | T s | C s | W MB | W/R s | max(C, W/R) s | C + W/R s | overlap eff | "
          "no-overlap eff | DDP compute / comm / overlap s |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |")


def _runs(folder: Path, labels: Sequence[str]) -> list[RunData]:
    """The ok runs of the sweeps in ``folder`` that ran exactly the schemes ``labels``."""
    runs = runs_of(folder)
    by_sweep: dict[Path, set] = {}
    for r in runs:
        by_sweep.setdefault(r.path.parent, set()).add(r.label)
    dirs = {d for d, ls in by_sweep.items() if ls == set(labels)}
    ok = [r for r in runs if r.path.parent in dirs and r.status == "ok"]
    if not ok:
        section = "eff" if "fp16" in labels else "eff_prunex"
        raise TestbedError(f"{folder}: no runs of {', '.join(labels)}",
                           f"python -m benchmarks.claims --sections {section}")
    return ok


def _rates(runs: Sequence[RunData]) -> list[str]:
    return sorted({r.bw for r in runs if r.bw != FREE}, key=lambda b: Rate.parse(b).bps)


def _row(bw: str, label: str, rs: Sequence[RunData], c: float | None) -> str:
    w = statistics.median(busiest_bytes_per_iter(r) for r in rs)
    cells = bounds.cells([steady_iter_s(r) for r in rs], c, w, Rate.parse(bw).bps / 8)
    return (f"| {RATE_NAMES.get(bw, bw)} | {label} | " + " | ".join(cells)
            + f" | {_timers(rs, ('compute_s', 'comm_s', 'overlap_s'))} |")


def _timers(rs: Sequence[RunData], keys: Sequence[str]) -> str:
    """DDP's timers ``keys`` over runs ``rs``: each rank 0's steady median, then the median
    over the runs; '-' where the records lack one."""
    timers = (median_of(steady(r, key) for r in rs) for key in keys)
    return " / ".join("-" if t is None else f"{t:.3f}" for t in timers)


def table(runs: Sequence[RunData], labels: Sequence[str]) -> str:
    """One row per rate and scheme (``labels`` order), C from the same scheme's 10 Gbit runs."""
    free = {lab: median_of(steady_iter_s(r) for r in runs if r.label == lab and r.bw == FREE) for lab in labels}
    out = [HEADER]
    for bw in _rates(runs):
        for lab in labels:
            rs = [r for r in runs if r.label == lab and r.bw == bw]
            if rs:
                out.append(_row(bw, lab, rs, free[lab]))
    out.append("")
    out.append(f"C, the {RATE_NAMES[FREE]} runs' T, and DDP's compute / comm timers in them (s): "
               + "; ".join(f"{lab} {free[lab]:.3f}, "
               f"{_timers([r for r in runs if r.label == lab and r.bw == FREE], ('compute_s', 'comm_s'))}"
               for lab in labels if free[lab] is not None)
               + ".")
    return "\n".join(out) + "\n"


def pactrain_table(folder: Path) -> str:
    return table(_runs(folder, PACTRAIN), PACTRAIN)


def prunex_table(folder: Path) -> str:
    return table(_runs(folder, PRUNEX), PRUNEX)


def ternary_table(folder: Path) -> str:
    """Ternary against exact PacTrain, paired by repeat, per rate: iteration time and bytes."""
    runs = _runs(folder, PACTRAIN)
    out = ["| rate | T ternary / exact | W ternary / exact | T exact s | T ternary s |",
           "| --- | --- | --- | ---: | ---: |"]
    for bw in [FREE, *_rates(runs)]:
        ter = [r for r in runs if r.label == "pactrain 0.5 ternary" and r.bw == bw]
        ex = [r for r in runs if r.label == "pactrain 0.5 exact" and r.bw == bw]
        if not (ter and ex):
            continue
        t = paired(ter, ex, steady_iter_s)
        w = paired(ter, ex, busiest_bytes_per_iter)
        out.append(f"| {RATE_NAMES.get(bw, bw)} | {cell(t)} | {cell(w)} | "
                   f"{statistics.median(map(steady_iter_s, ex)):.3f} | {statistics.median(map(steady_iter_s, ter)):.3f} |")
    return "\n".join(out) + "\n"
