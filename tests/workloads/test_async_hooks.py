"""Hooks whose communication overlaps backward: the overlapped hooks (PruneX and its
hierarchical all-reduce, SparDL, ternary PacTrain) give exactly the synchronous hooks'
results over several iterations of several buckets in flight at once, and a hook returns
before its collectives have completed."""

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.workloads.dist_util import prunex_step, run
from tests.workloads.launch import free_port
from tests.workloads.test_schemes import _Bucket
from tests.workloads.test_spardl_prunex import _Net, _opts
from workloads.schemes import prunex, spardl
from workloads.schemes._common import CommThread, TernaryReducer
from workloads.schemes.pactrain import PacTrainConfig, PacTrainState, pactrain_hook

SIZES = (700, 1301, 64)
"""Elements of each bucket (three buckets, in DDP's order)."""


def _params():
    return [[nn.Parameter(torch.zeros(n - 5)), nn.Parameter(torch.zeros(5))] for n in SIZES]


def _grads(rank, iters):
    g = torch.Generator().manual_seed(100 + rank)
    return [[torch.randn(n, generator=g) * (1 + torch.arange(n) % 5) for n in SIZES] for _ in range(iters)]


def _iteration(hook, state, params, grads):
    """Every bucket's hook called in bucket order before any future is waited on, as DDP
    does; the results."""
    futs = [hook(state, _Bucket(g.clone(), ps, i)) for i, (g, ps) in enumerate(zip(grads, params))]
    return [f.wait() for f in futs]


def _same(a, b, what):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"{what}, bucket {i}: overlapped {x[:4].tolist()} vs synchronous {y[:4].tolist()}"


# ---------------------------------------------------------------- thread
def test_comm_thread_runs_works_in_order_and_fails_the_rest_after_an_error():
    comm, order, gate = CommThread("test"), [], threading.Event()
    first = comm.submit(lambda: (gate.wait(5), order.append(1), torch.ones(1))[2])
    second = comm.submit(lambda: (order.append(2), torch.zeros(1))[1])
    assert not first.done() and not second.done()  # the submitter did not wait
    gate.set()
    assert second.wait().item() == 0 and first.wait().item() == 1 and order == [1, 2]
    bad = comm.submit(lambda: 1 / 0)
    after = comm.submit(lambda: torch.ones(1))
    for f in (bad, after):
        with pytest.raises(ZeroDivisionError):
            f.wait()


# ---------------------------------------------------------------- hierarchy
def _hier_equal(rank, world, sizes):
    params, grads = _params(), _grads(rank, 4)
    states = {o: prunex._hier_state(prunex.HierState, _opts(rank, sizes), overlap=o) for o in (True, False)}
    mask_gen = torch.Generator().manual_seed(7)  # the same masks on every rank
    for it, gs in enumerate(grads):
        if it == 2:  # from now on leaders exchange only the kept positions
            masks = {id(p): torch.rand(p.shape, generator=mask_gen) < 0.4 for ps in params for p in ps[:1]}
            for s in states.values():
                s.masks = masks
        outs = {o: _iteration(prunex.hier_hook, s, params, gs) for o, s in states.items()}
        _same(outs[True], outs[False], f"hier iteration {it}")
        for i, g in enumerate(gs):  # and both are the average
            flat = g.clone()
            dist.all_reduce(flat)
            if it >= 2:
                flat[:SIZES[i] - 5] *= masks[id(params[i][0])]
            torch.testing.assert_close(outs[True][i], flat / world, rtol=1e-5, atol=1e-6)
        counts = {o: (s.take_payload_bytes(), s.inter_payload_bytes, s.step_sent) for o, s in states.items()}
        assert counts[True] == counts[False] and counts[True][0] > 0
    _prunex_ddp_equal(rank, sizes)


def _prunex_run(rank, sizes, overlap):
    torch.manual_seed(0)
    model = _Net()
    ddp = DDP(model, bucket_cap_mb=0.002)  # a bucket or so per layer
    state = prunex.prunex_state(model, _opts(rank, sizes, prunex_sparsity=0.5, prunex_rho=0.5, prunex_admm_every=1,
                                             prunex_prune_at=0.5, total_iters=8))
    state.overlap = overlap
    buckets = set()

    def hook(state, bucket):
        buckets.add(bucket.index())
        return prunex.hier_hook(state, bucket)

    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(8):
        prunex_step(ddp, state, opt, torch.randn(8, 1, 8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen))
    assert len(buckets) > 1, "several buckets in flight"
    return [p.detach().clone() for p in model.parameters()], state


def _prunex_ddp_equal(rank, sizes):
    (w1, s1), (w0, s0) = _prunex_run(rank, sizes, True), _prunex_run(rank, sizes, False)
    assert s1.fixed and s1.buffer_bytes[-1] < s1.buffer_bytes[0], "compacted exchange exercised"
    assert s1.buffer_bytes == s0.buffer_bytes and s1.control_bytes == s0.control_bytes
    _same(w1, w0, "PruneX under DDP, weights after 8 steps")


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [[2, 2], [1, 2]])
def test_hierarchical_and_prunex_overlapped_equal_synchronous(sizes):
    run(_hier_equal, sum(sizes), sizes)


# ---------------------------------------------------------------- SparDL
def _spardl_equal(rank, world):
    params, grads = _params(), _grads(rank, 5)
    for teams in (((0, 1), (2, 3)), ((0, 1, 2, 3),)):
        states = {o: spardl.SparDLState(density=0.05, teams=teams, world=world, rank=rank, overlap=o)
                  for o in (True, False)}
        for it, gs in enumerate(grads):
            outs = {o: _iteration(spardl.spardl_hook, s, params, gs) for o, s in states.items()}
            _same(outs[True], outs[False], f"SparDL {len(teams)} teams, iteration {it}")
            assert all(float(o.abs().sum()) > 0 for o in outs[True])
            keys = [tuple(map(id, ps)) for ps in params]
            _same([states[True].residuals[k] for k in keys], [states[False].residuals[k] for k in keys],
                  f"SparDL residuals, iteration {it}")
            assert states[True].h == states[False].h
            assert states[True].take_payload_bytes() == states[False].take_payload_bytes() > 0
        assert len(teams) == 1 or len({h.h for h in states[True].h.values()}) > 1, "h adapted per bucket"


@pytest.mark.slow
def test_spardl_overlapped_equals_synchronous():
    run(_spardl_equal, 4)


# ---------------------------------------------------------------- ternary PacTrain
def _pactrain_state(rank, masks, overlap):
    state = PacTrainState(None, masks, PacTrainConfig(stable_iters=2, ternary=True, overlap=overlap))
    state.ternary = TernaryReducer(None, torch.Generator().manual_seed(rank), 2.5)
    return state


def _pactrain_equal(rank, world):
    params, grads = _params(), _grads(rank, 5)
    gen = torch.Generator().manual_seed(3)  # the same masks on every rank
    masks = {id(p): torch.rand(p.shape, generator=gen) < 0.5 for ps in params for p in ps}
    states = {o: _pactrain_state(rank, masks, o) for o in (True, False)}
    for it, gs in enumerate(grads):
        outs = {o: _iteration(pactrain_hook, s, params, gs) for o, s in states.items()}
        _same(outs[True], outs[False], f"ternary PacTrain iteration {it}")
        for out, ps in zip(outs[True], params):
            kept = torch.cat([masks[id(p)].reshape(-1) for p in ps])
            assert float(out[~kept].abs().max()) == 0.0 and float(out[kept].abs().sum()) > 0
        assert states[True].take_payload_bytes() == states[False].take_payload_bytes()
    assert states[True].compact_buckets() == len(SIZES), "the ternary path ran"


@pytest.mark.slow
def test_ternary_pactrain_overlapped_equals_synchronous():
    run(_pactrain_equal, 3)


# ---------------------------------------------------------------- overlap is real
def _returns_first(rank, world, port):
    """Rank 1 calls its hook only once rank 0's hook has returned and rank 0 has looked at
    its future: until then none of rank 0's collectives can complete, so an overlapped hook
    returns a future not yet done. A hook that waited for its collectives would never
    return, and rank 1 would give up waiting (the test fails, it does not hang)."""
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=30))
    params = _params()
    gen = torch.Generator().manual_seed(3)
    masks = {id(p): torch.rand(p.shape, generator=gen) < 0.5 for ps in params for p in ps}
    hooks = {
        "hier-allreduce": lambda o: (prunex.hier_hook, prunex._hier_state(prunex.HierState, _opts(rank, [1, 1]),
                                                                          overlap=o)),
        "spardl": lambda o: (spardl.spardl_hook, spardl.SparDLState(density=0.05, teams=((0, 1),), world=world,
                                                                    rank=rank, overlap=o)),
        "ternary pactrain": lambda o: (pactrain_hook, _pactrain_state(rank, masks, o)),
    }
    for name, make in hooks.items():
        for overlap in (False, True):
            hook, state = make(overlap)
            gs = _grads(rank, 3)
            for it in range(2):  # PacTrain's tracker agrees its masks (a blocking all-gather) here
                _iteration(hook, state, params, gs[it])
            gate = f"{name} {overlap}"
            if rank == 1 and overlap:
                store.wait([gate])  # rank 0's hook has returned
            fut = hook(state, _Bucket(gs[2][0].clone(), params[0], 0))
            if rank == 0:
                done = fut.done()
                if overlap:
                    store.set(gate, "returned")
                assert done is not overlap, \
                    f"{name}, overlap={overlap}: the future was {'' if done else 'not '}done when the hook returned"
            assert float(fut.wait().abs().sum()) > 0


def test_the_hook_returns_before_its_collectives_complete():
    run(_returns_first, 2, free_port())
