"""``topk``: top-k sparsification with error feedback, exchanged by all-gather.

Compressor / memory / communicator, as GRACE splits them:

* memory: the residual of each bucket (what was not sent) is added to the next
  gradient before selection (error feedback), keyed by the bucket's parameters;
  when DDP rebuilds its buckets (start of iteration 2), each parameter's residual moves
  to its place in the new bucket, so no error feedback is lost;
* compressor: the k = ceil(ratio * n) entries of largest magnitude, values (fp32) and
  positions (int32);
* communicator: top-k sets differ between ranks, so they cannot be all-reduced; every
  rank all-gathers the others' (values, positions), packed into one tensor, and sums
  them with ``index_add_``. Each rank sends k * 8 bytes per bucket.

"""

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ._common import Accounting, BucketKeys, bucket_residual


@dataclass
class TopKState(Accounting):
    ratio: float = 0.01
    """Fraction of each bucket's elements sent per iteration."""
    process_group: dist.ProcessGroup | None = None
    residuals: dict = field(default_factory=dict)
    """Bucket key (its parameters' identities) -> error-feedback residual."""
    keys: BucketKeys = field(default_factory=BucketKeys)
    where: dict = field(default_factory=dict)
    """Parameter identity -> (bucket key, offset, length) of its residual now."""


def topk_hook(state: TopKState, bucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    group = state.process_group
    world = dist.get_world_size(group)
    residual = bucket_residual(state, state.keys(bucket), bucket, buf)
    acc = residual.add_(buf)  # gradient + what earlier iterations did not send
    n = acc.numel()
    k = max(1, math.ceil(state.ratio * n))
    idx = acc.abs().topk(k, sorted=False).indices
    values = acc[idx].float()
    acc[idx] = 0  # the residual keeps the rest
    packed = torch.cat([values, idx.to(torch.int32).view(torch.float32)])  # one collective
    state.payload_bytes += packed.numel() * packed.element_size()
    gathered = [torch.empty_like(packed) for _ in range(world)]
    fut = dist.all_gather(gathered, packed, group=group, async_op=True).get_future()

    def combine(_):
        rows = torch.stack(gathered)  # world x 2k: values | positions
        positions = rows[:, k:].contiguous().view(torch.int32).reshape(-1).long()
        buf.zero_().index_add_(0, positions, rows[:, :k].reshape(-1).to(buf.dtype))
        return buf.div_(world)
    return fut.then(combine)


def attach(ddp, opts, masks=None) -> TopKState:
    state = TopKState(ratio=opts.topk_ratio, process_group=opts.process_group)
    ddp.register_comm_hook(state, topk_hook)
    return state
