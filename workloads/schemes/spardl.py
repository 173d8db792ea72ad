"""``spardl``: SparDL (Zhao et al.): sparse reduce-scatter, global residual collection, sparse all-gather.

Written for DDP after the authors' mpi4py code (github ZJU-DAILY/SparDL, ``allreducer.py``);
one DDP bucket at a time (the small models here fit one bucket):

* **Blocks**: the bucket plus this rank's residual (error feedback) is zero-padded and
  split into P equal blocks of B = ceil(n / P) elements, P = ranks in a team; k =
  max(1, int(B * density)) entries per block message.
* **Spar-Reduce-Scatter**: ceil(log2 P) rounds. The partner distance starts at P -
  2^(ceil(log2 P) - 1) and halves; in each round a rank sends a run of blocks to rank +
  gap and receives as many from rank - gap (P - 1 blocks in all, so P need not be a power
  of two). Each block is re-selected to its k largest entries just before it is sent
  (values fp32 + int32 positions, 8 bytes an entry), and what is received is added into
  the block, so messages stay at k entries however many ranks contributed.
  The published code sends a round's blocks one message each; here a round's blocks go
  in one message (the same bytes, fewer round trips).
* **Own block**: at the end rank i holds block i, reduced; it keeps its h largest
  entries. With one team h = k. With d teams, h adapts per bucket as the published code
  does it (``next_h``): it starts at k // d and moves by a step (starting at (k - k // d)
  / 100) towards the h whose union over the d teams holds k entries, the step doubling
  while it keeps its direction and halving when it turns; ``h_rule="fixed"`` keeps h =
  k // d (the union then never exceeds k).
* **Spar-All-Gather**: with d teams (``teams``: d equal teams of consecutive ranks in
  switch order, by default one per switch domain) the ranks that own the same block in
  each team exchange their selections (Bruck rounds across teams, the only traffic that
  leaves a switch besides the reduce-scatter's of other teams) and sum them, keeping the
  k largest of the union; then each team all-gathers the P reduced blocks with Bruck
  rounds (ceil(log2 P) rounds, the partner at distance 2^s). The sum is divided by the
  world size.
* **Global residual collection**: every entry a rank held and did not pass on stays in
  its residual; entries outside the final selection go back, in full, to the residual of
  each rank that contributed them. No gradient mass is lost: over all ranks, residuals +
  world x result = gradients + previous residuals (tested).
* **Overlap**: the hook hands each bucket's rounds to a communication thread
  (``_common.CommThread``) and returns; the thread runs them bucket after bucket while
  backward goes on (``overlap=False``: the hook runs them itself, the synchronous reference).

Differences from the published code: d teams come from the topology or ``--spardl-d``
(the code fixes d = 1); h is kept per bucket and clamped to [1, block size] (the
published h has no upper bound, and with density 1 it would grow past the block); union
entries beyond k go back to the residuals of the ranks that contributed them (the code
adds 1/d of each to every owner's residual); messages always carry k entries (padding
marked with position -1), so no size message is needed.
"""


import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ._common import Accounting, BucketKeys, CommThread, bucket_residual, done_future


def reduce_scatter_rounds(p: int) -> list[tuple[int, int]]:
    """(gap, blocks sent) per round of Spar-Reduce-Scatter among ``p`` ranks."""
    if p < 2:
        return []
    r = math.ceil(math.log2(p))
    sizes = [2 ** i for i in range(r - 1)]
    extra = p - 2 ** (r - 1)
    if extra > 0:
        sizes.append(extra)
    sizes.reverse()
    gap, out = p - sizes[0], []
    for s in sizes:
        out.append((gap, s))
        gap //= 2
    return out


def initial_h(b: int, density: float, d: int) -> tuple[int, int, bool]:
    """(h, step, inertia) before the first iteration, as allreducer.py (ZJU-DAILY/SparDL)
    sets them: h = int(B x density / d), step = int((B x density - h) / 100)."""
    h = int(b * density / d)
    return h, int((b * density - h) / 100), False


def next_h(h: int, step: int, inertia: bool, union: int, k: int, d: int) -> tuple[int, int, bool]:
    """SparDL's adaptive h (allreducer.py of ZJU-DAILY/SparDL, after the teams' exchange):
    ``union`` = entries in the union of the d teams' h-selections of this block. While the
    step moves h the right way (down when the union exceeds k, up when it does not) it
    doubles every second iteration (inertia); when it points the wrong way it turns and
    halves. h never falls below k // d."""
    if (union > k) ^ (step > 0):
        if inertia:
            step, inertia = step * 2, False
        else:
            inertia = True
    else:
        step, inertia = (int(-0.5 * step) if abs(step) > 1 else -step), False
    return max(h + step, int(k / d)), step, inertia


H_TRAJECTORY_MAX = 10_000
"""Adaptive h values kept per bucket for the summary (a few bytes each)."""

@dataclass
class _H:
    h: int
    step: int
    inertia: bool = False


@dataclass
class SparDLState(Accounting):
    density: float = 0.01
    teams: tuple[tuple[int, ...], ...] = ()
    """Global ranks of each team (equal sizes); one team of all ranks when d = 1."""
    world: int = 1
    rank: int = 0
    residuals: dict = field(default_factory=dict)
    where: dict = field(default_factory=dict)
    keys: BucketKeys = field(default_factory=BucketKeys)
    h_rule: str = "adaptive"
    """``adaptive`` (the published code's h, per bucket) or ``fixed`` (h = k // d)."""
    h: dict = field(default_factory=dict)
    """bucket key -> _H (adaptive h)."""
    h_trajectory: dict = field(default_factory=dict)
    """bucket key -> the h each of its calls used, in order (adaptive h; the summary's
    ``spardl_h_trajectory``, at most ``H_TRAJECTORY_MAX`` a bucket)."""
    last_selected: int = 0
    """Entries in the last bucket's final selection (for tests and records)."""
    last_union: int = 0
    """Entries in the last bucket's union of the d teams' selections (d > 1)."""
    domain: tuple[int, ...] = ()
    """Switch domain of each global rank (empty: not known)."""
    inter_payload_bytes: int = 0
    """Bytes this rank sent to ranks in other domains (cumulative; never reset)."""
    messages: int = 0
    """Messages this rank sent (cumulative): each a latency-bound round."""
    overlap: bool = False
    """Run each bucket's rounds on ``comm`` so they overlap backward (``attach`` turns it
    on; off, the hook runs them itself: the synchronous reference)."""
    comm: CommThread = field(default_factory=lambda: CommThread("spardl-comm"), repr=False, compare=False)

    @property
    def team(self) -> tuple[int, ...]:
        return next(t for t in self.teams if self.rank in t)

    def stats(self) -> dict:
        """For the summary (``workloads.summary``): the number of teams d this run used
        (``--spardl-d 0`` leaves the choice to ``--spardl-teams``; a published run states it)."""
        return {"spardl_teams_used": len(self.teams),
                "spardl_h_trajectory": list(self.h_trajectory.values()) if self.h_trajectory else None}

    @property
    def peers(self) -> tuple[int, ...]:
        """The rank at this rank's position in every team (one per team, this one included)."""
        i = self.team.index(self.rank)
        return tuple(t[i] for t in self.teams)


def _exchange(state: SparDLState, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
    ops = [dist.P2POp(dist.isend, send, dst), dist.P2POp(dist.irecv, recv, src)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    sent = send.numel() * send.element_size()
    state.payload_bytes += sent
    state.messages += 1
    if state.domain and state.domain[dst] != state.domain[state.rank]:
        state.inter_payload_bytes += sent


def _select(block: torch.Tensor, k: int, among: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest-magnitude entries of ``block`` (taken out of it): (positions, values);
    with ``among`` (bool, like block) only from its True positions."""
    if among is None:
        idx = block.abs().topk(min(k, block.numel()), sorted=False).indices
    else:
        score = torch.where(among, block.abs(), torch.full_like(block, -1))
        idx = score.topk(min(k, int(among.sum())), sorted=False).indices
    vals = block[idx].float()
    block[idx] = 0
    if idx.numel() < k:  # block shorter than k: pad with position -1
        idx = torch.cat([idx, idx.new_full((k - idx.numel(),), -1)])
        vals = torch.cat([vals, vals.new_zeros(k - vals.numel())])
    return idx, vals


def _pack(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """[(positions, values)] -> one fp32 tensor: values | int32 positions, per pair."""
    return torch.cat([torch.cat([v, i.to(torch.int32).view(torch.float32)]) for i, v in pairs])


def _unpack(msg: torch.Tensor, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for row in msg.view(-1, 2 * k):
        out.append((row[k:].contiguous().view(torch.int32).long(), row[:k]))
    return out


def _add(block: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor) -> None:
    ok = idx >= 0
    block.index_add_(0, idx[ok], vals[ok].to(block.dtype))


def _bruck_allgather(state: SparDLState, mine: torch.Tensor, members: tuple[int, ...]) -> list[torch.Tensor]:
    """Every member's ``mine`` (equal sizes), in member order, by Bruck rounds."""
    p = len(members)
    me = members.index(state.rank)
    have = [mine]  # have[j] = data of member (me + j) % p
    gap = 1
    while gap < p:
        cnt = min(gap, p - gap)
        send = torch.cat(have[:cnt])
        recv = torch.empty_like(send)
        _exchange(state, send, members[(me - gap) % p], recv, members[(me + gap) % p])
        have.extend(recv.view(cnt, -1).unbind(0))
        gap *= 2
    return [have[(j - me) % p] for j in range(p)]


def geometry(n: int, p: int, density: float) -> tuple[int, int]:
    """(B, k): block size for ``n`` entries over ``p`` ranks of a team, entries per message."""
    b = math.ceil(n / p)
    return b, max(1, int(b * density))


def sparse_allreduce(state: SparDLState, acc: torch.Tensor, h: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SparDL over all ranks of ``acc`` (flat, this rank's gradient + residual); the owner
    keeps ``h`` entries of its block (None: k // d).

    Returns (average, new residual), both shaped like ``acc``.
    """
    team, peers = state.team, state.peers
    p, d = len(team), len(peers)
    me = team.index(state.rank)
    n = acc.numel()
    b, k = geometry(n, p, state.density)
    h = min(b, max(1, k // d if h is None else h))
    padded = torch.zeros(p * b, dtype=acc.dtype, device=acc.device)
    padded[:n] = acc
    held = padded.clone().view(p, b)  # what this rank holds and has not passed on

    for gap, count in reduce_scatter_rounds(p):
        send = _pack([_select(held[(me + gap + j) % p], k) for j in range(count)])
        recv = torch.empty_like(send)
        _exchange(state, send, team[(me + gap) % p], recv, team[(me - gap) % p])
        for j, (idx, vals) in enumerate(_unpack(recv, k)):
            _add(held[(me + j) % p], idx, vals)

    own = _pack([_select(held[me], h)])
    if d > 1:  # the same block from every team, summed; the k largest of their union
        merged = torch.zeros(b, dtype=torch.float32, device=acc.device)
        touched = torch.zeros(b, dtype=torch.bool, device=acc.device)
        for msg in _bruck_allgather(state, own, peers):
            idx, vals = _unpack(msg, h)[0]
            _add(merged, idx, vals)
            touched[idx[idx >= 0]] = True
        state.last_union = int(touched.sum())
        own = _pack([_select(merged, k, touched)])
        width = k
    else:
        width = h
    result = torch.zeros(p, b, dtype=acc.dtype, device=acc.device)
    chosen = torch.zeros(p, b, dtype=torch.bool, device=acc.device)
    for owner, msg in enumerate(_bruck_allgather(state, own, team) if p > 1 else [own]):
        idx, vals = _unpack(msg, width)[0]
        ok = idx >= 0
        result[owner].index_add_(0, idx[ok], vals[ok].to(acc.dtype))
        chosen[owner, idx[ok]] = True
    state.last_selected = int(chosen.sum())
    # global residual collection
    residual = torch.where(chosen.view(-1), held.view(-1), padded)[:n]
    return result.view(-1)[:n].div_(state.world), residual


def spardl_hook(state: SparDLState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: with ``state.overlap`` the bucket's rounds run on the state's
    communication thread (bucket after bucket, as every rank calls the hook) while backward
    goes on; without, here, and the future is done."""
    buf = bucket.buffer()
    if state.world == 1:
        return done_future(buf)
    key = state.keys(bucket)  # what reads the bucket runs here, not on the thread
    residual = bucket_residual(state, key, bucket, buf)
    hs = None
    if state.h_rule == "adaptive" and len(state.teams) > 1:
        for gone in set(state.h) - set(state.residuals):
            del state.h[gone]  # DDP rebuilt that bucket away
        if key not in state.h:
            b, _ = geometry(buf.numel(), len(state.team), state.density)
            state.h[key] = _H(*initial_h(b, state.density, len(state.teams)))
        hs = state.h[key]
    if not state.overlap:
        return done_future(_reduce_bucket(state, buf, residual, hs))
    return state.comm.submit(lambda: _reduce_bucket(state, buf, residual, hs), buf.device)


def _reduce_bucket(state: SparDLState, buf: torch.Tensor, residual: torch.Tensor, hs: "_H | None") -> torch.Tensor:
    """SparDL of ``buf`` + ``residual`` (both updated in place); ``hs``: the bucket's
    adaptive h (None: k // d), moved by the published rule afterwards."""
    if hs is not None:
        d = len(state.teams)
        b, k = geometry(buf.numel(), len(state.team), state.density)
        hs.h = min(b, max(1, hs.h))  # at least one entry; no more than the block holds
    avg, new = sparse_allreduce(state, residual + buf, None if hs is None else hs.h)
    if hs is not None:
        seen = state.h_trajectory.setdefault(id(hs), [])
        if len(seen) < H_TRAJECTORY_MAX:
            seen.append(hs.h)
        hs.h, hs.step, hs.inertia = next_h(hs.h, hs.step, hs.inertia, state.last_union, k, d)
    residual.copy_(new)
    return buf.copy_(avg)


def teams_for(placement, how: str, d: int = 0) -> tuple[tuple[int, ...], ...]:
    """``how``: ``1`` (one team of all ranks, as the published code), ``switch`` (a team per
    domain; domains must be equal), or ``auto`` (``switch`` when the domains are equal and
    more than one, else ``1``). ``d`` > 0 overrides it: d equal teams of consecutive ranks
    in domain order (so with d a multiple of equal domains' count each team lies in one
    domain, and with d = the number of equal domains the teams are the domains); d must
    divide the number of ranks."""
    world = sum(len(g) for g in placement.groups)
    if d:
        if d < 1 or world % d:
            divisors = ", ".join(str(i) for i in range(1, world + 1) if world % i == 0)
            raise ValueError(f"--spardl-d {d}: the {world} ranks cannot form {d} equal teams; "
                             f"d must divide {world} ({divisors}), or be 0 (--spardl-teams decides)")
        ranks = [r for g in placement.groups for r in g]
        p = world // d
        return tuple(tuple(ranks[i * p:(i + 1) * p]) for i in range(d))
    if how == "1" or (how == "auto" and (len(placement.groups) == 1 or not placement.equal)):
        return (tuple(range(world)),)
    if how in ("switch", "auto"):
        if not placement.equal:
            sizes = ", ".join(f"{n}: {len(g)}" for n, g in zip(placement.names, placement.groups))
            raise ValueError(f"--spardl-teams switch needs equal domains, and these are not ({sizes}); "
                             "use --spardl-teams 1")
        return tuple(placement.groups)
    raise ValueError(f"--spardl-teams must be 1, switch or auto, got {how!r}")


def attach(ddp, opts, masks=None) -> SparDLState:
    teams = teams_for(opts.placement, opts.spardl_teams, opts.spardl_d)
    domain = {r: i for i, g in enumerate(opts.placement.groups) for r in g}
    state = SparDLState(density=opts.spardl_density, teams=teams, world=dist.get_world_size(),
                        rank=dist.get_rank(), h_rule=opts.spardl_h,
                        domain=tuple(domain[r] for r in range(len(domain))), overlap=True)
    ddp.register_comm_hook(state, spardl_hook)
    return state
