"""gTop-k (issue 58, item 5: a baseline of SparDL's paper): in real gloo processes every rank
ends with the same global top-k, which is the top-k of the sum of the ranks' selections,
at a power-of-two world and one that folds; error feedback keeps what was not applied."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from tests.workloads import dist_util
from workloads.schemes.gtopk import GTopKState, global_topk, merge


def test_merge_adds_where_positions_meet_keeps_the_largest_and_breaks_ties_by_position():
    v, p = merge(torch.tensor([1.0, -3.0, 2.0, 2.0, 0.5]), torch.tensor([4, 7, 1, 4, 9]), 3)
    assert p.tolist() == [4, 7, 1] and v.tolist() == [3.0, -3.0, 2.0]  # |3| = |-3|: the lower position first
    a = (torch.tensor([1.0, 2.0]), torch.tensor([5, 6]))
    b = (torch.tensor([2.0, 1.0]), torch.tensor([6, 5]))
    one = merge(torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]]), 1)
    two = merge(torch.cat([b[0], a[0]]), torch.cat([b[1], a[1]]), 1)
    assert one[1].tolist() == two[1].tolist() == [6] and one[0].tolist() == two[0].tolist() == [4.0]


def _selection(rank: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(n, generator=g)
    idx = x.abs().topk(k).indices
    return x[idx], idx


def _check(rank: int, world: int, n: int, k: int) -> None:
    state = GTopKState(ratio=k / n, rank=rank, world=world)
    values, positions = global_topk(state, *_selection(rank, n, k), k)
    # the reference: the same pairwise merges, done here over every rank's selection
    sets = [_selection(r, n, k) for r in range(world)]
    m = 1 << (world.bit_length() - 1)
    for r in range(m, world):
        sets[r - m] = merge(torch.cat([sets[r - m][0], sets[r][0]]), torch.cat([sets[r - m][1], sets[r][1]]), k)
    sets = sets[:m]
    bit = 1
    while bit < m:
        sets = [merge(torch.cat([sets[r][0], sets[r ^ bit][0]]), torch.cat([sets[r][1], sets[r ^ bit][1]]), k)
                for r in range(m)]
        bit <<= 1
    assert positions.tolist() == sets[0][1].tolist() and torch.equal(values, sets[0][0])
    gathered = [torch.empty_like(positions) for _ in range(world)]
    dist.all_gather(gathered, positions)
    assert all(g.tolist() == positions.tolist() for g in gathered)  # every rank holds the same
    rounds = m.bit_length() - 1
    sends = rounds + (1 if rank < world - m else 0) if rank < m else 1  # a folding pair: one more send each
    assert state.payload_bytes == 8 * k * sends


@pytest.mark.parametrize("world", [4, 3])
def test_every_rank_ends_with_the_same_global_top_k(world):
    dist_util.run(_check, world, 1000, 10)


def _train_step(rank: int, world: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(50, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    from workloads.schemes import gtopk

    state = gtopk.attach(ddp, type("O", (), {"process_group": None, "topk_ratio": 0.05})())
    x = torch.randn(8, 50, generator=torch.Generator().manual_seed(rank))
    ddp(x).square().mean().backward()
    grads = torch.cat([p.grad.view(-1) for p in model.parameters()])
    n = grads.numel()
    k = max(1, math.ceil(0.05 * n))
    assert int((grads != 0).sum()) <= k  # only the global top-k was applied
    residual = next(iter(state.residuals.values()))
    assert int((residual != 0).sum()) >= n - k  # the rest waits in the residual
    assert state.take_payload_bytes() == 8 * k * (world.bit_length() - 1)


def test_a_ddp_step_applies_k_entries_and_keeps_the_rest_for_later():
    dist_util.run(_train_step, 2)


@pytest.mark.slow
def test_gtopk_trains_three_ranks_to_90_percent_on_digits(tmp_path):
    """Three ranks: one folds into the recursive doubling of the other two."""
    from tests.workloads.launch import train

    r = train(3, tmp_path / "run", "--scheme", "gtopk", "--dataset", "digits", "--model", "cnn", "--epochs", "12",
              "--target-acc", "0.9", "--stop-at-target", "--log-every", "0")
    assert r.ok, r.logs
    s = r.summary()
    assert s["final_accuracy"] >= 0.9 and s["scheme"] == "gtopk" and s["topk_ratio"] == 0.01, s
    assert max(x["payload_bytes"] for k in range(3) for x in r.iters(k)[-1:]) < s["dense_bytes"] / 20
