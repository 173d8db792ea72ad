"""A sweep's wall time as a Slurm job array (``sweep --slurm --wait``) against the same sweep
on one node (``sweep``), measured in one run of this script on the Slurm lab
(:mod:`tests.kernel.slurm_lab`, two nodes). As root::

    sudo python -m benchmarks.slurm_sweep [--rounds 3] [--schemes allreduce,topk,fp16] [--bw 100mbit,500mbit]

Each round runs the local sweep, then the array (no ``--array-limit``: as many at once as
the lab's nodes take, 2 CPUs each with OverSubscribe=FORCE:4), alternating which goes
first; it prints each round's two wall times and their ratio, then the median and the
min-max of the ratios. The runs are ``--compute-time`` runs (a stated compute time, slept):
the lab's two nodes share this machine's cores, so what the array gains here is running the
grid's points side by side, each on its own testbed, not more CPUs. On a real cluster each
element also gets a node's CPUs of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.kernel import slurm_lab

TESTBED = str(Path(sys.executable).parent / "testbed")
TOPOLOGY = """\
name: bsw
nodes:
  s1: {kind: switch}
  w0: {kind: worker}
  w1: {kind: worker}
links:
  - {endpoints: [w0, s1], rate: 100mbit, bottleneck: true}
  - {endpoints: [w1, s1], rate: 100mbit, bottleneck: true}
"""


def _timed(argv: list[str], env: dict) -> float:
    start = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    took = time.monotonic() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed (exit {r.returncode}): {r.stderr.strip()[-600:]}")
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--schemes", default="allreduce,topk,fp16")
    p.add_argument("--bw", default="100mbit,500mbit")
    p.add_argument("--iters", type=int, default=30, help="iterations of each run (--max-iters)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run it as root: it builds the Slurm lab (slurmctld, two slurmd in namespaces)")
    root = Path(tempfile.mkdtemp(prefix="tbslurmlab-"))
    work = Path(tempfile.mkdtemp(prefix="tbslurmbench-"))
    lab = slurm_lab.build(root, 2)
    rows = []
    try:
        (work / "topo.yaml").write_text(TOPOLOGY)
        sweep = [TESTBED, "sweep", "--schemes", args.schemes, "--bw", args.bw, "--compute-time", "0.1",
                 "--max-iters", str(args.iters), "--topology", str(work / "topo.yaml")]
        for k in range(args.rounds):
            took = {}
            for how in (("local", "slurm") if k % 2 == 0 else ("slurm", "local")):
                extra = ["--slurm", "--wait"] if how == "slurm" else []
                took[how] = _timed([*sweep, "--out", str(work / f"{how}-{k}"), *extra], lab.env())
            rows.append({"round": k, "local_s": round(took["local"], 1), "slurm_s": round(took["slurm"], 1),
                         "ratio": round(took["local"] / took["slurm"], 2)})
            if not args.json:
                print(f"round {k}: one node {took['local']:.1f} s, array {took['slurm']:.1f} s, "
                      f"{took['local'] / took['slurm']:.2f}x", flush=True)
    finally:
        slurm_lab.destroy(lab)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    ratios = [r["ratio"] for r in rows]
    points = len(args.schemes.split(",")) * len(args.bw.split(","))
    summary = {"points": points, "rounds": rows, "median_ratio": statistics.median(ratios),
               "min_ratio": min(ratios), "max_ratio": max(ratios)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{points} points, {args.rounds} rounds: the array is {summary['median_ratio']:.2f}x as fast as one node "
              f"(median; min-max {summary['min_ratio']:.2f}-{summary['max_ratio']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
