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
    params: tuple[str, ...] = ()
    """Hyper-parameters (workloads.train argument names) that change this scheme's results:
    recorded in the summary, and what report tells variants apart by."""
    positional: tuple[str, ...] = ()
    """Parameters that bare values in a variant spec set, in order (``topk:0.1``)."""
    words: tuple[tuple[str, str, str], ...] = ()
    """(word, parameter, value): bare words in a variant spec (``pactrain:0.5:ternary``)."""

    @property
    def attach(self) -> Callable:
        return getattr(import_module(f"{__name__}.{self.module}"), self.function)


_PACTRAIN_WORDS = (("ternary", "ternary", "true"), ("magnitude", "prune_method", "magnitude"),
                   ("grasp", "prune_method", "grasp"))

SCHEMES: dict[str, Scheme] = {s.name: s for s in [
    Scheme("allreduce", "DDP's default all-reduce (no hook)", "allreduce"),
    Scheme("fp16", "torch's fp16 compression hook", "fp16"),
    Scheme("topk", "top-k with error feedback, all-gather of values + int32 indices", "topk",
           params=("topk_ratio",), positional=("topk_ratio",)),
    Scheme("powersgd", "torch's PowerSGD hook", "powersgd", params=("powersgd_rank", "powersgd_start_iter"),
           positional=("powersgd_rank",)),
    Scheme("terngrad", "ternary stochastic quantisation, per-layer max scale, clipped, int8 sum", "terngrad",
           params=("terngrad_clip",), positional=("terngrad_clip",)),
    Scheme("pactrain", "pruning + mask tracker + compact all-reduce (+ ternary)", "pactrain", prunes=True,
           params=("prune_ratio", "prune_method", "ternary", "stable_iters", "terngrad_clip"),
           positional=("prune_ratio",), words=_PACTRAIN_WORDS),
    Scheme("spardl", "SparDL: sparse reduce-scatter, global residual collection, Bruck all-gather", "spardl",
           params=("spardl_density", "spardl_teams"), positional=("spardl_density",)),
    Scheme("prunex", "PruneX: ADMM channel pruning + hierarchical compact all-reduce via switch leaders", "prunex",
           params=("prunex_sparsity", "prunex_rho", "prunex_admm_every", "prunex_prune_at"),
           positional=("prunex_sparsity",)),
    Scheme("hier-allreduce", "dense hierarchical all-reduce via switch leaders (PruneX without pruning)", "prunex",
           function="attach_hier"),
]}


def get(name: str) -> Scheme:
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; choose one of: {', '.join(SCHEMES)}")
    return SCHEMES[name]


VARIANT_HELP = ("a scheme, or a variant NAME:VALUE[:...] setting its hyper-parameters, e.g. topk:0.1, "
                "pactrain:0.8:ternary, powersgd:8, terngrad:clip=0, pactrain:0.5:grasp:stable_iters=5")


def parse_variant(spec: str) -> tuple[Scheme, dict[str, str]]:
    """``topk:0.1`` -> (topk, {"topk_ratio": "0.1"}): a scheme name, then bare values for its
    positional parameters in order, words it knows (``ternary``, ``grasp``) and
    ``param=value`` for any of its parameters. Values stay strings (the train parser
    converts and checks them); ValueError names what is wrong."""
    if not isinstance(spec, str) or not spec:
        raise ValueError("the scheme is empty; " + VARIANT_HELP)
    name, *tokens = spec.split(":")
    scheme = get(name)
    values: dict[str, str] = {}
    free = list(scheme.positional)
    words = {w: (k, v) for w, k, v in scheme.words}
    for tok in tokens:
        if "=" in tok:
            key, val = tok.split("=", 1)
            key = key.replace("-", "_")
            short = {p.removeprefix(f"{name}_"): p for p in scheme.params}
            key = short.get(key, key)
            if key not in scheme.params:
                raise ValueError(f"scheme variant {spec!r}: {name} has no parameter {key!r}; "
                                 f"its parameters: {', '.join(scheme.params) or 'none'}")
        elif tok in words:
            key, val = words[tok]
        else:
            while free and free[0] in values:  # set by name already
                free.pop(0)
            if not free:
                hint = f"; words: {', '.join(words)}" if words else ""
                raise ValueError(f"scheme variant {spec!r}: unexpected {tok!r} "
                                 f"({name} takes {len(scheme.positional)} bare value(s){hint}); " + VARIANT_HELP)
            key, val = free.pop(0), tok
        if not val:
            raise ValueError(f"scheme variant {spec!r}: {key} has no value")
        if key in values:
            raise ValueError(f"scheme variant {spec!r}: {key} is set twice")
        values[key] = val
    return scheme, values
