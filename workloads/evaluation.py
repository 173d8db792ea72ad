"""Test-set evaluation of a data-parallel model: every rank scores its slice of the test set."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from workloads import data


@torch.no_grad()
def sync_buffers(model: nn.Module, world: int) -> None:
    """Average BN running statistics over ranks (buffers are not broadcast every iteration,
    so that all per-iteration traffic is the scheme's own)."""
    for b in model.buffers():
        if b.is_floating_point():
            dist.all_reduce(b)
            b.div_(world)


@torch.no_grad()
def evaluate(model: nn.Module, ds: data.Dataset, rank: int, world: int, device, batch_size: int = 256):
    """Top-1 accuracy and mean loss over the whole test set; each rank scores its slice."""
    model.eval()
    idx = torch.arange(rank, len(ds.y_test), world)
    stats = torch.zeros(3, dtype=torch.float64, device=device)  # correct, count, loss sum
    for s in range(0, len(idx), batch_size):
        b = idx[s:s + batch_size]
        x, y = ds.x_test[b].to(device), ds.y_test[b].to(device)
        out = model(x)
        stats[0] += (out.argmax(1) == y).sum()
        stats[1] += len(b)
        stats[2] += nn.functional.cross_entropy(out, y, reduction="sum")
    dist.all_reduce(stats)
    model.train()
    return float(stats[0] / stats[1]), float(stats[2] / stats[1])
