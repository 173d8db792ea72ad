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
  entries (h = k, or k // d with d teams, so that the d teams' union stays within k).
* **Spar-All-Gather**: with d teams (``teams``: one per switch domain) the ranks that
  own the same block in each team exchange their selections (Bruck rounds across teams,
  the only traffic that leaves a switch besides the reduce-scatter's of other teams) and
  sum them; then each team all-gathers the P reduced blocks with Bruck rounds
  (ceil(log2 P) rounds, the partner at distance 2^s). The sum is divided by the world size.
* **Global residual collection**: every entry a rank held and did not pass on stays in
  its residual; entries outside the final selection go back, in full, to the residual of
  each rank that contributed them. No gradient mass is lost: over all ranks, residuals +
  world x result = gradients + previous residuals (tested).

Differences from the published code: d teams come from the topology (the code fixes d =
1); h is fixed at k // d, not adapted per iteration; messages always carry k entries
(padding marked with position -1), so no size message is needed.
"""


import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ._common import Accounting, BucketKeys, bucket_residual


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
    last_selected: int = 0
    """Entries in the last bucket's final selection (for tests and records)."""

    @property
    def team(self) -> tuple[int, ...]:
        return next(t for t in self.teams if self.rank in t)

    @property
    def peers(self) -> tuple[int, ...]:
        """The rank at this rank's position in every team (one per team, this one included)."""
        i = self.team.index(self.rank)
        return tuple(t[i] for t in self.teams)


def _exchange(state: SparDLState, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
    ops = [dist.P2POp(dist.isend, send, dst), dist.P2POp(dist.irecv, recv, src)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    state.payload_bytes += send.numel() * send.element_size()


def _select(block: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest-magnitude entries of ``block`` (taken out of it): (positions, values)."""
    idx = block.abs().topk(min(k, block.numel()), sorted=False).indices
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


def sparse_allreduce(state: SparDLState, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SparDL over all ranks of ``acc`` (flat, this rank's gradient + residual).

    Returns (average, new residual), both shaped like ``acc``.
    """
    team, peers = state.team, state.peers
    p, d = len(team), len(peers)
    me = team.index(state.rank)
    n = acc.numel()
    b = math.ceil(n / p)
    k = max(1, int(b * state.density))
    h = max(1, k // d)
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
    if d > 1:  # the same block from every team, summed: at most d * h <= k entries
        merged = torch.zeros(b, dtype=torch.float32, device=acc.device)
        for msg in _bruck_allgather(state, own, peers):
            _add(merged, *_unpack(msg, h)[0])
        own = _pack([_select(merged, k)])
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
    buf = bucket.buffer()
    fut: torch.futures.Future = torch.futures.Future()
    if state.world == 1:
        fut.set_result(buf)
        return fut
    residual = bucket_residual(state, state.keys(bucket), bucket, buf)
    avg, new = sparse_allreduce(state, residual + buf)
    residual.copy_(new)
    buf.copy_(avg)
    fut.set_result(buf)
    return fut


def teams_for(placement, how: str) -> tuple[tuple[int, ...], ...]:
    """``how``: ``1`` (one team of all ranks, as the published code), ``switch`` (a team per
    domain; domains must be equal), or ``auto`` (``switch`` when the domains are equal and
    more than one, else ``1``)."""
    world = sum(len(g) for g in placement.groups)
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
    state = SparDLState(density=opts.spardl_density, teams=teams_for(opts.placement, opts.spardl_teams),
                        world=dist.get_world_size(), rank=dist.get_rank())
    ddp.register_comm_hook(state, spardl_hook)
    return state
