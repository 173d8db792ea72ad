"""Schemes' arithmetic across real gloo ranks; pruning masks; the registry."""

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from tests.workloads.dist_util import run
from tests.workloads.launch import train
from workloads import pruning, schemes
from workloads.schemes._common import MaxExchange, TernaryReducer
from workloads.schemes.topk import TopKState, topk_hook


class _Bucket:
    """Stand-in for dist.GradBucket in unit tests of a hook's arithmetic."""

    def __init__(self, buf, params, index=0):
        self._buf, self._params, self._index = buf, params, index

    def buffer(self):
        return self._buf

    def parameters(self):
        return self._params

    def gradients(self):  # views into the buffer, in the parameters' order, as DDP's are
        return list(torch.split(self._buf, [p.numel() for p in self._params]))

    def index(self):
        return self._index


def _topk(rank, world):
    torch.manual_seed(0)
    n, ratio, k = 1000, 0.01, 10
    grads = [torch.randn(n) for _ in range(world)]  # every rank knows every rank's gradient
    params = [nn.Parameter(torch.zeros(n))]
    state = TopKState(ratio=ratio)
    residuals = [torch.zeros(n) for _ in range(world)]
    for it in range(4):
        buf = grads[rank].clone() * (it + 1)
        out = topk_hook(state, _Bucket(buf, params)).wait()
        expected = torch.zeros(n)
        for r in range(world):
            acc = residuals[r] + grads[r] * (it + 1)
            idx = acc.abs().topk(k).indices
            expected[idx] += acc[idx]
            acc[idx] = 0
            residuals[r] = acc
        torch.testing.assert_close(out, expected / world)
        torch.testing.assert_close(state.residuals[(id(params[0]),)], residuals[rank])
        assert state.take_payload_bytes() == k * 8  # fp32 values + int32 positions


def test_topk_sends_k_values_and_positions_and_keeps_the_rest_as_error_feedback():
    run(_topk, 2)


def _topk_rebuild(rank, world):
    """DDP's bucket rebuild regroups and reorders parameters: each keeps its residual."""
    a, b, c = (nn.Parameter(torch.zeros(n)) for n in (300, 500, 200))
    state = TopKState(ratio=0.01)
    g1 = torch.randn(1000)
    topk_hook(state, _Bucket(g1.clone(), [a, b, c])).wait()  # iteration 1: one bucket a|b|c
    before = state.residuals[(id(a), id(b), id(c))].clone()
    res = {"a": before[:300], "b": before[300:800], "c": before[800:]}
    assert before.abs().sum() > 0
    # iteration 2: buckets [c, a] and [b]; zero gradients, so each residual alone decides top-k
    topk_hook(state, _Bucket(torch.zeros(500), [c, a], index=0)).wait()
    assert (id(a), id(b), id(c)) in state.residuals  # b has not moved yet: the old bucket stays
    topk_hook(state, _Bucket(torch.zeros(500), [b], index=1)).wait()
    assert set(state.residuals) == {(id(c), id(a)), (id(b),)}  # then it is freed
    for new, parts in (((id(c), id(a)), ("c", "a")), ((id(b),), ("b",))):
        acc = torch.cat([res[x] for x in parts])
        acc[acc.abs().topk(5).indices] = 0  # what this iteration sent (k = 5 of 500)
        torch.testing.assert_close(state.residuals[new], acc)


def test_topk_residuals_survive_the_bucket_rebuild():
    run(_topk_rebuild, 1)


def _terngrad_unbiased_per_layer(rank, world, vectorise=False):
    # two layers five orders of magnitude apart: with one scale per layer the small one is
    # quantised against its own maximum, not the large layer's
    torch.manual_seed(0)
    n_el = 300
    segments = [(0, n_el), (n_el, n_el)]
    xs = [torch.cat([torch.randn(n_el) * 1e-3 * (r + 1), torch.randn(n_el) * 10 * (r + 1)]) for r in range(world)]
    target = sum(xs) / world
    reducer = TernaryReducer(None, torch.Generator().manual_seed(10 + rank), clip=0)
    reducer.vectorise = vectorise
    n = 1500
    total, total_sq = torch.zeros(2 * n_el, dtype=torch.float64), torch.zeros(2 * n_el, dtype=torch.float64)
    for _ in range(n):
        fut, sent = reducer.reduce(xs[rank].clone(), segments)
        v = fut.wait().double()
        total += v
        total_sq += v * v
    assert sent == 2 * 4 + 2 * n_el  # a float32 scale per layer + int8 values
    for off, m in segments:
        sl = slice(off, off + m)
        scale = max(float(x[sl].abs().max()) for x in xs)
        var = sum((scale * x[sl].abs() - x[sl] ** 2).clamp_min(0) for x in xs).double() / world ** 2
        mean = total[sl] / n
        z = (mean - target[sl]) / (var / n).sqrt().clamp_min(1e-30)
        assert z.abs().max() < 5.5 and abs(float(z.mean())) < 0.15, f"layer at {off}: mean converges to the mean"
        emp = total_sq[sl] / n - mean ** 2
        ratio = float(emp.sum() / var.sum())
        assert 0.85 < ratio < 1.15, f"layer at {off}: variance {ratio:.3f} x the per-layer prediction"


@pytest.mark.slow
@pytest.mark.parametrize("vectorise", [False, True], ids=["loop", "whole-buffer"])
def test_terngrad_is_unbiased_per_layer_with_per_layer_variance(vectorise):
    run(_terngrad_unbiased_per_layer, 2, vectorise)


def _ternary_does_not_wait_for_peers(rank, world):
    # rank 1 calls reduce only after rank 0's reduce has returned: a blocking scale
    # exchange would deadlock here (the store wait times out and the test fails)
    store = dist.distributed_c10d._get_default_store()
    reducer = TernaryReducer(None, torch.Generator().manual_seed(rank), clip=2.5)
    futs = []
    for b in range(3):  # three buckets in a row, none awaited before the last is issued
        if rank == 1:
            store.wait([f"returned-{b}"], __import__("datetime").timedelta(seconds=20))
        x = torch.full((100,), float(b + 1))
        futs.append(reducer.reduce(x, [(0, 50), (50, 50)])[0])
        if rank == 0:
            store.set(f"returned-{b}", "1")
    for b, f in enumerate(futs):
        # identical values everywhere: clipping keeps them (std 0), each rounds to 1 with
        # probability 1, the average is exact
        torch.testing.assert_close(f.wait(), torch.full((100,), float(b + 1)))


def test_ternary_scale_exchange_does_not_stall_the_caller():
    run(_ternary_does_not_wait_for_peers, 2)


def _max_exchange(rank, world):
    import queue
    exchange = MaxExchange(dist.new_group())
    assert exchange.group is not None
    done: queue.SimpleQueue = queue.SimpleQueue()
    gen = torch.Generator().manual_seed(7)  # every rank draws every rank's tensors
    wanted = []
    for b in range(5):  # several in flight, of different lengths, none awaited in between
        everyone = torch.randn(world, 3 + b, generator=gen)
        wanted.append(everyone.amax(0))
        exchange.submit(everyone[rank].clone(), lambda t, err, b=b: done.put((b, t, err)))
    for b in range(5):
        got_b, t, err = done.get(timeout=30)
        assert (got_b, err) == (b, None), "callbacks in submission order, without error"
        assert torch.equal(t, wanted[b]), (rank, b, t, wanted[b])


@pytest.mark.parametrize("world", [1, 2, 3, pytest.param(5, marks=pytest.mark.slow),
                                   pytest.param(8, marks=pytest.mark.slow)])
def test_scale_exchange_is_the_max_over_ranks_for_any_world_size(world):
    run(_max_exchange, world)


def _terngrad_clips_per_layer(rank, world):
    reducer = TernaryReducer(None, torch.Generator().manual_seed(rank), clip=2.5)
    torch.manual_seed(3)
    x = torch.cat([torch.randn(1000), torch.randn(1000) * 100])
    x[10] = 1e4  # an outlier in the first layer
    std0, std1 = float(x[:1000].std()), float(x[1000:].std())
    scales = reducer._clip_and_scale(x, [(0, 1000), (1000, 1000)])
    assert float(scales[0]) == pytest.approx(2.5 * std0, rel=1e-5), "the outlier is clipped to 2.5 sigma"
    assert float(scales[1]) <= 2.5 * std1 * (1 + 1e-5)
    assert float(x[10]) == pytest.approx(2.5 * std0, rel=1e-5)


def test_terngrad_clips_each_layer_to_its_own_deviation():
    run(_terngrad_clips_per_layer, 1)


def _vectorised_matches_the_per_layer_loop(rank, world):
    reducer = TernaryReducer(None, torch.Generator().manual_seed(rank), clip=2.5)
    reducer.vectorise = True  # the GPU's path, here on CPU
    torch.manual_seed(4)
    # layers of very different scales, an empty one (a fully pruned layer in PacTrain's
    # compact buffer), a single entry and a constant layer (neither is clipped)
    parts = [torch.randn(700) * 1e-3, torch.randn(0), torch.randn(1) * 5, torch.full((40,), 0.25),
             torch.randn(3000) * 10, torch.randn(9)]
    parts[4][17] = 1e5
    segs, off = [], 0
    for t in parts:
        segs.append((off, t.numel()))
        off += t.numel()
    x = torch.cat(parts)
    a, b = x.clone(), x.clone()
    fast, slow = reducer._clip_and_scale(a, segs), reducer._clip_and_scale_loop(b, segs)
    assert torch.allclose(fast, slow, rtol=1e-5, atol=0) and torch.allclose(a, b, rtol=1e-5, atol=0)
    assert float(fast[1]) == 0 and float(fast[2]) == pytest.approx(abs(float(x[700])))
    assert torch.equal(a[701:741], x[701:741]), "a constant layer is left alone"
    per = reducer._per_element(fast, a, segs)
    assert per is not None and torch.equal(per, torch.cat([fast[j].expand(n) for j, (_, n) in enumerate(segs)]))
    # segments that do not tile the buffer from 0 take the loop
    assert reducer._per_element(fast[:2], a, [(5, 3), (0, 5)]) is None


def test_vectorised_per_layer_clip_and_scale_equal_the_per_layer_loop():
    run(_vectorised_matches_the_per_layer_loop, 1)


def test_registry_lists_the_choices():
    assert list(schemes.SCHEMES) == ["allreduce", "fp16", "topk", "powersgd", "terngrad", "pactrain", "spardl",
                                     "gtopk", "prunex", "hier-allreduce", "hook"]
    with pytest.raises(ValueError, match="unknown scheme 'topk2'; choose one of: allreduce, fp16, topk"):
        schemes.get("topk2")


def _net():
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.8])
def test_magnitude_pruning_removes_exactly_the_smallest_weights(ratio):
    model = _net()
    masks = pruning.compute_masks(model, ratio, "magnitude")
    assert set(masks) == {"0.weight", "3.weight"}  # conv and linear weights, not biases
    w = torch.cat([p.detach().abs().reshape(-1) for n, p in model.named_parameters() if n in masks])
    m = torch.cat([masks[n].reshape(-1) for n in masks])
    assert int((~m).sum()) == round(ratio * w.numel())
    if 0 < ratio:
        assert w[m].min() >= w[~m].max(), "every kept weight is at least as large as every removed one"


@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.9])
def test_pruning_an_already_sparse_model_removes_the_exact_count_despite_ties(ratio):
    model = _net()
    with torch.no_grad():  # 70 % of the weights exactly zero: the threshold falls among ties
        for p in model.parameters():
            p[torch.rand(p.shape, generator=torch.Generator().manual_seed(1)) < 0.7] = 0
    masks = pruning.compute_masks(model, ratio, "magnitude")
    w = torch.cat([p.detach().abs().reshape(-1) for n, p in model.named_parameters() if n in masks])
    m = torch.cat([masks[n].reshape(-1) for n in masks])
    assert int((~m).sum()) == round(ratio * w.numel())
    assert w[m].min() >= w[~m].max()


def test_grasp_scores_are_minus_weight_times_hessian_gradient_product():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3, bias=False), nn.Tanh(), nn.Linear(3, 2, bias=False))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    names = ["0.weight", "2.weight"]
    scores = pruning._grasp_scores(model, [(x, y)], names)
    # brute force: full Hessian of the loss over both weight matrices, times the gradient
    shapes = [model[0].weight.shape, model[2].weight.shape]
    flat0 = torch.cat([model[0].weight.detach().reshape(-1), model[2].weight.detach().reshape(-1)])

    def loss(flat):
        w1 = flat[:12].view(shapes[0])
        w2 = flat[12:].view(shapes[1])
        return nn.functional.cross_entropy(torch.tanh(x @ w1.T) @ w2.T, y)
    g = torch.autograd.grad(loss(flat0.requires_grad_()), flat0)[0]
    h = torch.autograd.functional.hessian(loss, flat0.detach())
    expected = -(flat0.detach() * (h @ g))
    torch.testing.assert_close(torch.cat([s.reshape(-1) for s in scores]), expected, rtol=1e-4, atol=1e-7)
    masks = pruning.compute_masks(model, 0.5, "grasp", [(x, y)])
    kept = torch.cat([masks[n].reshape(-1) for n in names])
    assert int((~kept).sum()) == 9
    assert expected[~kept].min() >= expected[kept].max(), "the highest scores are removed"


def _masks_agree(rank, world):
    torch.manual_seed(rank)  # different weights on every rank
    model = _net()
    masks = pruning.compute_masks(model, 0.5, "magnitude")
    flat = torch.cat([masks[n].reshape(-1) for n in sorted(masks)]).to(torch.uint8)
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(gathered[0], t) for t in gathered), "rank 0's mask everywhere"
    if rank == 0:
        assert math.isclose(float(flat.float().mean()), 0.5, abs_tol=1e-3)


def test_pruning_mask_is_identical_on_all_ranks_even_when_weights_differ():
    run(_masks_agree, 3)


class _FakeBucket:
    """What BucketKeys reads from a GradBucket: index, buffer, parameters."""

    def __init__(self, index, buf, params):
        self._i, self._b, self._p = index, buf, params

    def index(self):
        return self._i

    def buffer(self):
        return self._b

    def parameters(self):
        return list(self._p)


def test_bucket_keys_do_not_alias_when_a_rebuilt_bucket_reuses_the_old_memory():
    """The old fast key (index, buffer address, length) gave a rebuilt bucket that got the
    old bucket's memory (CUDA's caching allocator does that) the old bucket's key."""
    from workloads.schemes._common import BucketKeys

    a, b, c = (nn.Parameter(torch.zeros(4)) for _ in range(3))
    buf = torch.zeros(8)
    keys = BucketKeys()
    before = keys(_FakeBucket(0, buf, [a, b]))
    after = keys(_FakeBucket(0, buf, [c, a]))  # same index, address and length; other parameters
    assert before == (id(a), id(b)) and after == (id(c), id(a))
    assert keys(_FakeBucket(1, torch.zeros(8), [a, b])) == before  # the same parameters: the same key


def _synthetic_gradients(rank, world):
    import time

    from torch.nn.parallel import DistributedDataParallel as DDP
    from workloads.synthetic import SyntheticCompute

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(50, 40), nn.ReLU(), nn.Linear(40, 30), nn.Linear(30, 10))
    syn = SyntheticCompute(model, 0.6, seed=rank)
    order = []
    for i, p in enumerate(model.parameters()):
        p.register_post_accumulate_grad_hook(lambda p, i=i: order.append(i))
    ddp = DDP(syn, bucket_cap_mb=0.001, init_sync=False)
    t0 = time.perf_counter()
    ddp().backward()
    took = time.perf_counter() - t0
    n = len(list(model.parameters()))
    assert order == list(range(n))[::-1], "gradients ready in reverse order, as a real backward pass"
    assert took >= 0.6, "forward + backward take at least the stated time (an upper bound would time the machine)"
    expected = []
    for r in range(world):  # every rank's synthetic gradients, averaged by DDP
        other = SyntheticCompute(model, 0, seed=r)
        expected.append(other._grads)
    for k, p in enumerate(model.parameters()):
        torch.testing.assert_close(p.grad, sum(e[k] for e in expected) / world)


def test_synthetic_compute_hands_ddp_real_shaped_gradients_in_reverse_order():
    run(_synthetic_gradients, 2)


@pytest.mark.parametrize("op,payload", [("max", 64), ("max-dissemination", 64), ("sum-int8", 16),
                                        ("ternary", 16 + 4 * 2)])
def test_the_collective_workload_times_ternarys_exchanges(tmp_path, op, payload):
    """Each piece of a ternary exchange runs alone, with the bytes it hands the collective
    (16 floats' worth: 16 int8 values, and ternary's 2 scales besides)."""
    res = train(3, tmp_path / op, "--op", op, "--bytes", "64", "--layers", "2", "--iters", "3",
                module="workloads.collective")
    assert res.ok, res.logs
    s = res.summary()
    assert (s["op"], s["iterations"], s["world_size"], s["mean_payload_bytes"]) == (op, 3, 3, payload)
    assert all(r["iter_s"] > 0 and r["payload_bytes"] == payload for r in res.iters(2))
