"""Gradient-communication schemes, one module each, registered by name.

Every scheme module has ``attach(ddp, opts, masks=None) -> state``: it registers its DDP
communication hook (if any) and returns a documented state object whose
``take_payload_bytes()`` gives the bytes this rank handed to collectives since the last
call. The train loop calls it once per iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module


@dataclass(frozen=True)
class SchemeOptions:
    """Hyper-parameters of all schemes (each reads its own)."""

    process_group: object = None
    """torch.distributed group (None: the default group)."""
    device: str = "cpu"
    """Where random generators live (the gradients' device)."""
    seed: int = 0
    topk_ratio: float = 0.01
    """topk: fraction of each bucket's elements sent."""
    powersgd_rank: int = 4
    """powersgd: matrix approximation rank."""
    powersgd_start_iter: int = 10
    """powersgd: iterations of vanilla all-reduce before compressing (>= 2)."""
    terngrad_clip: float = 2.5
    """terngrad: clip gradients to this many standard deviations first (0: off)."""
    ternary: bool = False
    """pactrain: ternary-quantise the compact tensor."""
    stable_iters: int = 3
    """pactrain: iterations a bucket's mask must be unchanged before compaction."""


@dataclass(frozen=True)
class Scheme:
    name: str
    summary: str
    module: str
    prunes: bool = False
    """The train loop prunes the model (global mask) before attaching the scheme."""

    @property
    def attach(self) -> Callable:
        return import_module(f"{__name__}.{self.module}").attach


SCHEMES: dict[str, Scheme] = {s.name: s for s in [
    Scheme("allreduce", "DDP's default all-reduce (no hook)", "allreduce"),
    Scheme("fp16", "torch's fp16 compression hook", "fp16"),
    Scheme("topk", "top-k with error feedback, all-gather of values + int32 indices", "topk"),
    Scheme("powersgd", "torch's PowerSGD hook", "powersgd"),
    Scheme("terngrad", "ternary stochastic quantisation, shared max scale, int8 sum", "terngrad"),
    Scheme("pactrain", "pruning + mask tracker + compact all-reduce (+ ternary)", "pactrain", prunes=True),
]}


def get(name: str) -> Scheme:
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; choose one of: {', '.join(SCHEMES)}")
    return SCHEMES[name]
