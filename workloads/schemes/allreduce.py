"""``allreduce``: DDP's default all-reduce of every gradient bucket (no hook registered)."""

from dataclasses import dataclass

from ._common import Accounting


@dataclass
class AllReduceState(Accounting):
    """No hook runs; DDP all-reduces every trainable parameter's gradient each iteration."""

    dense_bytes: int = 0
    """Bytes of all gradients, i.e. what DDP hands to all-reduce per iteration."""

    def take_payload_bytes(self) -> int:
        return self.dense_bytes


def attach(ddp, opts, masks=None) -> AllReduceState:
    return AllReduceState(dense_bytes=sum(p.numel() * p.element_size()
                                          for p in ddp.module.parameters() if p.requires_grad))
