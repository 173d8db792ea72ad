"""``toyscheme``: DDP's all-reduce of the mean, as a communication hook of one's own.

The scheme contract (workloads.schemes): ``attach(ddp, opts, masks=None)`` registers the hook
and returns a state whose ``take_payload_bytes()`` gives the bytes handed to collectives
since the last call (the per-iteration records and the proof read them).
"""

from dataclasses import dataclass

import torch.distributed as dist


@dataclass
class ToyState:
    process_group: object = None
    payload_bytes: int = 0

    def take_payload_bytes(self) -> int:
        n, self.payload_bytes = self.payload_bytes, 0
        return n


def mean_allreduce(state: ToyState, bucket):
    buf = bucket.buffer()
    state.payload_bytes += buf.numel() * buf.element_size()
    group = state.process_group or dist.group.WORLD
    return dist.all_reduce(buf.div_(group.size()), group=group, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


def attach(ddp, opts, masks=None) -> ToyState:
    state = ToyState(process_group=opts.process_group)
    ddp.register_comm_hook(state, mean_allreduce)
    return state
