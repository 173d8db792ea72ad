"""SparDL as its published code runs it: the adaptive h, d teams as a parameter."""

import random

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from tests.workloads.dist_util import run
from tests.workloads.test_schemes import _Bucket
from tests.workloads.test_spardl_prunex import _published_rounds, _seen, _top
from workloads import placement as pl
from workloads.schemes import SchemeOptions, parse_variant, spardl


class PublishedH:
    """h as allreducer.py of github.com/ZJU-DAILY/SparDL (commit c8d43f8) keeps it, line by
    line: set up in _generate_arange_groups (lines 616-618), updated in run() after the
    teams' Spar-All-Gather (lines 1253-1263), with Group_num = d and chunck_size = B."""

    def __init__(self, chunck_size, density, group_num):
        self.Group_num = group_num
        self.h = int(chunck_size * density / self.Group_num)
        self.h_step = int((chunck_size * density - self.h) / 100)
        self.h_inertia = False

    def update(self, union, k):
        if (union > k) ^ (self.h_step > 0):
            if self.h_inertia:
                self.h_step *= 2
                self.h_inertia = False
            else:
                self.h_inertia = True
        else:
            self.h_step = int(-0.5 * self.h_step) if abs(self.h_step) > 1 else -self.h_step
            self.h_inertia = False
        self.h = max(self.h + self.h_step, int(k / self.Group_num))


@pytest.mark.parametrize("world", range(2, 17))
def test_adaptive_h_follows_the_published_rule(world):
    rng = random.Random(world)
    branches, moved = set(), False
    for d in [d for d in range(1, world + 1) if world % d == 0]:
        b, k = spardl.geometry(1_000_003, world // d, 0.01)
        ref = PublishedH(b, 0.01, d)
        h, step, inertia = spardl.initial_h(b, 0.01, d)
        assert (h, step, inertia) == (ref.h, ref.h_step, ref.h_inertia)
        for _ in range(40):  # a union of the d teams' h entries: between h and d * h
            union = rng.randint(ref.h, min(d * ref.h, b))
            branches.add((union > k, ref.h_step > 0))
            ref.update(union, k)
            h, step, inertia = spardl.next_h(h, step, inertia, union, k, d)
            assert (h, step, inertia) == (ref.h, ref.h_step, ref.h_inertia), (world, d)
            moved |= h != k // d
    if world >= 4:  # d = 2 at least: h has moved, every branch of the rule was taken
        assert moved and branches == {(True, True), (True, False), (False, True), (False, False)}


# ---------------------------------------------------------------- against a plain simulation
def reference_adaptive(accs, density, teams, hs):
    """A plain simulation of one SparDL call over all ranks, owners of block i keeping
    hs[i] entries, the k largest of the d teams' union kept; (average, residuals, unions)."""
    p, d = len(teams[0]), len(teams)
    world, n = p * d, accs[0].numel()
    b, k = spardl.geometry(n, p, density)
    pad = {r: torch.cat([accs[r], torch.zeros(p * b - n)]) for r in range(world)}
    held = {r: pad[r].clone().view(p, b) for r in range(world)}
    for team in teams:
        for gap, count in _published_rounds(p) if p > 1 else []:
            msgs = {i: [((i + gap + j) % p, *_top(held[r][(i + gap + j) % p], k)) for j in range(count)]
                    for i, r in enumerate(team)}
            for i, r in enumerate(team):
                for blk, idx, vals in msgs[(i - gap) % p]:
                    held[r][blk][idx] += vals
    result, chosen, unions = torch.zeros(p, b), torch.zeros(p, b, dtype=torch.bool), []
    for i in range(p):
        merged, touched = torch.zeros(b), torch.zeros(b, dtype=torch.bool)
        for t in teams:
            idx, vals = _top(held[t[i]][i], min(b, hs[i]))
            merged[idx] += vals
            touched[idx] = True
        unions.append(int(touched.sum()))
        cand = touched.nonzero().squeeze(1)
        keep = cand[merged[cand].abs().topk(min(k, cand.numel())).indices]
        result[i][keep] = merged[keep]
        chosen[i][keep] = True
    residuals = [torch.where(chosen.view(-1), held[r].view(-1), pad[r])[:n] for r in range(world)]
    return result.view(-1)[:n] / world, residuals, unions


def _adaptive(rank, world, teams):
    for rule in ("adaptive", "fixed"):
        _adaptive_rule(rank, world, teams, rule)


def _adaptive_rule(rank, world, teams, rule):
    n, density, iters = 8001, 0.05, 6  # k = 200 per block of two ranks: h's step starts at 1
    torch.manual_seed(1)
    grads = [[torch.randn(n) * (1 + torch.arange(n) % 7) for _ in range(world)] for _ in range(iters)]
    params = [nn.Parameter(torch.zeros(n - 1)), nn.Parameter(torch.zeros(1))]
    state = spardl.SparDLState(density=density, teams=teams, world=world, rank=rank, h_rule=rule)
    p, d = len(teams[0]), len(teams)
    b, k = spardl.geometry(n, p, density)
    refs = [spardl.initial_h(b, density, d) for _ in range(p)]  # per block: (h, step, inertia)
    ref_res, hs_seen, over = [torch.zeros(n) for _ in range(world)], [], False
    for it in range(iters):
        hs = [r[0] if rule == "adaptive" else k // d for r in refs]
        hs_seen.append(hs)
        accs = [ref_res[r] + grads[it][r] for r in range(world)]
        expected, ref_res, unions = reference_adaptive(accs, density, teams, hs)
        refs = [spardl.next_h(*refs[i], unions[i], k, d) for i in range(p)]
        over |= max(unions) > k
        out = spardl.spardl_hook(state, _Bucket(grads[it][rank].clone(), params)).wait()
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
        mine = state.residuals[tuple(id(q) for q in params)]
        torch.testing.assert_close(mine, ref_res[rank], rtol=1e-5, atol=1e-6)
        total = mine.clone()
        dist.all_reduce(total)
        torch.testing.assert_close(total + world * out, sum(accs), rtol=1e-5, atol=1e-4)
        assert state.last_selected <= p * k
    if rule == "adaptive":
        me = next(t for t in teams if rank in t).index(rank)
        assert state.h[tuple(id(q) for q in params)].h == refs[me][0]
        # the summary's trajectory (issue 58): the h this rank's block used, call by call
        assert state.stats()["spardl_h_trajectory"] == [[hs[me] for hs in hs_seen]]
        assert len({tuple(h) for h in hs_seen}) > 1, "h adapted"
        assert over, "a union beyond k was cut to its k largest"
    else:
        assert not state.h and state.stats()["spardl_h_trajectory"] is None


@pytest.mark.slow
def test_spardl_with_adaptive_or_fixed_h_equals_the_reference():
    run(_adaptive, 4, ((0, 1), (2, 3)))


# ---------------------------------------------------------------- d as a parameter
def test_d_teams_of_consecutive_ranks_in_domain_order():
    eight = pl.build(0, _seen([4, 4]))
    assert spardl.teams_for(eight, "auto", 4) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert spardl.teams_for(eight, "1", 2) == spardl.teams_for(eight, "switch") == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert spardl.teams_for(eight, "switch", 1) == (tuple(range(8)),)
    assert spardl.teams_for(eight, "auto", 8) == tuple((r,) for r in range(8))
    with pytest.raises(ValueError, match=r"--spardl-d 3: the 8 ranks cannot form 3 equal teams; "
                                         r"d must divide 8 \(1, 2, 4, 8\)"):
        spardl.teams_for(eight, "auto", 3)
    # ranks need not be numbered by domain: the teams follow the domains
    mixed = pl.build(0, [(1, 0, 2, "b", "h"), (0, 1, 2, "a", "h"), (0, 0, 2, "a", "h"), (1, 1, 2, "b", "h")])
    assert spardl.teams_for(mixed, "auto", 2) == ((2, 1), (0, 3))
    assert spardl.teams_for(mixed, "auto", 4) == ((2,), (1,), (0,), (3,))


def test_d_and_the_h_rule_are_scheme_parameters():
    _, values = parse_variant("spardl:0.02:d=4:fixed")
    assert values == {"spardl_density": "0.02", "spardl_d": "4", "spardl_h": "fixed"}
    assert SchemeOptions().spardl_h == "adaptive" and SchemeOptions().spardl_d == 0
    with pytest.raises(ValueError, match="--spardl-d must be >= 0"):
        SchemeOptions(spardl_d=-1)
    with pytest.raises(ValueError, match="--spardl-h must be adaptive or fixed"):
        SchemeOptions(spardl_h="grow")

