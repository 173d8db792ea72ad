"""PacTrain's mask tracker: records of buckets DDP rebuilt away are freed, ranks that
disagree on a mask are an error naming them, a re-pruned model goes dense and compacts
again, and the checksum exchange is counted as payload."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.workloads.dist_util import run
from tests.workloads.test_pactrain import _masks, _model
from tests.workloads.test_schemes import _Bucket
from workloads.schemes.pactrain import MaskDisagreement, PacTrainConfig, PacTrainState, pactrain_hook

CHECKSUM = 3 * 8  # bytes a rank hands to the agreement's all-gather: three int64 checksums


def _rebuild_frees_old_records(rank, world):
    a, b, c = (nn.Parameter(torch.zeros(n)) for n in (300, 500, 200))
    masks = {id(a): torch.rand(300) < 0.5, id(b): torch.rand(500) < 0.5, id(c): torch.ones(200, dtype=torch.bool)}
    state = PacTrainState(None, masks, PacTrainConfig(stable_iters=3))
    pactrain_hook(state, _Bucket(torch.randn(1000), [a, b, c])).wait()  # iteration 1: one dense bucket
    assert set(state._buckets) == {(id(a), id(b), id(c))}
    # DDP's rebuild: buckets [c, a] and [b]; the old record holds b until b's bucket comes
    pactrain_hook(state, _Bucket(torch.randn(500), [c, a])).wait()
    assert set(state._buckets) == {(id(a), id(b), id(c)), (id(c), id(a))}
    pactrain_hook(state, _Bucket(torch.randn(500), [b])).wait()
    assert set(state._buckets) == {(id(c), id(a)), (id(b),)}, "the pre-rebuild record is freed"
    for _ in range(2):  # stable for 3 iterations: compact, and nothing else is kept
        for bucket in ([c, a], [b]):
            pactrain_hook(state, _Bucket(torch.randn(sum(p.numel() for p in bucket)), bucket)).wait()
    assert state.compact_buckets() == 2 and set(state._buckets) == {(id(c), id(a)), (id(b),)}
    assert {w[0] for w in state._where.values()} == set(state._buckets)


def test_records_of_buckets_rebuilt_away_are_freed():
    run(_rebuild_frees_old_records, 1)


def _disagree(rank, world):
    model = _model()
    masks = _masks(model)
    name = next(iter(masks))
    if rank == 1:  # one rank's mask keeps one entry fewer
        masks[name] = masks[name].clone()
        masks[name].view(-1)[masks[name].view(-1).nonzero()[0]] = False
    params = list(model.parameters())
    state = PacTrainState.for_model(model, masks, config=PacTrainConfig(stable_iters=1))
    buf = torch.cat([p.detach().reshape(-1) for p in params])
    with pytest.raises(MaskDisagreement) as e:
        pactrain_hook(state, _Bucket(buf, params))
    mine = torch.tensor(sum(int(state.masks[id(p)].sum()) for p in params))
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    assert every[0] == every[2] == every[1] + 1
    assert str(e.value).startswith(f"PacTrain: the ranks' pruning masks differ (ranks 0, 2 hold a mask of "
                                   f"{int(every[0])} kept entries; rank 1 holds a mask of {int(every[1])} kept "
                                   "entries)"), str(e.value)
    assert name in str(e.value), "the message names the bucket's parameters"
    # under DDP, the same error comes out of backward on every rank (none hangs)
    ddp = DDP(model, bucket_cap_mb=0.002)
    ddp.register_comm_hook(PacTrainState.for_model(model, masks, config=PacTrainConfig(stable_iters=1)),
                           pactrain_hook)
    with pytest.raises(Exception, match=r"ranks 0, 2 hold .*; rank 1 holds"):
        nn.functional.cross_entropy(ddp(torch.randn(4, 1, 8, 8)), torch.randint(0, 10, (4,))).backward()


@pytest.mark.slow
def test_ranks_whose_masks_differ_are_named_in_an_error():
    run(_disagree, 3)


def _byid(model, masks):
    return {id(p): masks[n] if n in masks else torch.ones_like(p, dtype=torch.bool)
            for n, p in model.named_parameters()}


def _reprune(rank, world):
    model = _model()
    names = dict(model.named_parameters())
    masks = _masks(model, 0.5)
    with torch.no_grad():
        for n, m in masks.items():
            names[n].mul_(m)
    ref = _model()
    ddp = DDP(model, bucket_cap_mb=0.002)  # several buckets after the rebuild at iteration 2
    state = PacTrainState.for_model(model, masks, config=PacTrainConfig(stable_iters=2))
    live = set()

    def hook(s, bucket):
        live.add(s._keys(bucket))
        return pactrain_hook(s, bucket)

    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    dense = sum(p.numel() * 4 for p in model.parameters())
    payloads, compact = [], []
    for it in range(7):
        if it == 4:  # re-prune: other, sparser masks, applied to the weights; the tracker starts over
            masks = {n: m & (torch.rand(m.shape, generator=torch.Generator().manual_seed(7)) < 0.6)
                     for n, m in masks.items()}
            with torch.no_grad():
                for n, m in masks.items():
                    names[n].mul_(m)
            state.reset(_byid(model, masks))
        x, y = torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        live.clear()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        if it >= 1:  # from the rebuild on, only the live buckets have records
            assert set(state._buckets) == live, f"iteration {it}: records of buckets no longer there"
        payloads.append(state.take_payload_bytes())
        compact.append(state.compact_buckets())
        ref.load_state_dict(model.state_dict())
        ref.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        for (n, p), rp in zip(model.named_parameters(), ref.parameters()):
            g = rp.grad * masks[n] if n in masks else rp.grad.clone()
            dist.all_reduce(g)
            torch.testing.assert_close(p.grad, g / world, rtol=1e-5, atol=1e-6, msg=f"iteration {it} {n}")
        opt.step()
        kept = sum(int(masks[n].sum()) * 4 if n in masks else p.numel() * 4 for n, p in names.items())
        if it in (3, 6):  # compact and agreed: exactly the kept entries
            assert compact[-1] == len(live) and payloads[-1] == kept, (it, payloads[-1], kept)
    # iteration 1 (rebuilt buckets, first seen) and 4 (re-pruned) are dense; 2 and 5 compact
    # after the agreement, whose checksums are part of the payload
    assert compact[1] == compact[4] == 0 and payloads[1] == payloads[4] == dense
    for it in (2, 5):
        assert compact[it] == len(live) and payloads[it] == payloads[it + 1] + CHECKSUM * len(live)
    assert payloads[6] < payloads[3] < dense, "the sparser mask sends less"
    # for the summary: iterations 0 (before the rebuild), 1 and 4 sent no bucket compact
    assert state.stats() == {"dense_iterations": 3, "control_bytes": 2 * CHECKSUM * len(live)}


def test_a_repruned_model_goes_dense_then_compacts_again():
    run(_reprune, 2)
