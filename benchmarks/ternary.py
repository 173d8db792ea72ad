"""Ternary PacTrain against exact PacTrain from the same checkpoint, rate by rate.

    sudo python -m benchmarks.ternary [--bws 100mbit,1gbit] [--repeats 5] [--epochs 4] [--name p29t]
    python -m benchmarks.ternary --analyse runs/ternary/sweep-...   (re-read, no runs)

One ``testbed sweep`` of ``pactrain:exact`` and ``pactrain`` (ternary, the default) on
three_switch (8 gloo ranks, the CNN on digits from one seeded 2-epoch checkpoint), each
``--repeats`` times; repeat k of both uses seed + k, so the runs pair up. Per rate it
prints each variant's steady iteration time T (rank 0's median after the first four
iterations, as ``paper_sweep``) as median [min-max] over repeats, its bytes per iteration
on the busiest bottleneck direction W, DDP's compute and communication timers, and
ternary / exact: of the medians, and the min-max of the paired per-seed ratios. Ternary
sends about a quarter of exact's compact bytes; the question is whether its iterations
are no slower where the link does not bind and faster where it does.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.paper_sweep import _group, median_of, _spread, busiest_bytes_per_iter, steady, steady_iter_s, sweep
from testbed.model.units import Rate
from testbed.runs.reports.report import RunData, find_runs

VARIANTS = ("pactrain 0.5 exact", "pactrain 0.5 ternary")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bws", default="100mbit,1gbit")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--epochs", type=float, default=4)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("runs/ternary"))
    p.add_argument("--name", default=None, help="bring three_switch up under this name")
    p.add_argument("--analyse", type=Path, nargs="*", help="sweep directories to read instead of running")
    args = p.parse_args()
    args.target_acc, args.pretrain_epochs, args.pretrain_dataset = 0.95, 2.0, None  # as paper_sweep's
    dirs = args.analyse or [sweep(args.out, "pactrain:0.5:exact,pactrain:0.5", args.bws, args)]
    runs = [r for r in find_runs(dirs) if r.status == "ok" and r.label in VARIANTS]
    print(f"\nsweep dirs: {', '.join(map(str, dirs))}; 8 gloo ranks on three_switch, CNN on digits")
    bws = [b.strip() for b in args.bws.split(",")] if not args.analyse else sorted({r.bw for r in runs}, key=_bps)
    report(runs, bws)


def _bps(bw: str) -> float:
    try:
        return Rate.parse(bw).bps
    except ValueError:
        return float("inf")


def _num(x: float | None) -> float:
    return float("nan") if x is None else x


def report(runs: list[RunData], bws: list[str]) -> None:
    by = _group(runs, lambda r: (r.bw, r.label))
    print(f"{'rate':>8} {'variant':<22} {'runs':>4} {'T s':>21} {'W MB':>6} {'compute s':>9} {'comm s':>7}")
    for bw in bws:
        t = {}
        for label in VARIANTS:
            rs = sorted(by.get((bw, label), []), key=lambda r: r.summary.get("seed", 0))
            if not rs:
                print(f"{bw:>8} {label:<22} (no run)")
                continue
            mid, lo, hi = _spread(steady_iter_s(r) for r in rs)
            t[label] = {r.summary.get("seed"): steady_iter_s(r) for r in rs}
            w = statistics.median(busiest_bytes_per_iter(r) for r in rs) / 1e6
            comp, comm = (median_of(steady(r, k) for r in rs) for k in ("compute_s", "comm_s"))
            print(f"{bw:>8} {label:<22} {len(rs):>4} {f'{mid:.3f} [{lo:.3f}-{hi:.3f}]':>21} {w:6.2f} "
                  f"{_num(comp):9.3f} {_num(comm):7.3f}")
        if len(t) == 2:
            exact, tern = (t[v] for v in VARIANTS)
            paired = [tern[s] / exact[s] for s in exact if s in tern]
            ratio = statistics.median(tern.values()) / statistics.median(exact.values())
            print(f"{bw:>8} ternary / exact: {ratio:.3f} of the medians; per seed {min(paired):.3f}-"
                  f"{max(paired):.3f} over {len(paired)} pairs")


if __name__ == "__main__":
    main()
