"""``prunex`` and ``hier-allreduce``: hierarchical synchronisation over the topology's domains.

PruneX (Olama et al., arXiv 2512.14628) for DDP, with a domain = the ranks behind one
switch (``workloads.placement``):

* **Leader-follower synchronisation** (both schemes): each bucket is all-reduced densely
  inside the domain (fast links); the domain's first rank (its leader) all-reduces the
  domain sums with the other leaders (the only traffic between switches), then
  broadcasts the result inside its domain. ``hier-allreduce`` stops there (dense): the
  baseline that separates the gain of hierarchy from the gain of pruning.
* **H-SADMM structured pruning** (``prunex``): conv filters and linear rows (the output
  channels of every conv/linear layer but the classifier) are driven towards a channel
  mask by an ADMM penalty during the first part of training: the gradient of
  rho/2 ||W - Z + U||^2 is added after synchronisation (it is the same on every rank),
  and every ``admm_every`` iterations Z = the projection of W + U onto the kept channels
  of each layer (the largest row L2 norms; norms summed over ranks in one all-reduce, so
  every rank projects identically) and U += W - Z.
  At ``prune_at`` (a fraction of the run's iterations) the masks are fixed from the same
  projection of W: pruned rows (and their biases) are set to zero, with their momentum,
  and from then on leaders exchange only the kept channels, compacted with one
  ``index_select`` (no indices travel: all ranks hold the same mask, as in PacTrain);
  pruned positions receive zero, so pruned weights stay zero.

Differences from the paper: one level of hierarchy (switch domains; hosts once the
testbed spans several), the node-level Z is the global one (DDP keeps weights identical
across ranks, so the node and global problems coincide), and sparsity is per layer.
"""


import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from ._common import Accounting, BucketKeys


@dataclass
class HierState(Accounting):
    world: int = 1
    rank: int = 0
    intra: object = None
    """Process group of this rank's domain (None: a domain of one)."""
    leaders: object = None
    """Process group of the domains' leaders, on leaders only (None: not a leader, or one domain)."""
    leader: int = 0
    """Global rank of this domain's leader."""
    domains: int = 1
    masks: dict = field(default_factory=dict)
    """id(parameter) -> bool mask (True = kept); empty while dense."""
    keys: BucketKeys = field(default_factory=BucketKeys)
    kept: dict = field(default_factory=dict)
    """Bucket key -> int64 positions of kept elements (None: the bucket is dense)."""
    inter_payload_bytes: int = 0
    """Bytes this rank handed to the leaders' all-reduce (inter-domain), all iterations."""

    def positions(self, bucket) -> torch.Tensor | None:
        if not self.masks:
            return None
        key = self.keys(bucket)
        if key not in self.kept:
            flat = torch.cat([self.masks[id(p)].reshape(-1) if id(p) in self.masks
                              else torch.ones(p.numel(), dtype=torch.bool, device=p.device)
                              for p in bucket.parameters()])
            self.kept[key] = None if bool(flat.all()) else flat.nonzero().squeeze(1)
        return self.kept[key]


def hier_hook(state: HierState, bucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    kept = state.positions(bucket)
    if state.intra is not None:
        dist.all_reduce(buf, group=state.intra)
        state.payload_bytes += buf.numel() * buf.element_size()
    x = buf if kept is None else buf.index_select(0, kept)
    if state.domains > 1:
        if state.leaders is not None:
            dist.all_reduce(x, group=state.leaders)
            n = x.numel() * x.element_size()
            state.payload_bytes += n
            state.inter_payload_bytes += n
        if state.intra is not None:
            dist.broadcast(x, src=state.leader, group=state.intra)
            if state.rank == state.leader:
                state.payload_bytes += x.numel() * x.element_size()
    if kept is not None:  # pruned positions receive zero
        buf.zero_().index_copy_(0, kept, x)
    buf.div_(state.world)
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(buf)
    return fut


def hier_groups(placement) -> tuple[object, object, int]:
    """(intra group, leaders group, leader rank) for this rank; every rank creates every group."""
    intra = leaders = None
    for g in placement.groups:  # dist.new_group is collective: same calls, same order, on all ranks
        pg = dist.new_group(list(g)) if len(g) > 1 else None
        if placement.rank in g:
            intra = pg
    if len(placement.groups) > 1:
        pg = dist.new_group(list(placement.leaders))
        if placement.rank in placement.leaders:
            leaders = pg
    return intra, leaders, placement.members[0]


def _hier_state(cls, opts, **kw):
    intra, leaders, leader = hier_groups(opts.placement)
    return cls(world=dist.get_world_size(), rank=dist.get_rank(), intra=intra, leaders=leaders, leader=leader,
               domains=len(opts.placement.groups), **kw)


# ---------------------------------------------------------------- H-SADMM
@dataclass
class _Layer:
    name: str
    weight: nn.Parameter
    bias: nn.Parameter | None
    keep: int
    """Output channels kept."""


def channel_layers(model: nn.Module, sparsity: float) -> list[_Layer]:
    """Conv/linear layers whose output channels are pruned: all but the last (the classifier)."""
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    return [_Layer(n, m.weight, m.bias, max(1, math.ceil((1 - sparsity) * m.weight.shape[0])))
            for n, m in mods[:-1]]


@dataclass
class PruneXState(HierState):
    layers: list = field(default_factory=list)
    rho: float = 0.1
    admm_every: int = 10
    prune_at: int = 0
    """Iteration after which the masks are fixed."""
    Z: list = field(default_factory=list)
    U: list = field(default_factory=list)
    iteration: int = 0

    @property
    def fixed(self) -> bool:
        return bool(self.masks)

    @torch.no_grad()
    def _row_masks(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per layer, True for the rows (output channels) with the largest L2 norms."""
        norms = torch.cat([t.reshape(t.shape[0], -1).float().norm(dim=1) for t in tensors])
        dist.all_reduce(norms)  # identical on all ranks, whatever the float noise
        out, off = [], 0
        for layer, t in zip(self.layers, tensors):
            n = norms[off:off + t.shape[0]]
            off += t.shape[0]
            m = torch.zeros(t.shape[0], dtype=torch.bool, device=t.device)
            m[n.topk(layer.keep, sorted=False).indices] = True  # ties: topk's order, same on all ranks
            out.append(m)
        return out

    @torch.no_grad()
    def _project(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t * m.view(-1, *[1] * (t.dim() - 1)) for t, m in zip(tensors, self._row_masks(tensors))]

    def start(self) -> None:
        ws = [l.weight.detach() for l in self.layers]
        self.Z = self._project(ws)
        self.U = [torch.zeros_like(w) for w in ws]

    @torch.no_grad()
    def before_step(self) -> None:
        """Add the ADMM penalty's gradient rho (W - Z + U) (after synchronisation)."""
        if self.fixed:
            return
        for l, z, u in zip(self.layers, self.Z, self.U):
            if l.weight.grad is not None:
                l.weight.grad.add_(l.weight - z + u, alpha=self.rho)

    @torch.no_grad()
    def after_step(self, optimizer) -> None:
        self.iteration += 1
        if self.fixed:
            return
        ws = [l.weight.detach() for l in self.layers]
        if self.iteration >= self.prune_at:
            self._fix(self._row_masks(ws), optimizer)
        elif self.iteration % self.admm_every == 0:
            self.Z = self._project([w + u for w, u in zip(ws, self.U)])
            for w, z, u in zip(ws, self.Z, self.U):
                u.add_(w - z)

    def _fix(self, rows: list[torch.Tensor], optimizer) -> None:
        masks = {}
        for l, m in zip(self.layers, rows):
            for p in (l.weight, l.bias):
                if p is None:
                    continue
                mask = m.view(-1, *[1] * (p.dim() - 1)).expand(p.shape).clone()
                p.mul_(mask)
                buf = optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    buf.mul_(mask)
                masks[id(p)] = mask
        self.masks = masks
        self.kept.clear()
        self.Z, self.U = [], []

    def kept_fraction(self) -> float:
        """Of the pruned layers' weights, the fraction kept (1 before the masks are fixed)."""
        if not self.fixed:
            return 1.0
        tot = sum(l.weight.numel() for l in self.layers)
        return sum(int(self.masks[id(l.weight)].sum()) for l in self.layers) / tot


def attach_hier(ddp, opts, masks=None) -> HierState:
    state = _hier_state(HierState, opts)
    ddp.register_comm_hook(state, hier_hook)
    return state


def attach(ddp, opts, masks=None) -> PruneXState:
    state = _hier_state(PruneXState, opts, layers=channel_layers(ddp.module, opts.prunex_sparsity),
                        rho=opts.prunex_rho, admm_every=opts.prunex_admm_every,
                        prune_at=max(1, round(opts.prunex_prune_at * max(1, opts.total_iters))))
    state.start()
    ddp.register_comm_hook(state, hier_hook)
    return state
