"""``powersgd``: torch's PowerSGD hook (low-rank P/Q all-reduces with error feedback).

Vanilla all-reduce runs until ``--powersgd-start-iter`` (torch requires >= 2 because
buckets are rebuilt after iteration 1); then matrices whose rank-r factors are at least 2x
smaller are compressed and the rest are all-reduced as they are.
"""

from dataclasses import dataclass

import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from ._common import Accounting


@dataclass
class PowerSGDCounting(Accounting):
    inner: psgd.PowerSGDState | None = None
    """torch's state (attach sets it)."""
    _after: int = 0  # inner.total_numel_after_compression already counted


def powersgd_hook(state: PowerSGDCounting, bucket) -> torch.futures.Future[torch.Tensor]:
    inner = state.inner
    assert inner is not None  # set by attach
    buf = bucket.buffer()
    if inner.iter < inner.start_powerSGD_iter:  # vanilla all-reduce of the whole bucket
        state.payload_bytes += buf.numel() * buf.element_size()
        return psgd.powerSGD_hook(inner, bucket)
    fut = psgd.powerSGD_hook(inner, bucket)
    # PowerSGD counts P and Q elements plus the uncompressed tensors it all-reduces
    after = inner.total_numel_after_compression
    state.payload_bytes += (after - state._after) * buf.element_size()
    state._after = after
    return fut


def attach(ddp, opts, masks=None) -> PowerSGDCounting:
    inner = psgd.PowerSGDState(process_group=opts.process_group, matrix_approximation_rank=opts.powersgd_rank,
                               start_powerSGD_iter=opts.powersgd_start_iter, random_seed=opts.seed)
    state = PowerSGDCounting(inner=inner)
    ddp.register_comm_hook(state, powersgd_hook)
    return state
