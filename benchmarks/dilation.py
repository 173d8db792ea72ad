"""Time dilation against no dilation, measured in one command (issue 45).

    sudo python -m benchmarks.dilation [--config 8x2] [--bw 100mbit] [--compute 0.1] [--iters 10]
                                       [--ks 1,2,4] [--repeats 2] [--scheme allreduce] [--model cnn]
                                       [--out /tmp/dilation]

Brings up ``RANKSxSWITCHES`` (benchmarks.strong_scaling's layout: ranks behind edge
switches whose uplinks to one core switch run at ``--bw``), then runs the same
``--compute-time`` run at every K of ``--ks``, the K taking turns within each repeat so that
all see the same machine. Prints per K the median steady iteration time in emulated seconds
(the first iteration left out) over the repeats, min-max, its ratio to K = 1's, and the
wall-clock seconds the runs took. Where the undilated run is not CPU-bound (8 ranks at 100
Mbit) the ratios stay within 5 % of 1; where it is (many ranks, fast links), the time falls
with K until the machine's overheads no longer count, which is what ``--dilation auto`` finds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.strong_scaling import parse_configs, topology


def _run(name: str, k: float, args, out: Path) -> tuple[float, float]:
    """One run at K on the testbed ``name``: (median steady iteration s, wall-clock s)."""
    from testbed.runs.experiment import RunRequest, run
    from testbed.runs.spec import WorkloadSpec

    spec = WorkloadSpec.parse(args.scheme, ["--model", args.model, "--compute-time", str(args.compute),
                                            "--max-iters", str(args.iters), "--log-every", "0"])
    t0 = time.monotonic()
    s = run(RunRequest(scheme=args.scheme, spec=spec, testbed=name, out=out, dilation=k, exporter=False,
                       cross_traffic=[]))
    wall = time.monotonic() - t0
    recs = [json.loads(x) for x in (Path(s["run_dir"]) / "rank0.jsonl").read_text().splitlines()]
    return statistics.median(r["iter_s"] for r in recs[1:]), wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="8x2")
    p.add_argument("--bw", default="100mbit")
    p.add_argument("--compute", type=float, default=0.1, help="--compute-time per iteration (emulated seconds)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--ks", default="1,2,4")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scheme", default="allreduce")
    p.add_argument("--model", default="cnn")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    from testbed import Testbed, load_topology_dict

    (ranks, switches), = parse_configs(args.config)
    topo = topology(ranks, switches, args.bw)
    topo["name"] = "dil" + topo["name"]
    ks = [float(k) for k in args.ks.split(",")]
    out = args.out or Path(tempfile.mkdtemp(prefix="dilation-"))
    times: dict[float, list[float]] = {k: [] for k in ks}
    walls: dict[float, list[float]] = {k: [] for k in ks}
    tb = Testbed.up(load_topology_dict(topo))
    try:
        for rep in range(args.repeats):
            for k in (ks if rep % 2 == 0 else ks[::-1]):  # turns: neither K always goes first
                t, wall = _run(tb.name, k, args, out)
                times[k].append(t)
                walls[k].append(wall)
                print(f"repeat {rep + 1} K {k:g}: median {t * 1000:.1f} ms/iteration, {wall:.1f} s", flush=True)
    finally:
        tb.down()
    base = statistics.median(times[ks[0]])
    print(f"\n{args.scheme} {args.model}, {args.config} at {args.bw}, --compute-time {args.compute} s, "
          f"{args.iters} iterations (first not counted), {args.repeats} repeats; records in {out}")
    print("| K | median iteration ms | min-max | / K=1 | wall s per run |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for k in ks:
        m = statistics.median(times[k])
        print(f"| {k:g} | {m * 1000:.1f} | {min(times[k]) * 1000:.1f}-{max(times[k]) * 1000:.1f} | "
              f"{m / base:.3f} | {statistics.median(walls[k]):.1f} |")


if __name__ == "__main__":
    main()
