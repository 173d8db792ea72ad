"""The papers' comparisons on the emulated three-switch testbed, CPU-sized.

    sudo python -m benchmarks.paper_sweep [--sections pactrain,prune,prunex,spardl] [--epochs 8] [--repeats 3]
                                          [--target-acc 0.95] [--eval-every 1] [--out runs/paper]
    python -m benchmarks.paper_sweep --analyse runs/paper/sweep-...   (re-read, no runs)

Section ``pactrain`` (the PacTrain paper's Fig. 3):

Runs ``testbed sweep`` (8 gloo ranks on topologies/three_switch.yaml, the CNN on the bundled
digits set, one shared checkpoint pre-trained for 2 epochs, seeded: 0.76 accuracy) for
allreduce, fp16, topk 0.01, pactrain 0.5 exact and ternary at 100 Mbit, 500 Mbit
and 1 Gbit and at 10 Gbit (the access links' rate: the bottleneck no longer binds), each
``--repeats`` times (seed + k). Evaluation runs every iteration, off the training clock,
and the target (0.95) is one allreduce reaches about half-way through the 8 epochs, so
time to accuracy measures convergence rather than evaluation granularity. It prints, per
rate and variant, the median and [min-max] over repeats of the iteration time, time to
accuracy and final accuracy, speedups over allreduce (the paper normalises TTA to
allreduce), and the bottleneck bytes per iteration.

Every section's sweep also runs its schemes with the bottleneck at 10 Gbit, and each
section then prints every scheme's efficiency against its own two bounds
(``benchmarks.bounds``): the perfect-overlap bound max(C, W / R) and the no-overlap time
C + W / R against T, a run's median iteration time after the first four (DDP's bucket
rebuild, PacTrain's dense start); C is the scheme's own T at 10 Gbit (its hook's CPU work
counts as compute; its bytes take under 4 ms there), W the median bytes per iteration on
the busiest bottleneck direction (tc counters over the run; eval and start-up traffic
included), R the rate.

Section ``prune`` (the PacTrain paper's Fig. 6: final accuracy against the pruning ratio):
allreduce and exact pactrain at ``--prune-ratios`` (default 0.1, 0.3, 0.5, 0.7, 0.9) at
``--prune-bw`` from the same checkpoint; it prints per ratio the final accuracy and time to
accuracy, median [min-max] over repeats, the payload relative to allreduce, and the final
accuracy's difference from allreduce's. ``testbed report`` on its sweep directory draws
prune_ratio.png.

Section ``prunex`` (PruneX's claim: about 60 % less inter-node traffic than a flat dense
all-reduce): allreduce, hier-allreduce and prunex on three_switch at ``--prunex-bw`` (or
``--prunex-workers`` N behind its two edge switches, with ``--prunex-model`` such as
resnet18, whose batch norm PruneX masks too); it
prints the bytes per iteration on the switches' uplinks (tc counters, all directions) of
prunex relative to allreduce and to hier-allreduce (hierarchy's gain apart from pruning's),
with iteration time and time to accuracy.

Section ``spardl`` (SparDL's claim: up to 4.9x faster than sparse all-reduce baselines,
more so as ranks grow): spardl and topk (the top-k all-gather baseline) at the same
density on 2, 4 and 8 workers split over two edge switches (three_switch's shape, fewer
workers) at ``--spardl-bw``; it prints per-rank wire bytes per iteration (tx counters of
each rank's interface) and iteration time, and topk / spardl for both.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks import bounds
from testbed.common.files import read_jsonl
from testbed.runs.reports.report import RunData, find_runs, table
from testbed.model.units import Rate

SHAPED = ("100mbit", "500mbit", "1gbit")
FREE = "10gbit"
PACTRAIN = ("allreduce", "fp16", "topk 0.01", "pactrain 0.5 exact", "pactrain 0.5 ternary")
PRUNEX = ("allreduce", "hier-allreduce", "prunex 0.5")
SCALE = (2, 4, 8)
SECTIONS = ("pactrain", "prune", "prunex", "spardl")
PRUNE_RATIOS = "0.1,0.3,0.5,0.7,0.9"
PRETRAIN_DATASET = None
"""Pre-train on digits itself (2 epochs: 0.76 accuracy, seeded). Pre-trained on the
synthetic set instead, the CNN's features blew the first fine-tuning step up (loss 22,
stuck at chance): `--pretrain-dataset` is there for tasks that transfer."""
THREE = Path(__file__).resolve().parents[1] / "testbed" / "topologies" / "three_switch.yaml"


def testbed_argv() -> list[str]:
    """The ``testbed`` program beside this Python (or ``python -m testbed``)."""
    exe = shutil.which("testbed")
    return [exe] if exe else [sys.executable, "-m", "testbed"]


def sweep(out: Path, schemes: str, bws: str, args: argparse.Namespace, *extra: str) -> Path:
    cmd = [*testbed_argv(), "sweep", "--schemes", schemes, "--bw", bws, "--out", str(out),
           "--epochs", str(args.epochs), "--target-acc", str(args.target_acc), "--repeats", str(args.repeats),
           "--eval-every", str(args.eval_every), "--pretrain-epochs", str(args.pretrain_epochs), "--json", *extra]
    if args.pretrain_dataset:
        cmd += ["--pretrain-dataset", args.pretrain_dataset]
    if args.name and "--topology" not in extra:  # three_switch under another name
        t = yaml.safe_load(THREE.read_text())
        t["name"] = args.name
        path = out / f"{args.name}.yaml"
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(t, sort_keys=False))
        cmd += ["--topology", str(path)]
    return run_sweep(cmd, schemes)


def run_sweep(cmd: list[str], what: str, partial_ok: bool = False) -> Path:
    """Run a ``testbed sweep ... --json`` command, printed first; the sweep's directory.
    Exits naming ``what`` when the sweep did not start, or when a run failed (with
    ``partial_ok``, says so and goes on: the failed runs are in its sweep.json)."""
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    try:
        out = Path(json.loads(p.stdout)["dir"])
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"{what}: sweep failed (exit {p.returncode}): {p.stdout[-2000:]}") from None
    if p.returncode != 0:
        if not partial_ok:
            raise SystemExit(f"{what}: sweep failed (exit {p.returncode}): see {out}/sweep.json")
        print(f"(some runs of {what} failed: see {out}/sweep.json)", flush=True)
    return out


def scaled_topology(n: int, where: Path) -> Path:
    """three_switch with n workers, half behind each edge switch (named scale<n>)."""
    t = yaml.safe_load(THREE.read_text())
    t["name"] = f"scale{n}"
    workers = [f"w{i}" for i in range(n)]
    t["nodes"] = {k: v for k, v in t["nodes"].items() if v.get("kind") == "switch" or k in workers}
    t["links"] = ([{"endpoints": [w, "s1" if i < n // 2 else "s2"]} for i, w in enumerate(workers)]
                  + [l for l in t["links"] if not str(l["endpoints"][0]).startswith("w")])
    path = where / f"scale{n}.yaml"
    path.write_text(yaml.safe_dump(t, sort_keys=False))
    return path


WARMUP = 4
"""Iterations left out of the steady iteration time: DDP's bucket rebuild after the first, and
PacTrain's dense iterations until its mask tracker is stable (``--stable-iters`` 3)."""


def steady(r: RunData, key: str = "iter_s") -> float | None:
    """Rank 0's median of ``key`` (iter_s; DDP's timers compute_s, comm_s, overlap_s) over
    the iterations after the first ``WARMUP``; None when the records are too short."""
    try:
        xs = [x[key] for x in read_jsonl(r.path / "rank0.jsonl") if isinstance(x.get(key), (int, float))]
    except OSError:
        xs = []
    return statistics.median(xs[WARMUP:]) if len(xs) > WARMUP else None


def steady_iter_s(r: RunData) -> float:
    """``steady`` iteration time, or the summary's mean when the records are too short."""
    t = steady(r)
    return t if t is not None else r.summary["mean_iter_s"]


def busiest_bytes_per_iter(r: RunData) -> float:
    links = r.summary["bottleneck"]["links"]
    return max(v["bytes"] for v in links.values()) / r.summary["iterations"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/paper"))
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    p.add_argument("--epochs", type=float, default=8)
    p.add_argument("--target-acc", type=float, default=0.95,
                   help="allreduce reaches 0.95 about half-way through 8 epochs from the default checkpoint")
    p.add_argument("--repeats", type=int, default=3, help="runs per cell (seed + k each); tables show the spread")
    p.add_argument("--eval-every", type=int, default=1, help="iterations between evaluations (off the clock)")
    p.add_argument("--pretrain-dataset", default=PRETRAIN_DATASET,
                   help="the shared checkpoint is pre-trained on this dataset, then fine-tuned on digits")
    p.add_argument("--pretrain-epochs", type=float, default=2.0)
    p.add_argument("--prunex-bw", default="100mbit")
    p.add_argument("--prunex-model", default=None, help="the prunex section's model (default: the CNN; "
                   "resnet18 or vgg19 for batch norm, as the paper's)")
    p.add_argument("--prunex-width", default=None, help="the prunex section's --width")
    p.add_argument("--prunex-workers", type=int, default=8,
                   help="ranks of the prunex section, half behind each edge switch (8: three_switch itself)")
    p.add_argument("--prune-bw", default="1gbit", help="the rate of the prune section (accuracy, not time)")
    p.add_argument("--prune-ratios", default=PRUNE_RATIOS)
    p.add_argument("--spardl-bw", default="100mbit")
    p.add_argument("--name", default=None, help="bring three_switch up under this name (another testbed "
                   "named three_switch, e.g. a test's, would take its namespaces away)")
    p.add_argument("--analyse", type=Path, nargs="*", help="sweep directories to read instead of running")
    args = p.parse_args()
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    if not sections or set(sections) - set(SECTIONS):
        p.error(f"--sections: choose from {', '.join(SECTIONS)}")

    if args.analyse:
        dirs = args.analyse
    else:
        dirs = []
        if "pactrain" in sections:
            dirs.append(sweep(args.out, "allreduce,fp16,topk:0.01,pactrain:0.5:exact,pactrain:0.5:ternary",
                              ",".join((*SHAPED, FREE)), args))
        if "prune" in sections:
            dirs.append(sweep(args.out, "allreduce,pactrain:exact", args.prune_bw, args,
                              "--prune-ratios", args.prune_ratios))
        if "prunex" in sections:
            with tempfile.TemporaryDirectory() as tmp:
                dirs.append(sweep(args.out, "allreduce,hier-allreduce,prunex", f"{args.prunex_bw},{FREE}", args,
                                  *_prunex_extra(args, Path(tmp))))
        if "spardl" in sections:
            with tempfile.TemporaryDirectory() as tmp:
                for n in SCALE:
                    dirs.append(sweep(args.out, "topk,spardl", f"{args.spardl_bw},{FREE}", args,
                                      "--topology", str(scaled_topology(n, Path(tmp)))))
    runs = [r for r in find_runs(dirs) if r.status == "ok"]
    print(f"\nsweep dirs: {', '.join(map(str, dirs))}; gloo on CPU, CNN on digits")
    three = [r for r in runs if r.summary.get("world_size") == 8 and not str(r.summary.get("topology")).startswith("scale")]
    if "pactrain" in sections:
        pactrain_section([r for r in _sweeps_with(three, {"fp16", "pactrain 0.5 ternary"}) if r.label in PACTRAIN],
                         args)
    if "prune" in sections:
        ratios = {f"pactrain {float(x):g} exact" for x in args.prune_ratios.split(",")} - {"pactrain 0.5 exact"}
        prune_section([r for r in _sweeps_with(three, ratios) if r.bw == args.prune_bw
                       and r.summary["scheme"] in ("allreduce", "pactrain")
                       and not (r.summary.get("hyper") or {}).get("ternary")], args)
    if "prunex" in sections:
        mine = _sweeps_with(runs, {"prunex 0.5", "hier-allreduce"})
        prunex_section([r for r in mine if r.bw == args.prunex_bw], args)
        efficiency_section("PruneX section", [r for r in mine if r.label in PRUNEX], (args.prunex_bw,))
    if "spardl" in sections:
        scaled = [r for r in runs if str(r.summary.get("topology")).startswith("scale")
                  and r.summary.get("scheme") in ("spardl", "topk")]
        spardl_section([r for r in scaled if r.bw == args.spardl_bw], args)
        efficiency_section("SparDL section", scaled, (args.spardl_bw,),
                           key=lambda r: f"{r.summary['world_size']} ranks {r.label}")


def _prunex_extra(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The prunex section's model and, below 8 workers, its topology (``scaled_topology``)."""
    extra = []
    for flag, value in (("--model", args.prunex_model), ("--width", args.prunex_width)):
        extra += [flag, str(value)] if value is not None else []
    if args.prunex_workers != 8:
        extra += ["--topology", str(scaled_topology(args.prunex_workers, tmp))]
    return extra


def _sweeps_with(runs: list[RunData], labels: set) -> list[RunData]:
    """The runs of the sweep directories that hold a run labelled one of ``labels``: a
    section's own sweep (another section's allreduce runs are not repeats of its cells)."""
    dirs = {r.path.parent for r in runs if r.label in labels}
    return [r for r in runs if r.path.parent in dirs]


def median_of(values) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def _x(a, b) -> float:
    return a / b if a is not None and b else float("nan")


def _spread(values) -> tuple:
    """(median, min, max) of the values that are not None; (None, None, None) if none."""
    vs = [v for v in values if v is not None]
    return (statistics.median(vs), min(vs), max(vs)) if vs else (None, None, None)


def _group(runs: list[RunData], key) -> dict:
    out: dict = {}
    for r in runs:
        out.setdefault(key(r), []).append(r)
    return out


def prunex_section(runs: list[RunData], args) -> None:
    by = _group(runs, lambda r: r.label)
    first = runs[0].summary if runs else {}
    print(f"\nPruneX on {first.get('topology')} at {args.prunex_bw}, {first.get('world_size')} ranks behind two "
          f"switches, model {(first.get('hyper') or {}).get('model')}; speedup = allreduce / scheme (of medians); "
          f"median [min-max] over repeats")
    print(f"{'scheme':<16} {'runs':>4} {'uplinks MB/iter':>23} {'vs allreduce':>12} {'iter s':>21} "
          f"{'iter speedup':>12} {'TTA s':>19} {'TTA speedup':>11} {'final acc':>21} {'kept':>5}")
    med = {}
    for label in ("allreduce", "hier-allreduce", "prunex 0.5"):
        rs = by.get(label)
        if not rs:
            print(f"{label:<16} (no run)")
            continue
        n = len(rs)
        up = _spread(r.summary["bottleneck"]["bytes_per_iteration"] / 1e6 for r in rs)
        it = _spread(r.summary["mean_iter_s"] for r in rs)
        tta = _spread(r.tta(args.target_acc) for r in rs)
        acc = _spread(r.summary["final_accuracy"] for r in rs)
        med[label] = (up[0], it[0], tta[0])
        b = med.get("allreduce", (None, None, None))
        print(f"{label:<16} {n:>4} {_cell(*up, '.3f', n):>23} {_x(up[0], b[0]):12.3f} {_cell(*it, '.3f', n):>21} "
              f"{_x(b[1], it[0]):12.2f} {_cell(*tta, '.1f', n):>19} {_x(b[2], tta[0]):11.2f} "
              f"{_cell(*acc, '.3f', n):>21} {rs[0].summary.get('kept_fraction') or 1:5.2f}")
    if {"prunex 0.5", "allreduce", "hier-allreduce"} <= set(med):
        p, a, h = (med[k][0] for k in ("prunex 0.5", "allreduce", "hier-allreduce"))
        print(f"prunex sends {1 - p / a:.0%} less over the uplinks than allreduce (paper: about 60 %), "
              f"{1 - p / h:.0%} less than hier-allreduce (the pruning's share); "
              f"hierarchy alone: {1 - h / a:.0%} less (medians; uplink bytes include start-up and evaluation)")


def prune_section(runs: list[RunData], args) -> None:
    rows = table(runs, args.target_acc)  # runs: allreduce and exact pactrain (main selects them)
    base = next((r for r in rows if r["base_scheme"] == "allreduce"), None)
    pts = sorted((r for r in rows if r["base_scheme"] == "pactrain" and r["hyper"].get("prune_ratio") is not None),
                 key=lambda r: r["hyper"]["prune_ratio"])
    if not pts:
        print("\nno pactrain runs for the pruning-ratio section")
        return
    print(f"\nFinal accuracy against the pruning ratio (Fig. 6): 8 ranks, three_switch at {args.prune_bw}, "
          f"median [min-max] over repeats; target {args.target_acc}")
    print(f"{'ratio':>5} {'runs':>4} {'final acc':>21} {'vs allreduce':>12} {'TTA s':>19} {'payload/allreduce':>17}")
    rowsout = ([("dense", base)] if base else []) + [(f"{r['hyper']['prune_ratio']:g}", r) for r in pts]
    for name, r in rowsout:
        n = r["ok"]
        diff = r["final_accuracy"] - base["final_accuracy"] if base and r["final_accuracy"] is not None \
            and base["final_accuracy"] is not None else float("nan")
        print(f"{name:>5} {n:>4} "
              f"{_cell(r['final_accuracy'], r['final_accuracy_min'], r['final_accuracy_max'], '.3f', n):>21} "
              f"{diff:+12.3f} {_cell(r['tta_s'], r['tta_min_s'], r['tta_max_s'], '.1f', n):>19} "
              f"{_x(r['payload_bytes_per_iter'], base['payload_bytes_per_iter'] if base else None):17.3f}")


def spardl_section(runs: list[RunData], args) -> None:
    by = _group(runs, lambda r: (r.summary["world_size"], r.summary["scheme"]))
    print(f"\nSparDL vs the top-k all-gather at {args.spardl_bw}, workers split over two switches; density 0.01 "
          f"both; median [min-max] over repeats, ratios of medians")
    print(f"{'ranks':>5} {'runs':>4} {'topk wire KB/rank/iter':>26} {'spardl':>26} {'topk/spardl':>11} "
          f"{'topk iter s':>21} {'spardl':>21} {'topk/spardl':>11} {'topk acc':>21} {'spardl acc':>21}")
    for n in SCALE:
        t, d = by.get((n, "topk")), by.get((n, "spardl"))
        if not t or not d:
            print(f"{n:>5} (missing runs)")
            continue
        k = min(len(t), len(d))
        tw, dw = (_spread(x.summary["mean_wire_tx_bytes_per_iteration"] / 1e3 for x in rs) for rs in (t, d))
        ti, di = (_spread(x.summary["mean_iter_s"] for x in rs) for rs in (t, d))
        ta, da = (_spread(x.summary["final_accuracy"] for x in rs) for rs in (t, d))
        print(f"{n:>5} {k:>4} {_cell(*tw, '.1f', k):>26} {_cell(*dw, '.1f', k):>26} {_x(tw[0], dw[0]):11.2f} "
              f"{_cell(*ti, '.3f', k):>21} {_cell(*di, '.3f', k):>21} {_x(ti[0], di[0]):11.2f} "
              f"{_cell(*ta, '.3f', k):>21} {_cell(*da, '.3f', k):>21}")


def _cell(mid, lo, hi, fmt: str, n: int) -> str:
    """'median [min-max]' (just the median for one run); 'not reached' where None."""
    if mid is None:
        return "not reached"
    text = format(mid, fmt)
    if n > 1 and lo is not None:
        text += f" [{format(lo, fmt)}-{format(hi, fmt) if hi is not None else 'n.r.'}]"
    return text


def pactrain_section(runs: list[RunData], args) -> None:
    if not runs:
        print("\nno PacTrain runs")
        return
    rows = table(runs, args.target_acc)
    by_path = {str(r.path): r for r in runs}

    def wire(row) -> float:  # median busiest-direction bytes per iteration over the row's runs
        return statistics.median(busiest_bytes_per_iter(by_path[p]) for p in row["paths"] if p in by_path)

    print("\nPacTrain's comparison: 8 ranks, three_switch; median [min-max] over repeats")
    print(f"target accuracy {rows[0]['target_accuracy']}; speedup = allreduce / scheme (higher is better)\n")
    print(f"{'rate':>8} {'scheme':<22} {'runs':>4} {'iter s':>21} {'iter speedup':>12} {'TTA s':>19} "
          f"{'TTA speedup':>11} {'final acc':>21} {'payload MB':>10} {'busiest MB/iter':>15}")
    for row in rows:
        n = row["ok"]
        print(f"{row['bw']:>8} {row['scheme']:<22} {n:>4} "
              f"{_cell(row['mean_iter_s'], row['mean_iter_min_s'], row['mean_iter_max_s'], '.3f', n):>21} "
              f"{1 / row['iter_time_vs_allreduce'] if row['iter_time_vs_allreduce'] else float('nan'):12.2f} "
              f"{_cell(row['tta_s'], row['tta_min_s'], row['tta_max_s'], '.1f', n):>19} "
              f"{1 / row['tta_vs_allreduce'] if row['tta_vs_allreduce'] else float('nan'):11.2f} "
              f"{_cell(row['final_accuracy'], row['final_accuracy_min'], row['final_accuracy_max'], '.3f', n):>21} "
              f"{row['payload_bytes_per_iter'] / 1e6:10.3f} {wire(row) / 1e6:15.3f}")

    efficiency_section("PacTrain section", runs, SHAPED)


def efficiency_section(title: str, runs: list[RunData], rates, key=lambda r: r.label) -> None:
    """Every scheme's efficiency against its own bounds (``benchmarks.bounds``) at ``rates``;
    C from the same scheme's runs at 10 Gbit."""
    by = _group(runs, lambda r: (r.bw, key(r)))
    free = {k: statistics.median(steady_iter_s(r) for r in rs) for (bw, k), rs in by.items() if bw == FREE}
    print(f"\n{title}: each scheme against its own bounds; T = a run's median iteration time after the first "
          f"{WARMUP} (DDP's rebuild, PacTrain's dense start), C = the scheme's T at {FREE} (median over runs), "
          f"W = median busiest bottleneck direction bytes per iteration, R = the rate")
    print(bounds.LEGEND)
    width = max([len(k) for _, k in by] + [6])
    print("DDP's own timers (rank 0, medians): compute = forward + backward, comm = first collective to "
          "last completion, overlap = their overlap")
    print(f"{'rate':>8} {'scheme':<{width}} {bounds.HEADER} {'compute':>7} {'comm':>6} {'overlap':>7}")
    for bw in rates:
        rate = Rate.parse(bw).bps / 8
        for (b, k), rs in by.items():
            if b != bw:
                continue
            w = statistics.median(busiest_bytes_per_iter(r) for r in rs)
            ddp = [median_of(steady(r, key) for r in rs) for key in ("compute_s", "comm_s", "overlap_s")]
            print(f"{bw:>8} {k:<{width}} " + bounds.row([steady_iter_s(r) for r in rs], free.get(k), w, rate)
                  + "".join(f" {x:7.3f}" if x is not None else f" {'-':>7}" for x in ddp))
    if not free:
        print(f"(no runs at {FREE}: no C, no bounds)")


if __name__ == "__main__":
    main()
