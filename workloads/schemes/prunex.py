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
  every rank projects identically; the all-reduce is counted in ``payload_bytes`` and
  ``control_bytes``) and U += W - Z.
  **Dynamic compaction**: a channel zero in ``stable`` consecutive projections is pruned
  then: its rows of the layer's weight and bias and of the following batch norm's scale
  and shift (and that norm's running statistics) are set to zero, with their momentum, Z
  and U; it stays zero in every later projection (norm 0), and the leaders' exchange
  leaves it out from the next iteration on, so inter-switch bytes fall during the ADMM
  phase once its zero sets settle (early on, U lifts the channels Z zeroes back into the
  next projection, and nothing is stable). At ``prune_at`` (a fraction of the run's iterations) the masks are fixed from
  the same projection of W, pruning the rest the same way. ``admm_every`` 0 (the default)
  spaces the updates so that at least ``MIN_ADMM_UPDATES`` (15) happen before ``prune_at``
  (every iteration when ``prune_at`` is shorter); the summary counts the updates
  (``admm_updates``), the compaction events (``compaction_events``: projections that
  pruned a channel) and the channels they pruned (``compacted_channels``). Leaders exchange only the
  kept channels, compacted with one ``index_select`` (no indices travel: all ranks hold
  the same mask, as in PacTrain); pruned positions receive zero, so pruned weights (and
  batch-norm parameters) stay zero and a pruned channel outputs exactly zero.
  ``buffer_bytes`` records the exchanged buffers' size per iteration, ``dense_iterations``
  how many iterations exchanged every gradient.
* **Overlap** (both schemes): the hook hands each bucket's three steps to a communication
  thread (``_common.CommThread``) and returns; the thread runs them bucket after bucket, so
  they overlap the rest of backward as DDP's all-reduce does (``overlap=False``: the hook
  runs them itself, the synchronous reference).

Differences from the paper: one level of hierarchy (switch domains; hosts once the
testbed spans several), the node-level Z is the global one (DDP keeps weights identical
across ranks, so the node and global problems coincide: a domain projecting from its own
ranks' norms gets the global masks, tested), and sparsity is per layer.
"""


import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from ._common import Accounting, BucketKeys, CommThread, done_future


@dataclass
class HierState(Accounting):
    world: int = 1
    rank: int = 0
    intra: dist.ProcessGroup | None = None
    """Process group of this rank's domain (None: a domain of one)."""
    leaders: dist.ProcessGroup | None = None
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
    step_sent: int = 0
    """Bytes of the (compacted) buffers the leaders exchange, this iteration so far."""
    step_dense: int = 0
    """The same buffers' dense bytes."""
    overlap: bool = False
    """Run each bucket's collectives on ``comm`` so they overlap backward (``attach`` and
    ``attach_hier`` turn it on; off, the hook runs them itself: the synchronous reference)."""
    comm: CommThread = field(default_factory=lambda: CommThread("hier-comm"), repr=False, compare=False)

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
    """DDP communication hook of both schemes: with ``state.overlap`` the bucket's
    collectives run on the state's communication thread and the future completes when they
    have (backward goes on meanwhile); without, they run here, and the future is done."""
    buf = bucket.buffer()
    kept = state.positions(bucket)  # reads the bucket: here, not on the thread
    if not state.overlap or state.world == 1:
        return done_future(hier_reduce(state, buf, kept))
    return state.comm.submit(lambda: hier_reduce(state, buf, kept), buf.device)


def hier_reduce(state: HierState, buf: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    """The bucket ``buf`` averaged over all ranks in place, synchronously: domain all-reduce,
    the leaders' exchange of the ``kept`` positions (None: all), broadcast in the domain."""
    if state.intra is not None:
        dist.all_reduce(buf, group=state.intra)
        state.payload_bytes += buf.numel() * buf.element_size()
    x = buf if kept is None else buf.index_select(0, kept)
    state.step_sent += x.numel() * x.element_size()
    state.step_dense += buf.numel() * buf.element_size()
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
    return buf.div_(state.world)


def hier_groups(placement) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None, int]:
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
_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@dataclass
class _Layer:
    name: str
    weight: torch.Tensor
    """A parameter (or what a parametrization makes of one)."""
    bias: torch.Tensor | None
    keep: int
    """Output channels kept."""
    bn: nn.Module | None = None
    """The batch norm applied to its output (masked with it), if any."""

    def params(self) -> list[torch.Tensor]:
        """Parameters whose first dimension is the output channel: weight, bias, the BN's affine pair."""
        ps = [self.weight, self.bias] + ([self.bn.weight, self.bn.bias] if self.bn is not None else [])
        return [p for p in ps if isinstance(p, torch.Tensor)]  # (None: no bias, or a BN without affine)


def channel_layers(model: nn.Module, sparsity: float) -> list[_Layer]:
    """Conv/linear layers whose output channels are pruned: all but the last (the classifier).

    A layer's batch norm is the leaf module registered right after it, when that is a
    BatchNorm over as many channels (conv -> bn, as every model in ``workloads.models`` and
    torchvision's ResNets/VGGs register them); ``tests/workloads/test_prunex_paper.py``
    checks that every pruned channel then outputs exactly zero."""
    leaves = [(n, m) for n, m in model.named_modules() if not any(True for _ in m.children())]
    out = []
    for i, (n, m) in enumerate(leaves):
        if not isinstance(m, (nn.Conv2d, nn.Linear)):
            continue
        nxt = leaves[i + 1][1] if i + 1 < len(leaves) else None
        bn = nxt if isinstance(nxt, _BN) and nxt.num_features == m.weight.shape[0] else None
        out.append(_Layer(n, m.weight, m.bias, max(1, math.ceil((1 - sparsity) * m.weight.shape[0])), bn))
    return out[:-1]


def _rows(m: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A per-row mask broadcast to ``p``'s shape."""
    return m.view(-1, *[1] * (p.dim() - 1)).expand(p.shape)


@dataclass
class PruneXState(HierState):
    layers: list = field(default_factory=list)
    rho: float = 0.1
    admm_every: int = 10
    prune_at: int = 0
    """Iteration after which the masks are fixed."""
    stable: int = 3
    """Dynamic compaction: a channel zero in this many consecutive ADMM projections is
    pruned at once (weights, BN, momentum, Z, U) and leaves the leaders' exchange (0: off)."""
    Z: list = field(default_factory=list)
    U: list = field(default_factory=list)
    alive: list = field(default_factory=list)
    """Per layer, bool per output channel: not pruned (yet)."""
    zero_runs: list = field(default_factory=list)
    """Per layer, per channel: consecutive ADMM projections in which it was zero."""
    iteration: int = 0
    fixed: bool = False
    """The masks are final (after ``prune_at``)."""
    control_bytes: int = 0
    """Bytes of the norm all-reduces (part of payload_bytes), all iterations."""
    dense_iterations: int = 0
    """Iterations whose exchange carried every gradient (no channel compacted out)."""
    admm_updates: int = 0
    """Z/U updates (projections of W + U) before the masks were fixed."""
    compaction_events: int = 0
    """ADMM projections after which dynamic compaction pruned at least one channel."""
    compacted_channels: int = 0
    """Channels pruned by dynamic compaction (before the masks were fixed)."""
    buffer_bytes: list = field(default_factory=list)
    """Per iteration, bytes of the (compacted) buffers the leaders exchanged."""

    @torch.no_grad()
    def _row_masks(self, tensors: list[torch.Tensor], group=None) -> list[torch.Tensor]:
        """Per layer, True for the rows (output channels) with the largest L2 norms; the norms
        are summed over ``group``'s ranks (all ranks by default), so its ranks agree."""
        norms = torch.cat([t.reshape(t.shape[0], -1).float().norm(dim=1) for t in tensors])
        dist.all_reduce(norms, group=group)  # identical on all ranks, whatever the float noise
        n = norms.numel() * norms.element_size()
        self.payload_bytes += n
        self.control_bytes += n
        out, off = [], 0
        for layer, t in zip(self.layers, tensors):
            nrm = norms[off:off + t.shape[0]]
            off += t.shape[0]
            m = torch.zeros(t.shape[0], dtype=torch.bool, device=t.device)
            m[nrm.topk(layer.keep, sorted=False).indices] = True  # ties: topk's order, same on all ranks
            out.append(m)
        return out

    @torch.no_grad()
    def _project(self, tensors: list[torch.Tensor], group=None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(Z, row masks): ``tensors`` projected onto their kept rows."""
        rows = self._row_masks(tensors, group)
        return [t * _rows(m, t) for t, m in zip(tensors, rows)], rows

    def start(self) -> None:
        ws = [l.weight.detach() for l in self.layers]
        self.Z, _ = self._project(ws)
        self.U = [torch.zeros_like(w) for w in ws]
        self.alive = [torch.ones(w.shape[0], dtype=torch.bool, device=w.device) for w in ws]
        self.zero_runs = [torch.zeros(w.shape[0], dtype=torch.long, device=w.device) for w in ws]

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
        self.buffer_bytes.append(self.step_sent)
        self.dense_iterations += self.step_sent == self.step_dense
        self.step_sent = self.step_dense = 0
        if self.fixed:
            self._mask_bn()
            return
        ws = [l.weight.detach() for l in self.layers]
        if self.iteration >= self.prune_at:
            self._apply(self._row_masks(ws), optimizer)
            self.fixed = True
            self.Z, self.U = [], []
        elif self.iteration % self.admm_every == 0:
            self.admm_updates += 1
            self.Z, rows = self._project([w + u for w, u in zip(ws, self.U)])
            for w, z, u in zip(ws, self.Z, self.U):
                u.add_(w - z)
            self._compact(rows, optimizer)
        else:
            self._mask_bn()

    def _compact(self, rows: list[torch.Tensor], optimizer) -> None:
        """Prune the channels zero in the last ``stable`` projections (``rows``: the latest)."""
        if not self.stable:
            return
        alive = []
        for runs, m in zip(self.zero_runs, rows):
            runs.add_(1).mul_(~m)
            alive.append(runs < self.stable)
        if any(bool((a != b).any()) for a, b in zip(alive, self.alive)):
            before = sum(int(a.sum()) for a in self.alive)
            self._apply(alive, optimizer)
            self.compaction_events += 1
            self.compacted_channels += before - sum(int(a.sum()) for a in self.alive)
        else:
            self._mask_bn()

    def _apply(self, alive: list[torch.Tensor], optimizer) -> None:
        """Prune every channel not ``alive`` (cumulative): zero its rows of the layer's
        parameters, their momentum, Z and U, and mask their gradients from now on."""
        masks = {}
        for i, (l, m) in enumerate(zip(self.layers, alive)):
            m = m & self.alive[i]
            self.alive[i] = m
            if bool(m.all()):
                continue
            for p in l.params():
                mask = _rows(m, p).clone()
                p.mul_(mask)
                buf = optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    buf.mul_(mask)
                masks[id(p)] = mask
            for t in (self.Z[i:i + 1] + self.U[i:i + 1]) if self.Z else ():
                t.mul_(_rows(m, t))
        self.masks = masks
        self.kept.clear()
        self._mask_bn()

    @torch.no_grad()
    def _mask_bn(self) -> None:
        """Pruned channels' batch-norm parameters and running statistics stay zero."""
        for l, m in zip(self.layers, self.alive):
            if l.bn is None or bool(m.all()):
                continue
            for t in (l.bn.weight, l.bn.bias, l.bn.running_mean, l.bn.running_var):
                if t is not None:
                    t.mul_(m)

    def kept_fraction(self) -> float:
        """Of the pruned layers' weights, the fraction not pruned (yet)."""
        tot = sum(l.weight.numel() for l in self.layers)
        return sum(int(m.sum()) * l.weight[0].numel() for l, m in zip(self.layers, self.alive)) / max(1, tot)

    def stats(self) -> dict:
        """For the summary (``workloads.summary``): iterations that ran dense, control bytes,
        how often H-SADMM and dynamic compaction acted."""
        return {"dense_iterations": self.dense_iterations, "control_bytes": self.control_bytes,
                "admm_updates": self.admm_updates, "admm_every": self.admm_every,
                "compaction_events": self.compaction_events, "compacted_channels": self.compacted_channels}


MIN_ADMM_UPDATES = 15
"""``admm_every`` 0 (auto) gives at least this many Z/U updates before the masks are fixed."""


def admm_interval(every: int, prune_at: int) -> int:
    """Iterations between Z/U updates: ``every``, or (0) the largest interval that fits
    ``MIN_ADMM_UPDATES`` updates before iteration ``prune_at`` (1 when fewer fit)."""
    return every if every > 0 else max(1, (prune_at - 1) // MIN_ADMM_UPDATES)


def attach_hier(ddp, opts, masks=None) -> HierState:
    state = _hier_state(HierState, opts, overlap=True)
    ddp.register_comm_hook(state, hier_hook)
    return state


def prunex_state(model: nn.Module, opts) -> PruneXState:
    """PruneX's state for ``model`` (collective: every rank calls it), its projection started."""
    prune_at = max(1, round(opts.prunex_prune_at * max(1, opts.total_iters)))
    state = _hier_state(PruneXState, opts, layers=channel_layers(model, opts.prunex_sparsity),
                        rho=opts.prunex_rho, admm_every=admm_interval(opts.prunex_admm_every, prune_at),
                        prune_at=prune_at)
    state.start()
    return state


def attach(ddp, opts, masks=None) -> PruneXState:
    state = prunex_state(ddp.module, opts)
    state.overlap = True
    ddp.register_comm_hook(state, hier_hook)
    return state
