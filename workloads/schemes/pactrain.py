"""PacTrain's communication: gradient sparsity enforcement, mask tracker, compact all-reduce.

Pruning fixes a global mask (identical on all ranks). In DDP's communication hook:

* Gradient sparsity enforcement (GSE): masked gradient entries are zeroed inside the
  hook, so masked weights (zero after pruning) stay exactly zero through SGD momentum and
  weight decay, and Adam(W): their update is always zero.
* Mask tracker: DDP hands the hook a flat bucket. The tracker maps it back to its
  parameters (``bucket.parameters()``), composes the bucket's flat mask and keys
  everything by the parameters' identities, because DDP rebuilds buckets after the
  first iteration (indices, lengths and membership change). A bucket's mask must be
  unchanged for ``stable_iters`` consecutive iterations and agreed on by all ranks
  (one all-gather of a checksum) before it is compacted; until then the dense, masked
  bucket is all-reduced. A rebuilt bucket whose parameters all sat in compact buckets is
  compact at once: its kept positions are theirs, moved (masks change only through
  ``reset``, so neither counting again nor another agreement would tell anything new).
  Records are kept per live bucket only: once DDP's rebuild has moved every parameter of an
  old bucket into new ones, the old record (a dense bucket's flat mask: 1 byte a parameter)
  is freed. Ranks that do not agree on a mask are an error (``MaskDisagreement``) naming
  which ranks hold which mask: training on would average gradients of different models.
  Under GSE the tracked mask is exactly the gradients' zero pattern the paper's tracker
  compares iteration to iteration (a masked gradient entry is zeroed in the hook; a kept
  one is almost surely nonzero), so counting unchanged masks is counting unchanged
  gradient sparsity patterns, without a pass over the gradients.
* Compact all-reduce: the unmasked elements are gathered into a dense tensor with one
  ``index_select``, all-reduced (no indices travel: the mask is global), and scattered
  back with one ``index_copy_``: no Python loop over parameters on the hot path.
* Ternary quantisation of the compact tensor (the scheme's default, as in the paper;
  ``--no-ternary`` / ``pactrain:exact`` leaves it out), as TernGrad does it (the paper
  builds PacTrain's quantisation on TernGrad): per layer, clip to 2.5 standard deviations,
  one scale = max |g| agreed by all ranks (one all-reduce MAX of the bucket's per-layer
  scales, launched without stalling the backward pass), stochastic rounding to
  {-1, 0, 1}, int8 sum (``_common.TernaryReducer``).
"""


from dataclasses import dataclass, field
from typing import cast

import torch
import torch.distributed as dist

from ._common import Accounting, BucketKeys, TernaryReducer, done_future, segments_of, ternarize  # noqa: F401 (ternarize re-exported)


@dataclass(frozen=True)
class PacTrainConfig:
    """Hyper-parameters of PacTrain's hook."""

    stable_iters: int = 3
    """K: iterations a bucket's mask must stay unchanged before it is compacted."""
    ternary: bool = False
    """Quantise the compact tensor to int8 ternary values, one scale per layer (the scheme's
    ``--ternary`` flag, on by default, sets it; this config's own default is the exact hook)."""
    clip: float = 2.5
    """ternary: clip each layer to this many standard deviations first (0: off), as TernGrad."""
    overlap: bool = True
    """The hook returns before its collectives complete (they overlap backward); False: it
    waits for them (the synchronous reference the tests compare with)."""

    def __post_init__(self):
        if self.stable_iters < 1:
            raise ValueError(f"stable_iters must be >= 1, got {self.stable_iters}")


class MaskDisagreement(RuntimeError):
    """Ranks hold different masks for one bucket (the message names them)."""


@dataclass
class _Bucket:
    mask: torch.Tensor | None  # flat bool mask (True kept) shaped like the bucket buffer; None once compact
    kept: torch.Tensor | None = None  # int64 positions of kept elements, once compact
    segments: list | None = None  # (offset, length) of each parameter in the compact tensor
    size: int = 0  # elements in the bucket's buffer
    seen: int = 0  # consecutive iterations with an identical mask


@dataclass
class PacTrainState(Accounting):
    """Internal state of the hook; masks are keyed by parameter identity."""

    process_group: dist.ProcessGroup | None
    masks: dict[int, torch.Tensor]
    """id(parameter) -> bool mask of the same shape (True = kept)."""
    config: PacTrainConfig = field(default_factory=PacTrainConfig)
    payload_bytes: int = 0
    """Bytes this rank handed to collectives since the last ``take_payload_bytes``."""
    _buckets: dict[tuple[int, ...], _Bucket] = field(default_factory=dict)
    _keys: BucketKeys = field(default_factory=BucketKeys)
    _where: dict[int, tuple[tuple[int, ...], int, int]] = field(default_factory=dict)
    """id(parameter) -> (key of its compact bucket, offset in that bucket's buffer, numel)."""
    _owner: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """id(parameter) -> key of the record (in ``_buckets``) that holds it."""
    names: dict[int, str] = field(default_factory=dict)
    """id(parameter) -> its name (for error messages)."""
    control_bytes: int = 0
    """Bytes of the mask agreements' checksums (cumulative; part of ``payload_bytes``)."""
    dense_iterations: int = 0
    """Iterations in which no bucket was sent compact (counted by ``take_payload_bytes``)."""
    _compact_now: bool = False
    ternary: TernaryReducer | None = None
    """The per-layer ternary all-reduce (config.ternary); made by ``for_model``."""

    @classmethod
    def for_model(cls, model: torch.nn.Module, masks: "dict[str, torch.Tensor]", process_group=None,
                  config: "PacTrainConfig | None" = None) -> "PacTrainState":
        """``masks`` by parameter name (as from ``named_parameters()``); others are dense."""
        by_id = {}
        for name, p in model.named_parameters():
            m = masks.get(name)
            by_id[id(p)] = (m.to(device=p.device, dtype=torch.bool) if m is not None
                            else torch.ones_like(p, dtype=torch.bool))
        state = cls(process_group, by_id, config or PacTrainConfig())
        state.names = {id(p): name for name, p in model.named_parameters()}
        if state.config.ternary:  # collective (new process groups): every rank gets here
            state.ternary = TernaryReducer(process_group, None, state.config.clip)
        return state

    def take_payload_bytes(self) -> int:
        """Bytes since the last call (once per iteration); counts a dense iteration."""
        self.dense_iterations += not self._compact_now
        self._compact_now = False
        return super().take_payload_bytes()

    def stats(self) -> dict:
        """For the summary (``workloads.summary``): iterations that ran dense, control bytes."""
        return {"dense_iterations": self.dense_iterations, "control_bytes": self.control_bytes}

    def compact_buckets(self) -> int:
        return sum(1 for b in self._buckets.values() if b.kept is not None)

    # ------------------------------------------------------------------ tracker
    def reset(self, masks: dict[int, torch.Tensor] | None = None) -> None:
        """Forget every bucket's tracking (call after re-pruning, with the new masks)."""
        if masks is not None:
            self.masks = masks
        self._buckets.clear()
        self._where.clear()
        self._owner.clear()

    def _track(self, bucket) -> _Bucket:
        key = self._keys(bucket)
        b = self._buckets.get(key)
        if b is not None and b.kept is not None:
            return b  # stable and agreed: the hot path does no mask work (masks change only via reset)
        if b is None and (moved := self._moved(key, bucket)) is not None:
            return moved
        flat = torch.cat([self.masks[id(p)].reshape(-1) for p in bucket.parameters()])
        # (a bucket not yet compact, as b is here, still has its mask)
        if b is None or not torch.equal(cast(torch.Tensor, b.mask), flat):
            b = self._buckets[key] = _Bucket(flat, size=flat.numel())  # new membership (rebuild) or changed mask
            self._claim(key, bucket)
        b.seen += 1
        if b.kept is None and b.seen >= self.config.stable_iters:
            kept = flat.nonzero().squeeze(1)
            try:
                self._agreed(kept)
            except MaskDisagreement as e:
                names = [self.names.get(id(p), "?") for p in bucket.parameters()]
                raise MaskDisagreement(f"{e}, in the bucket of {', '.join(names[:4])}"
                                       f"{f' and {len(names) - 4} more' if len(names) > 4 else ''}") from None
            b.kept, b.mask = kept, None  # the positions say it all from now on
            b.segments = segments_of(bucket, flat,
                                     {id(p): int(self.masks[id(p)].sum()) for p in bucket.parameters()})
            self._settle(key, bucket)
        return b

    def _claim(self, key: tuple[int, ...], bucket) -> None:
        """``key``'s record now holds the bucket's parameters: free the records (and compact
        positions) of buckets DDP's rebuild has taken every parameter from."""
        before = set(self._owner.values())
        for p in bucket.parameters():
            self._owner[id(p)] = key
        gone = before - set(self._owner.values()) - {key}
        if gone:
            for g in gone:
                self._buckets.pop(g, None)
            self._where = {p: w for p, w in self._where.items() if w[0] not in gone}

    def _moved(self, key: tuple[int, ...], bucket) -> "_Bucket | None":
        """A new bucket (DDP's rebuild) made only of parameters that sat in compact buckets:
        compact now, its kept positions cut from theirs and shifted (no pass over the masks,
        no collective). None when any parameter is new to compaction."""
        params = list(bucket.parameters())
        old = [w for p in params if (w := self._where.get(id(p))) is not None]
        if not params or len(old) < len(params):
            return None
        pieces, counts, off = [], {}, 0
        for p, (okey, ooff, n) in zip(params, old):
            ok = self._buckets[okey].kept
            assert ok is not None  # _where holds positions in compact buckets only
            lo, hi = torch.searchsorted(ok, torch.tensor([ooff, ooff + n], device=ok.device)).tolist()
            pieces.append(ok[lo:hi] - (ooff - off))
            counts[id(p)] = hi - lo
            off += n
        kept = torch.cat(pieces)
        b = self._buckets[key] = _Bucket(None, kept=kept, size=off, seen=1)
        b.segments = segments_of(bucket, kept, counts)
        self._claim(key, bucket)  # the old buckets' positions live on in the new ones
        self._settle(key, bucket)
        return b

    def _settle(self, key: tuple[int, ...], bucket) -> None:
        """Record where a compact bucket's parameters sit (for ``_moved``)."""
        off = 0
        for p in bucket.parameters():
            self._where[id(p)] = (key, off, p.numel())
            off += p.numel()

    def _agreed(self, kept: torch.Tensor) -> bool:
        """True when all ranks hold the same mask, else ``MaskDisagreement`` naming the ranks
        (every rank raises it: they all see the same checksums). The checksums of the kept
        positions (their count, their sum and a sum of hashed positions, exact in int64 for
        any model that fits in memory) are all-gathered: 24 bytes a rank, counted as payload.
        """
        s = torch.stack([torch.tensor(kept.numel(), device=kept.device), kept.sum(),
                         (kept * 2654435761 % 2147483647).sum()])
        every = [torch.empty_like(s) for _ in range(dist.get_world_size(self.process_group))]
        dist.all_gather(every, s, group=self.process_group)
        self.payload_bytes += s.numel() * s.element_size()
        self.control_bytes += s.numel() * s.element_size()
        sums = [tuple(t.tolist()) for t in every]
        if len(set(sums)) == 1:
            return True
        ranks = (list(range(len(sums))) if self.process_group is None
                 else dist.get_process_group_ranks(self.process_group))
        holders: dict[tuple, list[int]] = {}
        for r, c in zip(ranks, sums):
            holders.setdefault(c, []).append(r)
        said = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} "
                         f"{'hold' if len(rs) > 1 else 'holds'} a mask of {c[0]} kept entries"
                         for c, rs in holders.items())
        raise MaskDisagreement(f"PacTrain: the ranks' pruning masks differ ({said})")


def _scatter(buf: torch.Tensor, kept: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The bucket buffer with ``values`` at the kept positions and zeros elsewhere."""
    buf.zero_()
    return buf.index_copy_(0, kept, values)


def pactrain_hook(state: PacTrainState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: dense masked all-reduce until stable, then compact all-reduce."""
    fut = _pactrain_reduce(state, bucket)
    if state.config.overlap:
        return fut
    return done_future(fut.wait())


def _pactrain_reduce(state: PacTrainState, bucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    group = state.process_group
    world = dist.get_world_size(group)
    b = state._track(bucket)
    kept = b.kept  # (once set, a bucket's kept positions never change)
    if kept is None:  # not yet stable: dense all-reduce of the masked gradient
        buf.mul_(b.mask)
        state.payload_bytes += buf.numel() * buf.element_size()
        fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].div_(world))
    state._compact_now = True
    compact = buf.index_select(0, kept)
    if state.ternary is not None:
        # two collectives in sequence (the scales, then the int8 sum quantised against them),
        # both launched off this thread: the hook returns at once
        assert b.segments is not None  # set with kept
        fut, sent = state.ternary.reduce(compact, b.segments)
        state.payload_bytes += sent
        return fut.then(lambda f: _scatter(buf, kept, f.value()))
    state.payload_bytes += compact.numel() * compact.element_size()
    fut = dist.all_reduce(compact, group=group, async_op=True).get_future()
    return fut.then(lambda f: _scatter(buf, kept, f.value()[0].div_(world)))


def attach(ddp, opts, masks=None) -> PacTrainState:
    """Register the hook on ``ddp``; ``masks`` by parameter name (None: nothing pruned)."""
    state = PacTrainState.for_model(ddp.module, masks or {}, opts.process_group,
                                    PacTrainConfig(stable_iters=opts.stable_iters, ternary=opts.ternary,
                                                   clip=opts.terngrad_clip))
    rank = dist.get_rank(opts.process_group)
    if state.ternary is not None:
        state.ternary.generator = torch.Generator(device=opts.device).manual_seed(opts.seed * 1000 + rank)
    ddp.register_comm_hook(state, pactrain_hook)
    return state
