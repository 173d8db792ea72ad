"""Real training held to a GPU's time against the paper-scale mode at the same time (issue 58,
item 2): the two ways of putting a CPU run in a GPU's regime must agree where both apply.

    sudo python -m benchmarks.gpu_speed [--config 4x2] [--bw 100mbit] [--gpu-time 0.05] [--k 16]
                                        [--iters 10] [--repeats 3] [--scheme allreduce]
                                        [--model cnn] [--record DIR]

Brings up ``RANKSxSWITCHES`` (benchmarks.strong_scaling's layout: ranks behind edge switches
whose uplinks run at ``--bw``), then, in turns within each repeat, runs the built-in trainer
twice at dilation K: ``--gpu-time T`` (real forward and backward held to K x T,
workloads.pacing; real accuracy) and ``--compute-time T`` (the paper-scale mode: the compute
slept, synthetic gradients). Both hand DDP the same buckets on the same schedule, so their
steady iteration times (emulated seconds, the first iteration left out) should agree within 5 %
when the real compute fits its budget; a run that overran is marked so. Prints per mode the
median over the repeats, min-max, and the ratio direct / paper-scale; ``--record DIR`` keeps
the rows for ``benchmarks.archive``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.archive import record
from benchmarks.strong_scaling import parse_configs, topology

MODES = {"direct": "--gpu-time", "paper-scale": "--compute-time"}


def _run(name: str, mode: str, args, out: Path) -> dict:
    """One run on the testbed ``name``: its steady median, overruns and wall seconds."""
    from testbed.runs.experiment import RunRequest, run
    from testbed.runs.spec import WorkloadSpec

    spec = WorkloadSpec.parse(args.scheme, ["--model", args.model, MODES[mode], str(args.gpu_time),
                                            "--max-iters", str(args.iters), "--log-every", "0",
                                            "--eval-every", str(args.iters)])
    t0 = time.monotonic()
    s = run(RunRequest(scheme=args.scheme, spec=spec, testbed=name, out=out, dilation=args.k, exporter=False,
                       cross_traffic=[]))
    recs = [json.loads(x) for x in (Path(s["run_dir"]) / "rank0.jsonl").read_text().splitlines()]
    return {"mode": mode, "median_iter_s": statistics.median(r["iter_s"] for r in recs[1:]),
            "overruns": s.get("overruns"), "dilation_fits": s.get("dilation_fits"), "status": s["status"],
            "proof": s.get("proof"), "final_accuracy": s.get("final_accuracy"), "run_id": s["run_id"],
            "wall_s": time.monotonic() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="4x2")
    p.add_argument("--bw", default="100mbit")
    p.add_argument("--gpu-time", type=float, default=0.05, help="T: the GPU's compute per iteration, seconds")
    p.add_argument("--k", type=float, default=16.0, help="the dilation K (K x T must hold the CPU's real compute)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scheme", default="allreduce")
    p.add_argument("--model", default="cnn")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--record", type=Path, default=None)
    args = p.parse_args()
    from testbed import Testbed, load_topology_dict

    (ranks, switches), = parse_configs(args.config)
    topo = topology(ranks, switches, args.bw)
    topo["name"] = "gs" + topo["name"]
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-speed-"))
    rows: list[dict] = []
    tb = Testbed.up(load_topology_dict(topo))
    try:
        for rep in range(args.repeats):
            for mode in (list(MODES) if rep % 2 == 0 else list(MODES)[::-1]):  # turns: neither always first
                row = {"repeat": rep, **_run(tb.name, mode, args, out)}
                rows.append(row)
                print(f"repeat {rep + 1} {mode}: median {row['median_iter_s'] * 1000:.1f} ms/iteration, "
                      f"overruns {row['overruns']}, {row['wall_s']:.1f} s", flush=True)
    finally:
        tb.down()
    _table(rows, args)
    if args.record:
        record(args.record, "gpu_speed", rows, config=args.config, bw=args.bw, gpu_time_s=args.gpu_time, k=args.k,
               iters=args.iters, scheme=args.scheme, model=args.model)


def _table(rows: list[dict], args) -> None:
    med = {m: statistics.median(r["median_iter_s"] for r in rows if r["mode"] == m) for m in MODES}
    print(f"\n{args.scheme} {args.model}, {args.config} at {args.bw}, T {args.gpu_time} s, K {args.k:g}, "
          f"{args.iters} iterations (first not counted), {args.repeats} repeats")
    print("| mode | median iteration ms | min-max | / paper-scale | overruns |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for m in MODES:
        ts = [r["median_iter_s"] for r in rows if r["mode"] == m]
        over = [r["overruns"] for r in rows if r["mode"] == m and r["overruns"] is not None]
        print(f"| {m} | {med[m] * 1000:.1f} | {min(ts) * 1000:.1f}-{max(ts) * 1000:.1f} | "
              f"{med[m] / med['paper-scale']:.3f} | {sum(over) if over else '-'} |")


if __name__ == "__main__":
    main()
