"""Gradient-communication schemes, one module each, registered by name.

Every scheme module has ``attach(ddp, opts, masks=None) -> state``: it registers its DDP
communication hook (if any) and returns a documented state object whose
``take_payload_bytes()`` gives the bytes this rank handed to collectives since the last
call. The train loop calls it once per iteration, and, where the state has them,
``before_step()`` between backward and the optimizer step and ``after_step(optimizer)``
after it (PruneX's ADMM penalty and updates).
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
    placement: object = None
    """workloads.placement.Placement of all ranks (domains = switches under testbed)."""
    total_iters: int = 1
    """Iterations the run will make (schedules that are fractions of the run)."""
    spardl_density: float = 0.01
    """spardl: fraction of each block's entries sent per message."""
    spardl_teams: str = "auto"
    """spardl: 1, switch (a team per domain) or auto (switch when domains are equal)."""
    prunex_sparsity: float = 0.5
    """prunex: fraction of output channels removed per layer."""
    prunex_rho: float = 0.1
    """prunex: ADMM penalty weight."""
    prunex_admm_every: int = 10
    """prunex: iterations between Z/U updates."""
    prunex_prune_at: float = 0.3
    """prunex: fraction of the run after which the channel masks are fixed."""


@dataclass(frozen=True)
class Scheme:
    name: str
    summary: str
    module: str
    prunes: bool = False
    """The train loop prunes the model (global mask) before attaching the scheme."""

    function: str = "attach"
    """The module's attach function."""

    @property
    def attach(self) -> Callable:
        return getattr(import_module(f"{__name__}.{self.module}"), self.function)


SCHEMES: dict[str, Scheme] = {s.name: s for s in [
    Scheme("allreduce", "DDP's default all-reduce (no hook)", "allreduce"),
    Scheme("fp16", "torch's fp16 compression hook", "fp16"),
    Scheme("topk", "top-k with error feedback, all-gather of values + int32 indices", "topk"),
    Scheme("powersgd", "torch's PowerSGD hook", "powersgd"),
    Scheme("terngrad", "ternary stochastic quantisation, shared max scale, int8 sum", "terngrad"),
    Scheme("pactrain", "pruning + mask tracker + compact all-reduce (+ ternary)", "pactrain", prunes=True),
    Scheme("spardl", "SparDL: sparse reduce-scatter, global residual collection, Bruck all-gather", "spardl"),
    Scheme("prunex", "PruneX: ADMM channel pruning + hierarchical compact all-reduce via switch leaders", "prunex"),
    Scheme("hier-allreduce", "dense hierarchical all-reduce via switch leaders (PruneX without pruning)", "prunex",
           function="attach_hier"),
]}


def get(name: str) -> Scheme:
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; choose one of: {', '.join(SCHEMES)}")
    return SCHEMES[name]
