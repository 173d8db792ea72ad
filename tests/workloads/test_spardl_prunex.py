"""SparDL, PruneX and hier-allreduce across real gloo ranks, against plain references; placement."""

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from tests.workloads.dist_util import run
from tests.workloads.test_schemes import _Bucket
from workloads import placement as pl
from workloads.schemes import SchemeOptions
from workloads.schemes import prunex, spardl


# ---------------------------------------------------------------- placement
def _seen(sizes, switches=None):
    """(GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, switch, host) per rank, domains of ``sizes``."""
    out = []
    for g, n in enumerate(sizes):
        out += [(g, i, n, (switches or [""] * len(sizes))[g], "local") for i in range(n)]
    return out


def test_placement_groups_ranks_by_domain_in_local_rank_order():
    seen = _seen([4, 4], ["s1", "s2"])
    p = pl.build(5, seen)
    assert p.groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and p.names == ("s1", "s2")
    assert p.group_index == 1 and p.local_rank == 1 and p.leaders == (0, 4) and p.equal
    # ranks need not be contiguous: domain order follows GROUP_RANK, members LOCAL_RANK
    p = pl.build(0, [(1, 0, 2, "b", "h"), (0, 1, 2, "a", "h"), (0, 0, 2, "a", "h"), (1, 1, 2, "b", "h")])
    assert p.groups == ((2, 1), (0, 3)) and p.names == ("a", "b") and p.local_rank == 0


@pytest.mark.parametrize("seen,message", [
    ([(0, 0, 2, "", "l"), (0, 0, 2, "", "l")], "LOCAL_RANKs [0, 0]"),
    ([(0, 0, 3, "", "l"), (0, 1, 3, "", "l")], "LOCAL_WORLD_SIZE=3 but 2 ranks"),
    ([(0, 0, 2, "s1", "l"), (0, 1, 2, "s2", "l")], "name different switches"),
])
def test_placement_refuses_inconsistent_launchers(seen, message):
    with pytest.raises(pl.PlacementError, match=message.replace("[", r"\[").replace("]", r"\]")):
        pl.build(0, seen)


def test_spardl_teams_follow_the_domains():
    eq, uneq = pl.build(0, _seen([2, 2])), pl.build(0, _seen([3, 1]))
    assert spardl.teams_for(eq, "auto") == ((0, 1), (2, 3))
    assert spardl.teams_for(eq, "1") == ((0, 1, 2, 3),)
    assert spardl.teams_for(uneq, "auto") == ((0, 1, 2, 3),)
    with pytest.raises(ValueError, match="needs equal domains"):
        spardl.teams_for(uneq, "switch")


# ---------------------------------------------------------------- SparDL
def _published_rounds(p):
    """init_send_info of the authors' allreducer.py: (gap, blocks) per round."""
    n = math.ceil(math.log2(p))
    sizes = [2 ** i for i in range(n - 1)] + ([p - 2 ** (n - 1)] if p - 2 ** (n - 1) > 0 else [])
    sizes = sizes[::-1]
    gap, out = p - sizes[0], []
    for s in sizes:
        out.append((gap, s))
        gap //= 2
    return out


@pytest.mark.parametrize("p", range(2, 17))
def test_reduce_scatter_reaches_every_owner_with_every_contribution(p):
    assert spardl.reduce_scatter_rounds(p) == _published_rounds(p)
    have = [[{r} for _ in range(p)] for r in range(p)]  # have[rank][block] = contributors
    sent = 0
    for gap, count in spardl.reduce_scatter_rounds(p):
        msgs = {r: [have[r][(r + gap + j) % p] for j in range(count)] for r in range(p)}
        sent += count
        for r in range(p):
            for j, c in enumerate(msgs[(r - gap) % p]):
                have[r][(r + j) % p] |= c
    assert sent == p - 1
    assert all(have[r][r] == set(range(p)) for r in range(p))


def _top(block, k):
    idx = block.abs().topk(min(k, block.numel())).indices
    vals = block[idx].clone()
    block[idx] = 0
    return idx, vals


def reference_spardl(accs, density, teams):
    """A plain simulation of SparDL over all ranks at once; (average, residuals)."""
    p, d = len(teams[0]), len(teams)
    world, n = p * d, accs[0].numel()
    b = math.ceil(n / p)
    k = max(1, int(b * density))
    h = max(1, k // d)
    pad = {r: torch.cat([accs[r], torch.zeros(p * b - n)]) for r in range(world)}
    held = {r: pad[r].clone().view(p, b) for r in range(world)}
    for team in teams:
        for gap, count in _published_rounds(p) if p > 1 else []:
            msgs = {}
            for i, r in enumerate(team):
                msgs[i] = [((i + gap + j) % p, *_top(held[r][(i + gap + j) % p], k)) for j in range(count)]
            for i, r in enumerate(team):
                for blk, idx, vals in msgs[(i - gap) % p]:
                    held[r][blk][idx] += vals
    owned = {r: _top(held[r][t.index(r)], h) for t in teams for r in t}
    result, chosen = torch.zeros(p, b), torch.zeros(p, b, dtype=torch.bool)
    for i in range(p):
        for t in teams:
            idx, vals = owned[t[i]]
            result[i][idx] += vals
            chosen[i][idx] = True
    residuals = [torch.where(chosen.view(-1), held[r].view(-1), pad[r])[:n] for r in range(world)]
    return result.view(-1)[:n] / world, residuals


def _spardl(rank, world, teams, density, n):
    torch.manual_seed(1)
    grads = [[torch.randn(n) for _ in range(world)] for _ in range(3)]  # 3 iterations, all ranks'
    params = [nn.Parameter(torch.zeros(n - 7)), nn.Parameter(torch.zeros(7))]
    state = spardl.SparDLState(density=density, teams=teams, world=world, rank=rank)
    ref_res = [torch.zeros(n) for _ in range(world)]
    for it in range(3):
        accs = [ref_res[r] + grads[it][r] for r in range(world)]
        expected, ref_res = reference_spardl(accs, density, teams)
        out = spardl.spardl_hook(state, _Bucket(grads[it][rank].clone(), params)).wait()
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
        mine = state.residuals[tuple(id(q) for q in params)]
        torch.testing.assert_close(mine, ref_res[rank], rtol=1e-5, atol=1e-6)
        # global residual collection: no gradient mass lost over all ranks
        total_res = mine.clone()
        dist.all_reduce(total_res)
        torch.testing.assert_close(total_res + world * out, sum(accs), rtol=1e-5, atol=1e-5)
        assert state.take_payload_bytes() > 0
    if len(teams) > 1:
        return  # with d teams an owner keeps k // d entries per team, so density 1 is not dense
    # density 1: every entry survives, so SparDL is the dense all-reduce and leaves no residual
    dense = spardl.SparDLState(density=1.0, teams=teams, world=world, rank=rank)
    g = grads[0][rank].clone()
    out = spardl.spardl_hook(dense, _Bucket(g.clone(), params)).wait()
    dist.all_reduce(g)
    torch.testing.assert_close(out, g / world, rtol=1e-5, atol=1e-6)
    assert float(dense.residuals[tuple(id(q) for q in params)].abs().max()) == 0.0


@pytest.mark.parametrize("world,teams", [
    (2, ((0, 1),)), (3, ((0, 1, 2),)),
    pytest.param(4, ((0, 1, 2, 3),), marks=pytest.mark.slow), pytest.param(8, (tuple(range(8)),), marks=pytest.mark.slow),
    pytest.param(4, ((0, 1), (2, 3)), marks=pytest.mark.slow),
    pytest.param(8, ((0, 1, 2, 3), (4, 5, 6, 7)), marks=pytest.mark.slow), (3, ((0,), (1,), (2,))),
])
def test_spardl_equals_the_reference_and_loses_no_gradient_mass(world, teams):
    run(_spardl, world, teams, 0.05, 1001)  # 1001: blocks are zero-padded and layers span blocks


def _spardl_bytes(rank, world):
    n, density = 8000, 0.01
    state = spardl.SparDLState(density=density, teams=(tuple(range(world)),), world=world, rank=rank)
    params = [nn.Parameter(torch.zeros(n))]
    spardl.spardl_hook(state, _Bucket(torch.randn(n), params)).wait()
    k = int(n / world * density)
    # reduce-scatter: P - 1 blocks; all-gather: P - 1 blocks; each k x (fp32 + int32)
    assert state.take_payload_bytes() == 2 * (world - 1) * k * 8


def test_spardl_sends_two_times_p_minus_one_blocks_of_k_entries():
    run(_spardl_bytes, 4)


# ---------------------------------------------------------------- hierarchy
def _opts(rank, sizes, **kw):
    return SchemeOptions(placement=pl.build(rank, _seen(sizes)), **kw)


def _hier(rank, world, sizes):
    torch.manual_seed(2)
    n = 300
    grads = [torch.randn(n) for _ in range(world)]
    p1, p2 = nn.Parameter(torch.zeros(200)), nn.Parameter(torch.zeros(100))
    state = prunex._hier_state(prunex.HierState, _opts(rank, sizes))
    flat = sum(grads) / world
    out = prunex.hier_hook(state, _Bucket(grads[rank].clone(), [p1, p2])).wait()
    torch.testing.assert_close(out, flat, rtol=1e-5, atol=1e-6)
    # with masks (shared by all ranks), leaders exchange only the kept elements
    mask = torch.rand(200, generator=torch.Generator().manual_seed(5)) < 0.4
    state.masks = {id(p1): mask}
    state.take_payload_bytes()
    inter0 = state.inter_payload_bytes
    out = prunex.hier_hook(state, _Bucket(grads[rank].clone(), [p1, p2])).wait()
    keep = torch.cat([mask, torch.ones(100, dtype=torch.bool)])
    torch.testing.assert_close(out, flat * keep, rtol=1e-5, atol=1e-6)
    kept_bytes = int(keep.sum()) * 4
    leader = state.rank == state.leader
    inter = state.inter_payload_bytes - inter0
    assert inter == (kept_bytes if leader and len(sizes) > 1 else 0)
    intra = n * 4 if state.intra is not None else 0
    bcast = kept_bytes if leader and state.intra is not None and len(sizes) > 1 else 0
    assert state.take_payload_bytes() == intra + inter + bcast


@pytest.mark.parametrize("sizes", [[1, 1], [2, 1], pytest.param([2, 2], marks=pytest.mark.slow),
                                   pytest.param([4, 4], marks=pytest.mark.slow), [3],
                                   pytest.param([2, 3, 3], marks=pytest.mark.slow)])
def test_hierarchical_allreduce_equals_the_flat_allreduce_of_masked_gradients(sizes):
    run(_hier, sum(sizes), sizes)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)
        self.fc = nn.Linear(8 * 6 * 6, 12)
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        return self.out(torch.relu(self.fc(torch.relu(self.conv(x)).flatten(1))))


def _train_admm(rank, world, rho):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = _Net()
    ddp = DDP(model)
    state = prunex.attach(ddp, _opts(rank, [world], prunex_sparsity=0.5, prunex_rho=rho, prunex_admm_every=2,
                                     prunex_prune_at=0.5, total_iters=12))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(rank)
    outside = None
    for it in range(12):
        x, y = torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 3, (16,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        state.before_step()
        opt.step()
        if it == 5:  # the masks are fixed after this step: how much weight do they remove?
            ws = [l.weight.detach().clone() for l in state.layers]
            rows = state._row_masks(ws)
            outside = sum(float((w * ~m.view(-1, *[1] * (w.dim() - 1))).norm() ** 2) for w, m in zip(ws, rows)) \
                / sum(float(w.norm() ** 2) for w in ws)
        state.after_step(opt)
        if it == 5:
            assert state.fixed
            masks = {k: m.clone() for k, m in state.masks.items()}
    assert all(torch.equal(masks[k], state.masks[k]) for k in masks), "masks fixed once"
    return model, state, outside


def _admm(rank, world):
    _, _, plain = _train_admm(rank, world, 0.0)
    model, state, admm = _train_admm(rank, world, 0.5)
    assert admm < 0.8 * plain, f"ADMM moved weight out of the pruned channels: {admm:.3f} vs {plain:.3f} without"
    # half the output channels of conv and fc are gone (rows and biases), the classifier is whole
    for layer, kept in ((model.conv, 4), (model.fc, 6)):
        rows = layer.weight.reshape(layer.weight.shape[0], -1).abs().sum(1) != 0
        assert int(rows.sum()) == kept and torch.equal(rows, state.masks[id(layer.weight)].reshape(len(rows), -1)[:, 0])
        assert torch.equal(layer.bias != 0, rows)
    assert id(model.out.weight) not in state.masks
    assert state.kept_fraction() == pytest.approx(0.5)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    assert torch.equal(lo, hi), "weights (and so masks) identical on all ranks"


@pytest.mark.slow
def test_prunex_admm_prunes_channels_consistently_and_they_stay_zero():
    run(_admm, 2)
