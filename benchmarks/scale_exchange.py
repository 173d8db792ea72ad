"""Latency of agreeing ternary scales: gloo's ring all-reduce MAX against dissemination.

TernGrad-style schemes (``terngrad``, ``pactrain:R:ternary``) agree one float per layer
(the MAX over ranks) before each bucket's int8 all-reduce. Gloo's all-reduce is a ring,
2 (P - 1) steps whatever the size, so for a few bytes it is all latency;
``workloads.schemes._common.MaxExchange`` takes ceil(log2 P) rounds instead. 8 workers
on topologies/three_switch.yaml (uplinks at --bw), ``workloads.collective`` launched and
accounted for as ``testbed run`` does, each op timed over --iters calls after a warm-up,
one after another in the same testbed. Prints the mean and median per call and the ratio.
Needs root.

    sudo python -m benchmarks.scale_exchange [--bw 1gbit] [--layers 16] [--iters 200]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from testbed import Testbed, load_topology
from testbed.runs.experiment import RunRequest, run
from testbed.model.units import Rate

THREE = Path(__file__).resolve().parents[1] / "testbed" / "topologies" / "three_switch.yaml"
OPS = ("max", "max-dissemination")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bw", default="1gbit", help="the uplinks' rate")
    p.add_argument("--layers", type=int, default=16, help="floats agreed per call (one per layer of a bucket)")
    p.add_argument("--iters", type=int, default=200)
    args = p.parse_args()
    rate = Rate.parse(args.bw)
    res = {}
    with tempfile.TemporaryDirectory() as tmp, Testbed.up(load_topology(THREE)) as tb:
        for op in OPS:
            s = run(RunRequest(scheme="allreduce-only", module="workloads.collective", testbed=tb.name, bw=rate,
                               out=Path(tmp) / op, exporter=False,
                               workload_args=["--bytes", str(4 * args.layers), "--iters", str(args.iters),
                                              "--warmup", "5", "--op", op]))
            res[op] = s
    print(f"MAX of {args.layers} floats across {res['max']['world_size']} ranks on three_switch, uplinks {rate}, "
          f"{args.iters} calls each")
    for op in OPS:
        print(f"  {op:<18} mean {res[op]['mean_iter_s'] * 1e3:6.2f} ms, median {res[op]['median_iter_s'] * 1e3:6.2f} ms")
    print(f"  all-reduce / dissemination: mean {res['max']['mean_iter_s'] / res[OPS[1]]['mean_iter_s']:.2f}x, "
          f"median {res['max']['median_iter_s'] / res[OPS[1]]['median_iter_s']:.2f}x")


if __name__ == "__main__":
    main()
