"""Where a ternary exchange's time goes: the scale agreement, the int8 sum, the quantising.

TernGrad-style schemes (``terngrad``, ``pactrain``'s default ternary) agree one float per
layer (the MAX over ranks) before each bucket's int8 all-reduce. Gloo's all-reduce is a
ring, 2 (P - 1) steps whatever the size, so for a few bytes it is all latency;
``workloads.schemes._common.MaxExchange`` takes ceil(log2 P) rounds instead. The second
table sets a whole ternary average (``TernaryReducer.reduce``) of --elements values beside
the fp32 all-reduce of the same values (exact PacTrain's compact all-reduce) and the int8
all-reduce alone: what the quarter of the bytes saves at --bw, and what the agreement and
the quantising cost. The default --elements is the CNN's compact bucket at prune ratio 0.5
(272,378 of its 544,522 parameters), the one ``benchmarks.ternary`` trains.

8 workers on topologies/three_switch.yaml (uplinks at --bw), ``workloads.collective``
launched and accounted for as ``testbed run`` does, each op timed over --iters calls after
a warm-up, one after another in the same testbed. Prints the mean and median per call and
the ratios of the medians. Needs root.

    sudo python -m benchmarks.scale_exchange [--bw 1gbit[,500mbit,...]] [--layers 16] [--elements 272378]
                                             [--iters 200] [--repeats N] [--record DIR]

Several rates (``--bw 1gbit,500mbit,100mbit``) are measured in one testbed, every op at
each rate in turn, and ``--repeats N`` does that N times (the rates taking turns).
``--record DIR`` writes one row per op, rate and repeat (the calls' mean, median and
fastest) to DIR/result.json, which ``python -m benchmarks.archive DIR --name NAME``
archives for docs/results/training.md's table (``benchmarks.training_tables``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from benchmarks.archive import record
from testbed import Testbed, load_topology
from testbed.model.units import Rate
from testbed.runs.experiment import RunRequest, run

THREE = Path(__file__).resolve().parents[1] / "testbed" / "topologies" / "three_switch.yaml"
SCALE_OPS = ("max", "max-dissemination")
VALUE_OPS = ("sum", "sum-int8", "ternary")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bw", default="1gbit", help="the uplinks' rate, or several, comma-separated")
    p.add_argument("--layers", type=int, default=16, help="floats agreed per call (one per layer of a bucket)")
    p.add_argument("--elements", type=int, default=272_378, help="values per call in the second table (0: skip it)")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5, help="calls before the timed ones")
    p.add_argument("--repeats", type=int, default=1, help="measure every rate this many times, taking turns")
    p.add_argument("--record", type=Path, metavar="DIR", help="write every measurement to DIR/result.json")
    args = p.parse_args()
    try:
        rates = [Rate.parse(r) for r in args.bw.split(",")]
    except ValueError as e:
        p.error(f"--bw: {e}")
    if min(args.layers, args.iters, args.repeats) < 1 or args.elements < 0 or args.warmup < 0:
        p.error("--layers, --iters and --repeats must be >= 1, --elements and --warmup >= 0")
    ops = [(op, 4 * args.layers) for op in SCALE_OPS] + [(op, 4 * args.elements) for op in VALUE_OPS if args.elements]
    rows, load = [], os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, Testbed.up(load_topology(THREE)) as tb:
        for k in range(args.repeats):
            for rate in rates:
                res = {}
                for op, size in ops:
                    res[op] = run(RunRequest(
                        scheme="allreduce-only", module="workloads.collective", testbed=tb.name, bw=rate,
                        out=Path(tmp) / f"{op}-{rate}-{k}", exporter=False,
                        workload_args=["--bytes", str(size), "--iters", str(args.iters), "--warmup", str(args.warmup),
                                       "--op", op, "--layers", str(args.layers)]))
                    rows.append({"rate_bps": rate.bps, "repeat": k, "op": op, "bytes": size,
                                 "world_size": res[op]["world_size"], "mean_s": res[op]["mean_iter_s"],
                                 "median_s": res[op]["median_iter_s"], "min_s": res[op]["min_iter_s"]})
                _print(res, args, rate)
    if args.record:
        where = record(args.record, "scale_exchange", rows, layers=args.layers, elements=args.elements,
                       iters=args.iters, warmup=args.warmup, repeats=args.repeats, topology="three_switch",
                       load_before=load, load_after=os.getloadavg()[0])
        print(f"recorded: {where}")


def _print(res: dict, args: argparse.Namespace, rate: Rate) -> None:
    world = res["max"]["world_size"]
    print(f"MAX of {args.layers} floats across {world} ranks on three_switch, uplinks {rate}, {args.iters} calls each")
    _rows(res, SCALE_OPS)
    print(f"  all-reduce / dissemination: mean {_ratio(res, 'max', SCALE_OPS[1], 'mean')}, "
          f"median {_ratio(res, 'max', SCALE_OPS[1], 'median')}")
    if args.elements:
        print(f"{args.elements} values across {world} ranks: fp32 all-reduce, int8 all-reduce, ternary's whole average "
              f"({args.layers} scales)")
        _rows(res, VALUE_OPS)
        med = {op: res[op]["median_iter_s"] * 1e3 for op in ("sum", "sum-int8", "ternary", "max-dissemination")}
        print(f"  int8 / fp32 sum {_ratio(res, 'sum-int8', 'sum', 'median')}, ternary / fp32 sum "
              f"{_ratio(res, 'ternary', 'sum', 'median')} (medians); ternary - int8 sum - dissemination = "
              f"{med['ternary'] - med['sum-int8'] - med['max-dissemination']:.2f} ms of clipping, quantising, "
              f"scaling back and hand-offs", flush=True)


def _rows(res: dict, ops) -> None:
    for op in ops:
        s = res[op]
        print(f"  {op:<18} mean {s['mean_iter_s'] * 1e3:7.2f} ms, median {s['median_iter_s'] * 1e3:7.2f} ms")


def _ratio(res: dict, a: str, b: str, stat: str) -> str:
    return f"{res[a][f'{stat}_iter_s'] / res[b][f'{stat}_iter_s']:.2f}x"


if __name__ == "__main__":
    main()
