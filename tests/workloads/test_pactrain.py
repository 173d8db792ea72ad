"""PacTrain's hook is lossless: after the tracker is stable, the averaged gradient equals
the dense all-reduce of the masked gradients, across DDP's bucket rebuild."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.workloads.dist_util import run
from workloads.schemes.pactrain import PacTrainConfig, PacTrainState, pactrain_hook, ternarize


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10))


def _masks(model, ratio=0.5):
    g = torch.Generator().manual_seed(1)  # identical on every rank
    return {n: torch.rand(p.shape, generator=g) >= ratio for n, p in model.named_parameters() if p.dim() > 1}


def _lossless(rank, world, iters, ternary, stable_iters=2):
    model = _model()
    masks = _masks(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in masks:
                p.mul_(masks[n])
    ref = copy.deepcopy(model)
    ddp = DDP(model, bucket_cap_mb=0.002)  # several buckets after the rebuild at iteration 2
    state = PacTrainState.for_model(model, masks, config=PacTrainConfig(stable_iters=stable_iters, ternary=ternary))
    agreements = []
    agreed = state._agreed
    state._agreed = lambda kept: agreements.append(kept.numel()) or agreed(kept)
    ddp.register_comm_hook(state, pactrain_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(100 + rank)
    dense_bytes = sum(p.numel() * 4 for p in model.parameters())
    kept_bytes = sum(int(masks[n].sum()) * 4 if n in masks else p.numel() * 4 for n, p in model.named_parameters())
    keys_seen = set()
    for it in range(iters):
        x, y = torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        keys_seen |= set(state._buckets)
        payload = state.take_payload_bytes()
        # reference: local gradient of an identical replica, masked, dense all-reduce, averaged
        ref.load_state_dict(model.state_dict())
        ref.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        for (n, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters()):
            g = rp.grad * masks[n] if n in masks else rp.grad.clone()
            dist.all_reduce(g)
            g /= world
            if not ternary:
                torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6, msg=f"iteration {it} {n}")
            elif n in masks:
                assert torch.all(p.grad[~masks[n]] == 0), "masked gradients stay zero"
        if it >= 4:  # rebuilt buckets (iteration 2) stable for 2 iterations: everything compact
            assert state.compact_buckets() == len([k for k in state._buckets if state._buckets[k].kept is not None])
            assert state.compact_buckets() >= 2
            expected = kept_bytes if not ternary else None
            if expected is not None:
                assert payload == expected, (payload, expected, dense_bytes)
            else:
                assert payload < kept_bytes / 3
        opt.step()
    assert len(keys_seen) >= 3, "the first iteration's single bucket and at least two rebuilt ones"
    if stable_iters == 1:  # compact from iteration 1; the rebuilt buckets take over its positions
        assert len(agreements) == 1, "one agreement (the first bucket's), none after DDP's rebuild"
        assert len(state._buckets) == len(keys_seen) - 1, "the bucket DDP rebuilt away is dropped"
    for n, p in model.named_parameters():
        if n in masks:
            assert torch.count_nonzero(p.detach()[~masks[n]]) == 0, f"{n}: masked weights must stay exactly zero"


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_compact_allreduce_equals_dense_allreduce_of_masked_gradients(world):
    run(_lossless, world, 12, False)


@pytest.mark.slow
def test_buckets_rebuilt_from_compact_ones_are_compact_at_once_and_lossless():
    run(_lossless, 3, 8, False, 1)
    run(_lossless, 2, 6, True, 1)


@pytest.mark.slow
def test_ternary_keeps_masked_weights_zero_and_sends_a_quarter():
    run(_lossless, 2, 8, True)


def test_ternarize_is_unbiased():
    torch.manual_seed(0)
    x = torch.randn(2000)
    scale = x.abs().max()
    n = 4000
    g = torch.Generator().manual_seed(5)
    total = torch.zeros_like(x)
    for _ in range(n):
        total += ternarize(x, scale, g).float()
    mean = total / n * scale
    # per element: var(scale * q) = scale*|x| - x^2; the mean of n has std sqrt(var / n)
    std = ((scale * x.abs() - x * x).clamp_min(0) / n).sqrt()
    z = (mean - x) / std.clamp_min(1e-12)
    assert z.abs().max() < 5.5, "no element further than 5.5 sigma"
    assert abs(float(z.mean())) < 0.1, "no systematic bias"
