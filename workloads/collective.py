"""Time dense all-reduces of a fixed size: the collective alone, no model.

    torchrun --nproc-per-node 2 -m workloads.collective --bytes 10000000 --iters 5 --out runs/ar

``--op max`` times an all-reduce MAX instead, and ``--op max-dissemination`` the
dissemination exchange ternary schemes agree their per-layer scales with on gloo
(``workloads.schemes._common.MaxExchange``): the latency of a small control message.

Each rank writes ``rank{R}.jsonl`` (one record per all-reduce: seconds, payload bytes,
interface counters) and rank 0 ``summary.json`` (the same fields a training run's summary
has where they apply: iterations, mean_iter_s, mean_payload_bytes, world_size), so
``testbed run`` machinery can launch and account for it like training.
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

from workloads import records
from workloads.train import init_distributed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workloads.collective", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=10_000_000, help="payload per all-reduce (float32)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--iface", default=None)
    p.add_argument("--op", choices=["sum", "max", "max-dissemination"], default="sum",
                   help="all-reduce SUM (default), all-reduce MAX, or MAX by dissemination rounds")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.bytes < 4 or args.iters < 1:
        p.error("--bytes must be >= 4 and --iters >= 1")
    rank, world, device, backend = init_distributed(args.backend)
    try:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        iface = records.iface_from_env(args.iface)
        counters = records.IfaceCounters(iface) if iface else None
        x = torch.ones(args.bytes // 4, dtype=torch.float32, device=device)
        payload = x.numel() * 4
        collective = _collective(args.op)
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
        dist.destroy_process_group()
    return 0


def _collective(op: str):
    if op == "sum":
        return dist.all_reduce
    if op == "max":
        return lambda x: dist.all_reduce(x, op=dist.ReduceOp.MAX)
    from workloads.schemes._common import MaxExchange
    exchange = MaxExchange(None)
    done: queue.SimpleQueue = queue.SimpleQueue()

    def run(x):
        exchange.submit(x, lambda t, err: done.put(err))
        err = done.get()
        if err is not None:
            raise err
    return run


if __name__ == "__main__":
    sys.exit(main())
