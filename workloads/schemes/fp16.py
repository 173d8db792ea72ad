"""``fp16``: torch's ``fp16_compress_hook`` (cast to half, all-reduce, cast back)."""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ._common import Accounting


@dataclass
class FP16State(Accounting):
    process_group: dist.ProcessGroup | None = None


def fp16_hook(state: FP16State, bucket) -> torch.futures.Future[torch.Tensor]:
    state.payload_bytes += bucket.buffer().numel() * 2
    # torch annotates process_group as ProcessGroup, but takes None (the default group)
    return default_hooks.fp16_compress_hook(state.process_group, bucket)  # type: ignore[arg-type]


def attach(ddp, opts, masks=None) -> FP16State:
    state = FP16State(process_group=opts.process_group)
    ddp.register_comm_hook(state, fp16_hook)
    return state
