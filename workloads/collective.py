"""Time dense all-reduces of a fixed size: the collective alone, no model.

    torchrun --nproc-per-node 2 -m workloads.collective --bytes 10000000 --iters 5 --out runs/ar

``--op max`` times an all-reduce MAX instead, and ``--op max-dissemination`` the
dissemination exchange ternary schemes agree their per-layer scales with on gloo
(``workloads.schemes._common.MaxExchange``): the latency of a small control message.

Each rank writes ``rank{R}.jsonl`` (one record per all-reduce: seconds, payload bytes,
interface counters) and rank 0 ``summary.json`` (the same fields a training run's summary
has where they apply: iterations, mean_iter_s, mean_payload_bytes, world_size), so
``testbed run`` machinery can launch and account for it like training.

``--op sum-int8`` times the int8 sum ternary schemes send (as many int8 values as the fp32
sum has floats) and ``--op ternary`` their whole average (``TernaryReducer.reduce``: clip,
scales, their dissemination, quantising, the int8 sum, scaling back), so the three add up
to where a ternary exchange's time goes against the fp32 one.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from workloads import collectives, records
from workloads.train import init_distributed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workloads.collective", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=10_000_000, help="payload per all-reduce (float32)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--iface", default=None)
    p.add_argument("--op", choices=list(OPS), default="sum",
                   help="all-reduce SUM (default), all-reduce MAX, MAX by dissemination rounds, SUM of "
                        "int8 (--bytes / 4 of them, as many as the fp32 sum's elements), or ternary's whole average "
                        "of --bytes / 4 floats (TernaryReducer)")
    p.add_argument("--layers", type=int, default=1, help="--op ternary: equal segments, one scale each")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.bytes < 4 or args.iters < 1 or args.layers < 1:
        p.error("--bytes must be >= 4, --iters and --layers >= 1")
    collectives.activate()
    rank, world, device, backend = init_distributed(args.backend)
    collectives.training()  # every timed call is the exchange measured
    try:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        iface = records.iface_from_env(args.iface)
        counters = records.IfaceCounters(iface) if iface else None
        x = torch.ones(args.bytes // 4, dtype=torch.float32, device=device)
        payload = _payload(args.op, x.numel(), args.layers)
        collective = OPS[args.op](args)
        log = records.JsonlWriter(out / f"rank{rank}.jsonl")
        times = []
        for i in range(args.warmup + args.iters):
            dist.barrier()
            t0 = time.perf_counter()
            collective(x)
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times.append(dt)
                tx, rx = counters.read() if counters else (None, None)
                log.write({"rank": rank, "iter": len(times), "time": time.time(), "iter_s": dt,
                           "payload_bytes": payload, "tx_bytes": tx, "rx_bytes": rx})
        log.close()
        if rank == 0:
            mean = statistics.fmean(times)
            records.write_json(out / "summary.json", {
                "scheme": "allreduce-only", "op": args.op, "world_size": world, "backend": backend, "iterations": len(times),
                "mean_iter_s": mean, "median_iter_s": statistics.median(times), "min_iter_s": min(times),
                "mean_payload_bytes": payload, "final_payload_bytes": payload, "dense_bytes": payload,
                "payload_bits_per_s": payload * 8 / mean})
        dist.barrier()
    finally:
        collectives.finish()
        dist.destroy_process_group()
    return 0


def _max(args):
    return lambda x: dist.all_reduce(x, op=dist.ReduceOp.MAX)


def _dissemination(args):
    from workloads.schemes._common import MaxExchange
    exchange = MaxExchange(None)
    done: queue.SimpleQueue = queue.SimpleQueue()

    def run(x):
        exchange.submit(x, lambda t, err: done.put(err))
        err = done.get()
        if err is not None:
            raise err
    return run


def _sum_int8(args):
    values: list[torch.Tensor] = []

    def run(x):
        if not values:
            values.append(torch.ones(x.numel(), dtype=torch.int8, device=x.device))
        dist.all_reduce(values[0])
    return run


def _ternary(args):
    """TernaryReducer's whole average of the buffer, in --layers equal segments: the clip and
    scales, their dissemination, the quantising callback, the int8 sum and the scaling back.
    Each call first copies fresh values in (the reducer works in place; about 0.1 ms a MB)."""
    from workloads.schemes._common import TernaryReducer
    reducer = TernaryReducer(None, torch.Generator(device="cpu").manual_seed(dist.get_rank()))
    layers = args.layers
    fresh: list[torch.Tensor] = []

    def run(x):
        n = x.numel()
        if not fresh:
            fresh.append(torch.randn(n, generator=reducer.generator, dtype=x.dtype).to(x.device))
        bounds = [n * j // layers for j in range(layers + 1)]
        segments = [(a, b - a) for a, b in zip(bounds, bounds[1:])]
        fut, _ = reducer.reduce(x.copy_(fresh[0]), segments)
        fut.wait()
    return run


def _payload(op: str, n: int, layers: int) -> int:
    """Bytes a rank hands the collective per call: int8 values (and ternary's scales) or floats."""
    if op == "sum-int8":
        return n
    if op == "ternary":
        return n + 4 * layers
    return 4 * n


OPS = {"sum": lambda args: dist.all_reduce, "max": _max, "max-dissemination": _dissemination,
       "sum-int8": _sum_int8, "ternary": _ternary}


if __name__ == "__main__":
    sys.exit(main())
