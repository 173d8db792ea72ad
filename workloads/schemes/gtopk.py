"""``gtopk``: gTop-k sparse all-reduce (Shi et al., ICDCS'19), one of the sparse all-reduce
methods SparDL is measured against (shared/papers/spardl-prunex-notes.md).

* memory: error feedback, as ``topk``: each bucket's residual (what was not applied) is added
  to the next gradient before selection, and follows its parameters when DDP rebuilds its
  buckets;
* compressor: each rank's k = ceil(ratio x n) entries of largest magnitude, values (fp32)
  and positions (int32);
* communicator: log2(P) rounds of recursive doubling. In round r a rank and its partner
  (rank XOR 2^r) exchange their current k (value, position) pairs, add them where positions
  meet, and both keep the k of largest magnitude of the union (ties to the lower position,
  so both keep the same). After the rounds every rank holds the same global top-k: k
  entries of the sum of the ranks' selections, which the bucket becomes, averaged by P.
  Where P is not a power of two, the ranks beyond the largest power of two m fold in first
  (send their set to rank - m, which merges it) and receive the result at the end.

What a rank selected but the global top-k dropped goes back into its residual, as in the
paper, with what it did not select. Each rank sends 8k bytes a round: 8k log2(P) a bucket
(the all-gather of ``topk`` sends 8k but receives 8k (P - 1)).

(No ``from __future__ import annotations``: DDP checks the hook's return annotation as an
object, not a string.)
"""

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ._common import Accounting, BucketKeys, bucket_residual, done_future


@dataclass
class GTopKState(Accounting):
    ratio: float = 0.01
    """Fraction of each bucket's elements selected per iteration (locally and globally)."""
    process_group: dist.ProcessGroup | None = None
    rank: int = 0
    world: int = 1
    residuals: dict = field(default_factory=dict)
    keys: BucketKeys = field(default_factory=BucketKeys)
    where: dict = field(default_factory=dict)

    @property
    def power(self) -> int:
        """The largest power of two not above the world size: the ranks of the doubling."""
        return 1 << (self.world.bit_length() - 1)


def merge(values: torch.Tensor, positions: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k entries of largest magnitude of the sum of (value, position) pairs, positions
    that meet added; ties go to the lower position. Two ranks merging the same two sets in
    either order get the same answer (each position has at most two terms: a + b == b + a)."""
    unique, inverse = torch.unique(positions, return_inverse=True)  # ascending positions
    summed = torch.zeros(unique.numel(), dtype=values.dtype).index_add_(0, inverse, values)
    order = torch.sort(summed.abs(), descending=True, stable=True).indices[:k]
    return summed[order], unique[order]


def _pack(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return torch.cat([values.float(), positions.to(torch.int32).view(torch.float32)])


def _unpack(packed: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return packed[:k], packed[k:].contiguous().view(torch.int32).long()


def _swap(state: GTopKState, packed: torch.Tensor, peer: int, send: bool = True, recv: bool = True) -> torch.Tensor:
    """Send ``packed`` to ``peer`` and/or receive as much from it."""
    got = torch.empty_like(packed)
    ops = ([dist.P2POp(dist.isend, packed, peer, state.process_group)] if send else []) + \
          ([dist.P2POp(dist.irecv, got, peer, state.process_group)] if recv else [])
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if send:
        state.payload_bytes += packed.numel() * packed.element_size()
    return got


def global_topk(state: GTopKState, values: torch.Tensor, positions: torch.Tensor, k: int):
    """This rank's (values, positions) to the global top-k every rank ends with."""
    m, r = state.power, state.rank
    if r >= m:  # fold: hand the set to rank - m, get the answer back
        _swap(state, _pack(values, positions), r - m, recv=False)
        return _unpack(_swap(state, _pack(values, positions), r - m, send=False), k)
    if r + m < state.world:
        theirs = _unpack(_swap(state, _pack(values, positions), r + m, send=False), k)
        values, positions = merge(torch.cat([values, theirs[0]]), torch.cat([positions, theirs[1]]), k)
    bit = 1
    while bit < m:
        theirs = _unpack(_swap(state, _pack(values, positions), r ^ bit), k)
        values, positions = merge(torch.cat([values, theirs[0]]), torch.cat([positions, theirs[1]]), k)
        bit <<= 1
    if r + m < state.world:
        _swap(state, _pack(values, positions), r + m, recv=False)
    return values, positions


def gtopk_hook(state: GTopKState, bucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    if state.world == 1:
        return done_future(buf)
    residual = bucket_residual(state, state.keys(bucket), bucket, buf)
    acc = residual.add_(buf)  # gradient + what earlier iterations did not apply
    k = max(1, math.ceil(state.ratio * acc.numel()))
    idx = acc.abs().topk(k, sorted=False).indices
    mine = acc[idx].float()
    acc[idx] = 0  # the residual keeps what was not selected
    values, positions = global_topk(state, mine, idx, k)
    dropped = ~torch.isin(idx, positions)
    acc.index_add_(0, idx[dropped], mine[dropped].to(acc.dtype))  # selected here, not globally: kept
    buf.zero_().index_add_(0, positions, values.to(buf.dtype))
    return done_future(buf.div_(state.world))


def attach(ddp, opts, masks=None) -> GTopKState:
    group = opts.process_group
    state = GTopKState(ratio=opts.topk_ratio, process_group=group, rank=dist.get_rank(group),
                       world=dist.get_world_size(group))
    ddp.register_comm_hook(state, gtopk_hook)
    return state
