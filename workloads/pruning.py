"""Unstructured pruning of conv/linear/attention weights with one global mask.

* ``magnitude``: keep the largest |w| over all prunable weights together.
* ``grasp`` (Wang et al., 2020, as PacTrain uses it): score = -w * (H g), with g the
  loss gradient and H g a Hessian-gradient product (double backward); the weights with
  the highest scores are removed (those whose removal reduces gradient flow least).

Exactly ``round(ratio * n)`` weights are removed (ties broken by position). The mask is
computed on rank 0 and broadcast, so all ranks hold the same one whatever the data.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

METHODS = ("magnitude", "grasp")


def prunable(model: nn.Module) -> dict[str, torch.Tensor]:
    """Weights of conv, linear and attention layers, by parameter name.

    ``nn.MultiheadAttention`` keeps its Q/K/V projection as ``in_proj_weight`` (or
    ``q/k/v_proj_weight`` when the dimensions differ), not as ``nn.Linear``: without it a
    ViT pruned at 0.5 would still send about 63 % of its dense gradient."""
    out = {}
    for mname, m in model.named_modules():
        prefix = f"{mname}." if mname else ""
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            out[f"{prefix}weight"] = m.weight
        elif isinstance(m, nn.MultiheadAttention):
            for pname in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"):
                w = getattr(m, pname, None)
                if isinstance(w, nn.Parameter):
                    out[prefix + pname] = w
    return out


def _grasp_scores(model: nn.Module, batches, names: list[str]) -> list[torch.Tensor]:
    model = copy.deepcopy(model)  # keep BN statistics and grads of the real model untouched
    model.train()
    params = dict(model.named_parameters())
    ws = [params[n] for n in names]
    g = [torch.zeros_like(w) for w in ws]
    for x, y in batches:  # first pass: g, accumulated without a graph
        grads = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), ws)
        for a, b in zip(g, grads):
            a.add_(b)
    hg = [torch.zeros_like(w) for w in ws]
    for x, y in batches:  # second pass: H g = d/dw (grad(loss) . g)
        grads = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), ws, create_graph=True)
        z = sum((a * b.detach()).sum() for a, b in zip(grads, g))
        if not isinstance(z, torch.Tensor):  # 0: no parameters to score
            raise ValueError("GraSP pruning needs at least one prunable parameter")
        for a, b in zip(hg, torch.autograd.grad(z, ws)):
            a.add_(b)
    return [-(w.detach() * h) for w, h in zip(ws, hg)]


def compute_masks(model: nn.Module, ratio: float, method: str = "magnitude", batches=None,
                  process_group=None, broadcast: bool = True) -> dict[str, torch.Tensor]:
    """Global masks (True = kept) by parameter name; identical on every rank: rank 0's,
    broadcast, or (``broadcast=False``, for callers whose ranks hold identical weights and
    score them deterministically) each rank's own."""
    if not 0 <= ratio < 1:
        raise ValueError(f"--prune-ratio must be in [0, 1), got {ratio}")
    if method not in METHODS:
        raise ValueError(f"unknown --prune-method {method!r}; choose one of: {', '.join(METHODS)}")
    weights = prunable(model)
    names = list(weights)
    n = sum(w.numel() for w in weights.values())
    device = next(iter(weights.values())).device if weights else "cpu"
    flat = torch.empty(n, device=device)  # scores, higher = removed first; filled in place (one copy)
    if method == "magnitude":
        off = 0
        for w in weights.values():
            torch.abs(w.detach().reshape(-1), out=flat[off:off + w.numel()]).neg_()
            off += w.numel()
    else:
        if not batches:
            raise ValueError("GraSP pruning needs at least one batch of training data")
        torch.cat([s.reshape(-1) for s in _grasp_scores(model, batches, names)], out=flat)
    remove = int(round(ratio * n))
    keep = torch.ones(n, dtype=torch.uint8, device=device)
    if remove:
        # keep the n - remove lowest scores: below the (n - remove)-th smallest, and as many
        # of the entries equal to it as make the count exact (ties: the first positions)
        t = flat.kthvalue(n - remove).values
        keep = (flat < t).to(torch.uint8)
        short = (n - remove) - int(keep.sum())
        if short > 0:
            keep[(flat == t).nonzero().squeeze(1)[:short]] = 1
    del flat
    if broadcast and dist.is_initialized():  # rank 0's mask for everyone
        dist.broadcast(keep, src=dist.get_global_rank(process_group, 0) if process_group else 0,
                       group=process_group)
    masks: dict[str, torch.Tensor] = {}
    off = 0
    for name in names:
        w = weights[name]
        masks[name] = keep[off:off + w.numel()].view_as(w).bool()
        off += w.numel()
    return masks


@torch.no_grad()
def apply_masks(model: nn.Module, masks: dict[str, torch.Tensor]) -> None:
    """Zero the pruned weights in place."""
    params = dict(model.named_parameters())
    for n, m in masks.items():
        params[n].mul_(m)
