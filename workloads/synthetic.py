"""``--compute-time``: paper-scale traffic without the compute (a stated time per iteration
instead of forward and backward, real parameters, buckets, hooks and collectives)."""

from __future__ import annotations

import time

import torch
import torch.nn as nn


class _SyntheticGrad(torch.autograd.Function):
    """Backward of one parameter's term: wait its share of the stated backward time, then
    hand over the synthetic gradient (DDP's hooks see it as they would a real one)."""

    @staticmethod
    def forward(ctx, p, grad, delay):
        ctx.grad, ctx.delay = grad, delay
        return p.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        if ctx.delay > 0:
            time.sleep(ctx.delay)
        return ctx.grad, None, None


class SyntheticCompute(nn.Module):
    """Paper-scale traffic without the compute: wraps the real model (its parameters, hence
    DDP's buckets, are real) and replaces forward and backward by a stated time.

    Forward sleeps a third of ``seconds``; backward spends the other two thirds, spread over
    the parameters in proportion to their size, and makes the gradients ready one parameter
    at a time in reverse order, as a real backward pass does, so DDP launches each bucket's
    collective while later "compute" is still under way. Gradients are seeded random values
    (different per rank), views of one pool the size of the largest parameter. Sleeping is
    what a GPU's compute looks like to the CPU: the communication threads run meanwhile.
    """

    def __init__(self, model: nn.Module, seconds: float, seed: int):
        super().__init__()
        self.model = model
        self.seconds = seconds
        params = [p for p in model.parameters() if p.requires_grad]
        total = sum(p.numel() for p in params)
        pool = torch.randn(max(p.numel() for p in params), generator=torch.Generator().manual_seed(seed)) * 1e-2
        self._grads = [pool[:p.numel()].view_as(p).to(p.device) for p in params]
        self._delays = [2 * seconds / 3 * p.numel() / total for p in params]
        self._params = params

    def forward(self) -> torch.Tensor:
        if self.seconds > 0:
            time.sleep(self.seconds / 3)
        # terms made in parameter order: autograd runs the later ones first (reverse order)
        return torch.stack([_SyntheticGrad.apply(p, g, d) for p, g, d in
                            zip(self._params, self._grads, self._delays)]).sum()
