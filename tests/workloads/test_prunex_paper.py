"""PruneX as its paper builds it: pruned channels output zero (batch norm included), control
traffic counted, the leaders' exchange compacted while the ADMM phase runs."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.workloads.dist_util import prunex_step, run
from workloads import placement as pl
from workloads.models import MODELS, build_model
from workloads.schemes import SchemeOptions
from workloads.schemes import prunex


def _opts(rank, sizes, **kw):
    seen = [(g, i, n, "", "local") for g, n in enumerate(sizes) for i in range(n)]
    return SchemeOptions(placement=pl.build(rank, seen), **kw)


def _bn_models():
    out = []
    for name in MODELS:
        model = build_model(name, 3, 3, width=0.125, depth=1)
        if any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
            out.append((name, model))
    return out


def _bn_outputs(model, x):
    """Every batch norm's output for ``x``, by module."""
    seen, handles = {}, []
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            handles.append(m.register_forward_hook(lambda mod, i, o: seen.__setitem__(mod, o.detach().clone())))
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return seen


def _pruned_channels_are_zero(rank, world):
    models = _bn_models()
    assert {n for n, _ in models} >= {"resnet18", "vgg19"}, "the BN models are found"
    gen = torch.Generator().manual_seed(rank)
    for name, model in models:
        torch.manual_seed(0)
        for m in model.modules():  # a shift > 0: a pruned channel left to its BN outputs ReLU(beta) > 0
            if isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.bias, 0.1, 0.5)
        ddp = DDP(model)
        state = prunex.prunex_state(model, _opts(rank, [1] * world, prunex_sparsity=0.5, prunex_admm_every=1,
                                                 prunex_prune_at=0.5, total_iters=4))
        ddp.register_comm_hook(state, prunex.hier_hook)
        bns = {l.bn: (i, l) for i, l in enumerate(state.layers) if l.bn is not None}
        assert set(bns) == {m for m in model.modules() if isinstance(m, nn.BatchNorm2d)}, f"{name}: every BN paired"
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        for _ in range(4):  # masks fixed after the second step; two more steps must keep them zero
            prunex_step(ddp, state, opt, torch.randn(4, 3, 32, 32, generator=gen),
                        torch.randint(0, 3, (4,), generator=gen))
        assert state.fixed
        x = torch.randn(4, 3, 32, 32, generator=gen)
        for train in (True, False):  # batch statistics, then the running ones
            model.train(train)
            outs = _bn_outputs(model, x)
            for bn, (i, layer) in bns.items():
                dead = ~state.alive[i]
                assert int(dead.sum()) == bn.num_features - layer.keep
                assert float(outs[bn][:, dead].abs().max()) == 0.0, f"{name} {layer.name}: pruned channel not zero"
                assert float(outs[bn][:, ~dead].abs().max()) > 0.0
        model.train()


@pytest.mark.slow
def test_pruned_channels_output_exactly_zero_in_every_bn_model():
    run(_pruned_channels_are_zero, 2)


class _BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(1, 8, 3, bias=False), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        x = torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))
        return self.out(torch.relu(self.fc(x.flatten(1))))


def _checked_hook(log):
    """hier_hook, checked against the dense all-reduce of the masked gradients."""
    def hook(state, bucket):
        ref = bucket.buffer().clone()
        dist.all_reduce(ref)
        kept = state.positions(bucket)
        if kept is not None:
            ref = torch.zeros_like(ref).index_copy_(0, kept, ref.index_select(0, kept))
        before = state.payload_bytes
        fut = prunex.hier_hook(state, bucket)
        torch.testing.assert_close(fut.value(), ref / state.world, rtol=1e-5, atol=1e-6)
        log.append(state.payload_bytes - before)
        return fut
    return hook


def _node_level_z(state):
    """Z = the projection of W + U from this domain's ranks' norms only (counters left alone)."""
    pay, ctl = state.payload_bytes, state.control_bytes
    z, _ = state._project([l.weight.detach() + u for l, u in zip(state.layers, state.U)], group=state.intra)
    state.payload_bytes, state.control_bytes = pay, ctl
    return z


def _dynamic(rank, world, sizes):
    torch.manual_seed(0)
    model = _BNNet()
    ddp = DDP(model)
    total = 16
    state = prunex.prunex_state(model, _opts(rank, sizes, prunex_sparsity=0.5, prunex_rho=1.0, prunex_admm_every=1,
                                             prunex_prune_at=0.75, total_iters=total))
    state.stable = 2
    log = []
    ddp.register_comm_hook(state, _checked_hook(log))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    channels = sum(l.weight.shape[0] for l in state.layers)
    projections, alive_elems = 1, []
    state.take_payload_bytes()
    for it in range(1, total + 1):
        params = [p for l in state.layers for p in l.params()]
        alive_elems.append(sum(p.numel() for p in model.parameters()) - sum(
            int((~state.alive[i]).sum()) * p[0].numel() for i, l in enumerate(state.layers) for p in l.params()))
        assert len(params) == 2 * 3 + 2  # conv (no bias) + BN pair, twice; fc weight and bias
        x, y = torch.randn(8, 1, 8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        state.before_step()
        opt.step()
        hooked = sum(log)
        log.clear()
        ctl = state.control_bytes
        node = _node_level_z(state) if it % state.admm_every == 0 and it < state.prune_at else None
        state.after_step(opt)
        projected = state.control_bytes > ctl
        projections += projected
        assert state.take_payload_bytes() == hooked + (state.control_bytes - ctl), "norm all-reduce counted"
        assert projected == (node is not None or it == state.prune_at)
        if node is not None:  # node-level and global Z coincide
            assert all(torch.equal(a, b) for a, b in zip(node, state.Z)), f"iteration {it}: node-level Z differs"
    assert state.control_bytes == projections * channels * 4
    assert state.admm_updates == projections - 2, "every projection but start's and the fixing one"
    assert state.compaction_events >= 1 and 0 < state.compacted_channels < channels
    assert state.buffer_bytes == [4 * n for n in alive_elems], "the exchange carries exactly the live channels"
    prune_at = state.prune_at
    dense = 4 * sum(p.numel() for p in model.parameters())
    assert state.buffer_bytes[0] == dense and state.dense_iterations == state.buffer_bytes.count(dense)
    assert min(state.buffer_bytes[:prune_at]) < dense, "inter-switch bytes fall before prune_at"
    assert state.buffer_bytes == sorted(state.buffer_bytes, reverse=True), state.buffer_bytes
    assert state.kept_fraction() == 0.5
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    assert torch.equal(lo, hi), "weights identical on all ranks"


@pytest.mark.slow
def test_dynamic_compaction_equals_the_dense_exchange_of_masked_gradients():
    run(_dynamic, 4, [2, 2])


def test_the_summary_reports_dense_iterations_and_control_bytes():
    from workloads import schemes, summary
    from workloads.arguments import parse_args
    from workloads.data import Dataset
    from workloads.loop import Progress

    args = parse_args(["--scheme", "prunex"])
    ds = Dataset("digits", *[torch.zeros(1)] * 4, 10, False)
    prog = Progress(iterations=3, iter_s=[1.0] * 3, payloads=[1] * 3)
    kw = dict(world=1, backend="gloo", progress=prog, totals=summary.Totals(1, 1, 1, 1), per_epoch=3, wall_s=1,
              dense_bytes=1, kept_fraction=0.5, pretrained=None, placement={})
    state = prunex.PruneXState(dense_iterations=2, control_bytes=64, admm_updates=15, admm_every=3,
                               compaction_events=2, compacted_channels=9)
    s = summary.summary(args, schemes.get("prunex"), ds, scheme_stats=state.stats(), **kw)
    assert (s["dense_iterations"], s["control_bytes"]) == (2, 64)
    assert (s["admm_updates"], s["admm_every"], s["compaction_events"], s["compacted_channels"]) == (15, 3, 2, 9)
    s = summary.summary(args, schemes.get("allreduce"), ds, **kw)
    assert (s["dense_iterations"], s["control_bytes"], s["admm_updates"], s["compaction_events"]) == (None,) * 4


@pytest.mark.parametrize("prune_at", [1, 2, 10, 16, 17, 20, 31, 32, 66, 200, 1000])
def test_by_default_at_least_15_admm_updates_happen_before_the_masks_are_fixed(prune_at):
    """admm_every 0: the updates after_step makes (iterations 1 .. prune_at - 1 that are
    multiples of the interval) are at least 15, or one per iteration where fewer fit."""
    every = prunex.admm_interval(0, prune_at)
    updates = sum(it % every == 0 for it in range(1, prune_at))
    assert updates >= min(prunex.MIN_ADMM_UPDATES, prune_at - 1)
    assert every == 1 or updates < 2 * prunex.MIN_ADMM_UPDATES, "no more often than needed"
    assert prunex.admm_interval(7, prune_at) == 7, "a given interval is kept"


def test_the_summary_states_the_teams_spardl_used():
    """``--spardl-d 0`` leaves d to ``--spardl-teams``: the summary says which d ran."""
    from workloads import schemes, summary
    from workloads.arguments import parse_args
    from workloads.data import Dataset
    from workloads.loop import Progress
    from workloads.schemes import spardl

    args = parse_args(["--scheme", "spardl"])
    ds = Dataset("digits", *[torch.zeros(1)] * 4, 10, False)
    prog = Progress(iterations=3, iter_s=[1.0] * 3, payloads=[1] * 3)
    kw = dict(world=4, backend="gloo", progress=prog, totals=summary.Totals(1, 1, 1, 1), per_epoch=3, wall_s=1,
              dense_bytes=1, kept_fraction=None, pretrained=None, placement={})
    state = spardl.SparDLState(density=0.01, teams=((0, 1), (2, 3)), world=4, rank=0)
    s = summary.summary(args, schemes.get("spardl"), ds, scheme_stats=state.stats(), **kw)
    assert s["spardl_teams_used"] == 2
    assert summary.summary(args, schemes.get("allreduce"), ds, **kw)["spardl_teams_used"] is None
