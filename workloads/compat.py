"""What differs between the torch versions we support (``torch>=2.2``; CI pins 2.13, CUDA
images often ship older ones: the H100 image had 2.11)."""

from __future__ import annotations

import functools
import inspect

from torch.nn.parallel import DistributedDataParallel


@functools.cache
def _ddp_params() -> frozenset[str]:
    return frozenset(inspect.signature(DistributedDataParallel.__init__).parameters)


def ddp(module, **kw) -> DistributedDataParallel:
    """DistributedDataParallel with the options this torch has.

    * ``forward_sync_buffers=False`` (torch >= 2.12) is ``broadcast_buffers=False`` before.
    * ``bucket_cap_mb_list`` (first-iteration bucket sizes, torch >= 2.12) is dropped where
      missing: DDP's first iteration then uses one bucket of the whole model, as it always did.
    """
    have = _ddp_params()
    if "forward_sync_buffers" in kw and "forward_sync_buffers" not in have:
        kw.setdefault("broadcast_buffers", kw.pop("forward_sync_buffers"))
    for optional in ("bucket_cap_mb_list", "init_sync"):
        if optional in kw and optional not in have:
            kw.pop(optional)
    return DistributedDataParallel(module, **kw)


def rebuild_buckets_now(ddp: DistributedDataParallel) -> None:
    """Do DDP's one-time bucket rebuild now rather than at the start of the next forward
    (call on every rank at the same point: the rebuild agrees bucket indices across ranks).
    Private API; where this torch lacks it, DDP rebuilds in the next forward as it always did."""
    rebuild = getattr(ddp.reducer, "_rebuild_buckets", None)
    if rebuild is not None and rebuild():
        ddp._has_rebuilt_buckets = True
