"""The PacTrain paper's comparison (Fig. 3) on the emulated three-switch testbed, CPU-sized.

    sudo python -m benchmarks.paper_sweep [--epochs 8] [--target-acc 0.92] [--out runs/paper]
    python -m benchmarks.paper_sweep --analyse runs/paper/sweep-...   (re-read, no runs)

Runs ``testbed sweep`` (8 gloo ranks on topologies/three_switch.yaml, the CNN on the bundled
digits set, one shared pre-trained checkpoint) for allreduce, fp16, topk and pactrain at
100 Mbit, 500 Mbit and 1 Gbit, plus PacTrain with ternary quantisation, plus allreduce and
pactrain at 10 Gbit (the access links' rate: the bottleneck no longer binds). It prints,
per rate: iteration-time speedup and time-to-accuracy speedup over allreduce (the paper
normalises TTA to allreduce), and the bottleneck bytes per iteration.

PacTrain's physical bound: an iteration costs C + W / R at most, C being everything but
the link time (measured: allreduce's iteration time at 10 Gbit) and W the bytes per
iteration on the busiest bottleneck direction (measured from its tc counters over the
run; eval and start-up traffic included). The bound on PacTrain's iteration-time speedup
is (C + W_allreduce / R) / (C + W_pactrain / R); the benchmark reports the measured
speedup as a fraction of it (target >= 0.9 at 100 Mbit).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from testbed.report import RunData, find_runs, table
from testbed.units import Rate

SHAPED = ("100mbit", "500mbit", "1gbit")
FREE = "10gbit"


def _testbed() -> list[str]:
    exe = shutil.which("testbed")
    return [exe] if exe else [sys.executable, "-m", "testbed"]


def sweep(out: Path, schemes: str, bws: str, args: argparse.Namespace, *extra: str) -> Path:
    cmd = [*_testbed(), "sweep", "--schemes", schemes, "--bw", bws, "--out", str(out),
           "--epochs", str(args.epochs), "--target-acc", str(args.target_acc), "--json", *extra]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"sweep failed (exit {p.returncode}): {p.stdout[-2000:]}")
    return Path(json.loads(p.stdout)["dir"])


def busiest_bytes_per_iter(r: RunData) -> float:
    links = r.summary["bottleneck"]["links"]
    return max(v["bytes"] for v in links.values()) / r.summary["iterations"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/paper"))
    p.add_argument("--epochs", type=float, default=8)
    p.add_argument("--target-acc", type=float, default=0.92)
    p.add_argument("--analyse", type=Path, nargs="*", help="sweep directories to read instead of running")
    args = p.parse_args()

    if args.analyse:
        dirs = args.analyse
    else:
        dirs = [sweep(args.out, "allreduce,fp16,topk,pactrain", ",".join(SHAPED), args),
                sweep(args.out, "pactrain", ",".join(SHAPED), args, "--ternary"),
                sweep(args.out, "allreduce,pactrain", FREE, args)]
    runs = [r for r in find_runs(dirs) if r.status == "ok"]
    rows = table(runs, args.target_acc)
    by = {(r.bw, r.label): r for r in runs}

    print(f"\n8 ranks (gloo, CPU), CNN on digits, three_switch; sweep dirs: {', '.join(map(str, dirs))}")
    print(f"target accuracy {rows[0]['target_accuracy']}; speedup = allreduce / scheme (higher is better)\n")
    print(f"{'rate':>8} {'scheme':<22} {'iter s':>7} {'iter speedup':>12} {'TTA s':>7} {'TTA speedup':>11} "
          f"{'final acc':>9} {'payload MB':>10} {'busiest link MB/iter':>20}")
    for row in rows:
        r = by.get((row["bw"], row["scheme"]))
        tta = row["tta_s"]
        print(f"{row['bw']:>8} {row['scheme']:<22} {row['mean_iter_s']:7.3f} "
              f"{1 / row['iter_time_vs_allreduce'] if row['iter_time_vs_allreduce'] else float('nan'):12.2f} "
              f"{tta if tta is not None else float('nan'):7.1f} "
              f"{1 / row['tta_vs_allreduce'] if row['tta_vs_allreduce'] else float('nan'):11.2f} "
              f"{row['final_accuracy']:9.3f} {row['payload_bytes_per_iter'] / 1e6:10.3f} "
              f"{busiest_bytes_per_iter(r) / 1e6 if r else float('nan'):20.3f}")

    free = by.get((FREE, "allreduce"))
    if free is None:
        print("\nno allreduce run at 10gbit: cannot compute the physical bound")
        return
    c = free.summary["mean_iter_s"]
    print(f"\nPacTrain's physical bound; C = allreduce's iteration time at {FREE} = {c:.3f} s "
          f"(pactrain's there: {by[(FREE, 'pactrain 0.5')].summary['mean_iter_s']:.3f} s)"
          if (FREE, "pactrain 0.5") in by else f"\nC = {c:.3f} s")
    for bw in SHAPED:
        rate = Rate.parse(bw).bps / 8
        base = by.get((bw, "allreduce"))
        for label in ("pactrain 0.5", "pactrain 0.5 ternary"):
            pt = by.get((bw, label))
            if base is None or pt is None:
                continue
            wd, wc = busiest_bytes_per_iter(base), busiest_bytes_per_iter(pt)
            bound = (c + wd / rate) / (c + wc / rate)
            measured = base.summary["mean_iter_s"] / pt.summary["mean_iter_s"]
            print(f"  {bw:>8} {label:<22} W dense {wd / 1e6:.2f} MB, compact {wc / 1e6:.2f} MB; "
                  f"bound {bound:.2f}x, measured {measured:.2f}x = {measured / bound:.2f} of the bound"
                  + ("   (target >= 0.9)" if bw == "100mbit" else ""))


if __name__ == "__main__":
    main()
