"""Run a function in N gloo processes on this machine (for tests), and one PruneX training step.

The processes are forked from a server that imported torch once (multiprocessing's
forkserver, preloaded), not spawned: each spawned rank imported torch anew, 1.5 s of CPU,
which on the 2-core machine was most of an equivalence test's time. Every rank is still a
fresh process (no state carried from one test to the next beyond the imports); the server
has started no thread, so forking it is safe.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        # DDP objects sit in reference cycles: free their reducers (and the gloo work they
        # hold) while the group still exists, and let every rank get here, before
        # destroying it. Otherwise gloo can abort at exit ("terminate called without an
        # active exception"), seen once in 6 runs.
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


PRELOAD = ["torch", "torch.distributed", "torch.nn", "torch.multiprocessing", "torch._dynamo", "tests.workloads.dist_util",
           "workloads.schemes"]


def run(fn, world: int, *args) -> None:
    """Raise if any rank raises (its traceback is in the exception)."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts: at the first call
    mp.start_processes(_entry, args=(world, _free_port(), fn, args), nprocs=world, join=True,
                       start_method="forkserver")


def prunex_step(ddp, state, opt, x, y) -> None:
    """One training step as workloads' loop takes it under PruneX: backward (the hook
    exchanges), the ADMM penalty, the optimizer step, then the ADMM updates."""
    opt.zero_grad()
    nn.functional.cross_entropy(ddp(x), y).backward()
    state.before_step()
    opt.step()
    state.after_step(opt)
