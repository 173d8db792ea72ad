"""The runs behind docs/results/claims.md: one ``testbed sweep`` per claim, then archived.

    sudo python -m benchmarks.claims [--sections tta,prune,prunex,spardl,lr] [--out runs/claims]
                                     [--name three_switch_claims] [--archive claims-DATE]

Every section is a ``testbed sweep`` of the CNN on the bundled digits set across
topologies/three_switch.yaml (8 gloo ranks, two edge switches behind a core switch, the
uplinks shaped), from checkpoints pre-trained for 2 epochs with seed + k for repeat k, with
an evaluation every iteration (off the training clock). Repeat k of every scheme runs back
to back, so the paired ratios of ``testbed report --baseline`` (and of the claims page) set
runs side by side that shared the seed, the checkpoint and the machine's load.

    tta     the PacTrain paper's Fig. 3: allreduce, fp16, topk 0.01 and 0.1 and pactrain 0.5
            (ternary, the default) at 100 Mbit, 500 Mbit and 1 Gbit, 12 epochs, target 0.95,
            5 repeats (at 8 epochs one repeat's all-reduce never held 0.95: its pre-training
            seed's checkpoint needs longer)
    prune   Fig. 6: allreduce and the default pactrain at pruning ratios 0.1 to 0.9 (0.8
            included) at 1 Gbit, 8 epochs, 3 repeats (final accuracy)
    prunex  PruneX's uplink bytes and its rho ablation: allreduce, hier-allreduce and prunex
            at rho 0 and 0.1 at 100 Mbit, 12 epochs (60 iterations: 17 H-SADMM updates
            before the masks are fixed at 30 %), target 0.9, 3 repeats
    spardl  SparDL against the top-k all-gather at the same density (0.01) and like for
            like (top-k at 0.01 / 8, so that the 8 ranks' P*k entries match SparDL's k),
            allreduce for accuracy, at 100 Mbit, 12 epochs, 3 repeats
    lr      one learning rate for every scheme: allreduce, topk 0.01 and pactrain at lr
            0.025, 0.05 and 0.1 at 10 Gbit (the uplinks do not bind: convergence, not
            time), 12 epochs, 2 repeats
    tta_lr  pactrain 0.5 at the learning rate the lr section found best for it (0.1; all-reduce
            and top-k are best at the default 0.05), as the tta section, to pair with its
            all-reduce runs (same seeds and checkpoints; run after them, not back to back)
    eff     docs/results/efficiency.md: allreduce, fp16, topk 0.01 and pactrain 0.5 exact and
            ternary at 10 Gbit (C, the compute bound), 100 Mbit, 500 Mbit and 1 Gbit, 4 epochs
            (20 iterations), an evaluation every 5, 3 repeats
    eff_prunex  the same for allreduce, hier-allreduce and prunex at 10 Gbit, 100 Mbit and
            500 Mbit
    prunex_bn   PruneX on a batch-norm model: allreduce, hier-allreduce and prunex with
            ResNet18 (full width) on 4 ranks, two behind each edge switch, at 1 Gbit, 6 epochs
            (66 iterations), target 0.9, 3 repeats

Each sweep directory's path is printed; with ``--archive NAME`` the sections' sweeps are
archived together into ``docs/results/records/NAME`` (``benchmarks.archive``; the claims
tables find each section's sweep in it by what the sweep ran), and ``python -m
benchmarks.regenerate`` rebuilds the claims page's tables from them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from benchmarks import archive
from benchmarks.paper_sweep import THREE, run_sweep, scaled_topology, testbed_argv

COMMON = ("--epochs", "8", "--target-acc", "0.95", "--eval-every", "1", "--pretrain-epochs", "2")

SECTIONS: dict[str, tuple[str, ...]] = {
    "tta": ("--schemes", "allreduce,fp16,topk:0.01,topk:0.1,pactrain:0.5",
            "--bw", "100mbit,500mbit,1gbit", "--repeats", "5", "--epochs", "12"),
    "prune": ("--schemes", "allreduce,pactrain", "--prune-ratios", "0.1,0.3,0.5,0.7,0.8,0.9",
              "--bw", "1gbit", "--repeats", "3"),
    "prunex": ("--schemes", "allreduce,hier-allreduce,prunex", "--param", "prunex-rho=0,0.1",
               "--bw", "100mbit", "--repeats", "3", "--epochs", "12", "--target-acc", "0.9"),
    "spardl": ("--schemes", "allreduce,topk:0.01,topk:0.00125,spardl", "--bw", "100mbit", "--repeats", "3",
               "--epochs", "12"),
    "lr": ("--schemes", "allreduce,topk:0.01,pactrain", "--param", "lr=0.025,0.05,0.1",
           "--bw", "10gbit", "--repeats", "2", "--epochs", "12"),
    "tta_lr": ("--schemes", "pactrain:0.5", "--param", "lr=0.1", "--bw", "100mbit,500mbit,1gbit",
               "--repeats", "5", "--epochs", "12"),
    "eff": ("--schemes", "allreduce,fp16,topk:0.01,pactrain:0.5:exact,pactrain:0.5:ternary",
            "--bw", "10gbit,100mbit,500mbit,1gbit", "--repeats", "3", "--epochs", "4", "--eval-every", "5"),
    "eff_prunex": ("--schemes", "allreduce,hier-allreduce,prunex", "--bw", "10gbit,100mbit,500mbit",
                   "--repeats", "3", "--epochs", "4", "--eval-every", "5"),
    "prunex_bn": ("--schemes", "allreduce,hier-allreduce,prunex", "--model", "resnet18", "--bw", "1gbit",
                  "--repeats", "3", "--epochs", "6", "--eval-every", "11", "--target-acc", "0.9"),
}
"""Each section's sweep arguments (after COMMON: a later --epochs or --target-acc wins)."""
WORKERS = {"prunex_bn": 4}
"""Sections on fewer than three_switch's 8 workers, half behind each edge switch."""


def sweep(section: str, out: Path, topology: Path) -> Path:
    where = run_sweep([*testbed_argv(), "sweep", *COMMON, *SECTIONS[section], "--out", str(out),
                       "--topology", str(topology), "--json"], section)
    print(f"{section}: {where}", flush=True)
    return where


def _topology(args: argparse.Namespace, workers: int) -> Path:
    """three_switch (or its ``workers``-worker shape) under the name ``--name`` (+ the count)."""
    topo = yaml.safe_load((THREE if workers == 8 else scaled_topology(workers, args.out)).read_text())
    topo["name"] = args.name if workers == 8 else f"{args.name}{workers}"
    topology = args.out / f"{topo['name']}.yaml"
    topology.write_text(yaml.safe_dump(topo, sort_keys=False))
    return topology


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    p.add_argument("--out", type=Path, default=Path("runs/claims"))
    p.add_argument("--name", default="three_switch_claims",
                   help="bring three_switch up under this name (a test's three_switch would clash)")
    p.add_argument("--archive", metavar="NAME",
                   help="archive the sections' sweeps into docs/results/records/NAME (e.g. claims-2026-11-27)")
    args = p.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if not sections or set(sections) - set(SECTIONS):
        p.error(f"--sections: choose from {', '.join(SECTIONS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    dirs = [sweep(s, args.out, _topology(args, WORKERS.get(s, 8))) for s in sections]
    return archive.main([*map(str, dirs), "--name", args.archive]) if args.archive else 0


if __name__ == "__main__":
    sys.exit(main())
