"""Distributed data-parallel training with a choice of gradient-communication scheme.

    torchrun --nproc-per-node 2 -m workloads.train --scheme pactrain --dataset digits --out runs/x

Reads top to bottom: arguments -> process group -> data -> model (+ checkpoint, pruning)
-> DDP + scheme hook -> epochs (iterations, evaluations, records) -> summary -> teardown.
Rank, world size and the rendezvous come from torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT); without them it runs as a single process.

One job per module: ``arguments`` (flags, variants, validation, ``hyper``),
``distributed`` (process group, determinism), ``synthetic`` (``--compute-time``),
``measure`` (DDP's timers, peak memory), ``evaluation``, ``loop`` (the iterations),
``summary`` (summary.json); this module strings them together.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from workloads import collectives, compat, data, placement, pruning, records, schemes, volume
from workloads.arguments import hyper_params, parse_args, prepare, validate
from workloads.checkpoint import CheckpointError, load_into
from workloads.distributed import free_port as _free_port
from workloads.distributed import init_distributed, set_determinism
from workloads.loop import Loop
from workloads.measure import DDPTimes
from workloads.models import build_model
from workloads.pacing import Pacer
from workloads.summary import gather, summary
from workloads.synthetic import SyntheticCompute

__all__ = ["_free_port", "check", "hyper_params", "main", "parse_args", "train"]  # what other code imports


def check(argv) -> argparse.Namespace:
    """Validate a command line without training (raises ValueError saying what to fix).

    For launchers (``testbed run``) that must refuse bad input before building anything:
    the checks that load no data set and build no model (``arguments.validate``); what only
    loading finds (a corrupt batch or checkpoint) each rank reports as one line.
    """
    args = parse_args(argv, raise_errors=True)
    validate(args)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        scheme, ds = prepare(args)
    except ValueError as e:  # DatasetError is one; one line, from the rank (a launcher checked less)
        print(f"error (rank {os.environ.get('RANK', '0')}): {e}", file=sys.stderr)
        return 2
    set_determinism(args.seed, args.threads, deterministic=args.compute_time is None)
    collectives.activate()  # under testbed: count what this rank hands to torch.distributed
    rank, world, device, backend = init_distributed(args.backend)
    try:
        return train(args, scheme, ds, rank, world, device, backend)
    except (ValueError, CheckpointError) as e:
        print(f"error (rank {rank}): {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in records.DISK_ERRNOS:
            raise
        with contextlib.suppress(OSError):  # the log may be on that disk too
            print(f"error (rank {rank}): could not write {e.filename}: {e.strerror}", file=sys.stderr)
        return 3
    finally:
        collectives.finish()
        dist.destroy_process_group()


def train(args, scheme, ds, rank, world, device, backend) -> int:
    """One run in a joined group: model -> pruning -> DDP + the scheme's hook -> iterations
    -> summary. The records go to ``--out`` (none without it)."""
    out = Path(args.out) if args.out else None
    iface = records.iface_from_env(args.iface)
    counters = records.IfaceCounters(iface) if iface else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    model, pretrained = _model(args, ds, rank, device)
    synthetic = SyntheticCompute(model, args.compute_time * args.dilation, args.seed * 1000 + rank) \
        if args.compute_time is not None else None
    masks = _prune(args, model, ds, rank, device, synthetic) if scheme.prunes else None
    # --gpu-time: the real compute held to K x T (after pruning's own passes, which are not iterations)
    pacer = Pacer(model, args.gpu_time_s * args.dilation) if getattr(args, "gpu_time_s", None) else None
    total, per_epoch = _iterations(args, ds, world, synthetic)
    if synthetic and masks is not None:  # the DDP module is the wrapper: its names carry a prefix
        masks = {f"model.{k}": v for k, v in masks.items()}
    where = placement.discover()
    ddp = _ddp(synthetic or model, device, args.bucket_cap_mb, synthetic=synthetic is not None)
    volume.watch(ddp, scheme.name)  # under testbed: what each iteration's gradients must carry, for the proof
    state = scheme.attach(ddp, schemes.options(vars(args), device=str(device), seed=args.seed, placement=where,
                                               total_iters=total), masks)
    timers = DDPTimes(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, total) if args.lr_schedule == "cosine" else None)
    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)

    if rank == 0:
        print(f"{scheme.name}: {args.model} on {ds.name}, {world} ranks ({backend}), {total} iterations "
              f"of batch {args.batch_size}/rank, {per_epoch} per epoch; records in {out or '(none)'}")
        if out:
            records.write_json(out / "config.json", {
                "args": vars(args), "world_size": world, "backend": backend, "iterations": total,
                "iterations_per_epoch": per_epoch, "dense_bytes": dense_bytes,
                "torch": torch.__version__, "device": str(device), "placement": where.to_dict(),
                "compute_time_s": args.compute_time, "accuracy_measured": synthetic is None,
                "dilation": args.dilation, "fields": {"iteration": records.ITER_FIELDS, "eval": records.EVAL_FIELDS}})
    it_log = records.JsonlWriter(out / f"rank{rank}.jsonl") if out else None
    ev_log = records.JsonlWriter(out / "eval.jsonl") if out and rank == 0 and synthetic is None else None

    loop = Loop(args, ds, rank, world, device, model, ddp, state, opt, sched, timers, synthetic, total, per_epoch,
                counters, it_log, ev_log, pacer)
    start = time.time()
    collectives.training()
    progress = loop.run()
    collectives.trained()

    totals = gather(progress, world, device)
    if rank == 0 and out:
        records.write_json(out / "summary.json", summary(
            args, scheme, ds, world=world, backend=backend, progress=progress, totals=totals, per_epoch=per_epoch,
            wall_s=(time.time() - start) / args.dilation, dense_bytes=dense_bytes,
            kept_fraction=state.kept_fraction() if hasattr(state, "kept_fraction") else None,
            pretrained=pretrained, placement=where.to_dict(),
            scheme_stats=state.stats() if hasattr(state, "stats") else None))
    for log in (it_log, ev_log):
        if log:
            log.close()
    # DDP holds gloo work in reference cycles: free it while the group exists, on all ranks
    del ddp, state, loop  # (the loop holds them too)
    gc.collect()
    dist.barrier()
    return 0


def _model(args, ds, rank, device) -> tuple[nn.Module, dict | None]:
    """The model, with the same initial weights everywhere (seeded; DDP also broadcasts
    rank 0's), from ``--init``'s checkpoint if given; (model, the checkpoint's description)."""
    model = build_model(args.model, ds.num_classes, 3, args.width, args.depth)
    pretrained: dict | None = None  # from scratch
    if args.init:
        pretrained = {}
        for note in load_into(model, args.init, args.model, pretrained):
            if rank == 0:
                print(f"init: {note}")
        pretrained["checkpoint"] = str(args.init)
    return model.to(device), pretrained


def _prune(args, model, ds, rank, device, synthetic) -> dict:
    """Prune ``model`` in place (a global mask, ``--prune-ratio`` / ``--prune-method``); the masks."""
    gen = torch.Generator().manual_seed(args.seed)
    grasp = [(x.to(device), y.to(device)) for _, (x, y) in
             zip(range(args.grasp_batches), data.batches(ds, 0, 1, 0, args.seed, args.batch_size, gen))]
    # a synthetic run's ranks hold the same seeded weights and score them alike (magnitude
    # only): no broadcast of the mask, which would put one byte per weight through the
    # emulated links before the first iteration (ViT-B/16: 4 x 86 MB over an uplink, an
    # estimated 27 s at 100 Mbit). PacTrain's own agreement check still compares every
    # bucket's mask.
    masks = pruning.compute_masks(model, args.prune_ratio, args.prune_method, grasp, broadcast=synthetic is None)
    pruning.apply_masks(model, masks)
    if rank == 0:
        kept = sum(int(m.sum()) for m in masks.values())
        total = sum(m.numel() for m in masks.values())
        print(f"pruned {total - kept}/{total} conv/linear weights ({args.prune_method})")
    return masks


def _iterations(args, ds, world, synthetic) -> tuple[int, int]:
    """(iterations the run makes, iterations per epoch); a synthetic run's epoch is the run
    (it reads no data: its batch is not bounded by the data set's size)."""
    if synthetic:
        return args.max_iters, args.max_iters
    per_epoch = data.iterations_per_epoch(ds, world, args.batch_size)
    if per_epoch == 0:
        raise ValueError(f"--batch-size {args.batch_size} x {world} ranks exceeds the "
                         f"{len(ds.y_train)} training samples; use a smaller batch")
    total = math.ceil(args.epochs * per_epoch)
    if args.max_iters:
        total = min(total, args.max_iters)
    return total, per_epoch


def _ddp(module, device, bucket_cap_mb: float, synthetic: bool):
    """DDP around ``module`` (the model, or a synthetic run's wrapper of it).

    Every rank seeded the same initial weights: a synthetic run skips DDP's broadcast of
    them (hundreds of MB through the emulated links before the first iteration). Its
    gradients arrive in exactly reverse order, so it can bucket from the first iteration
    (DDP's default first iteration is one bucket of the whole model: a transient copy of
    everything per rank, which 8 ranks of ViT-B/16 cannot afford here) and take gradients
    as views of the buckets (one copy less)."""
    extra = {"init_sync": False, "gradient_as_bucket_view": True, "bucket_cap_mb_list": [bucket_cap_mb]} \
        if synthetic else {}
    return compat.ddp(module, device_ids=[device] if device.type == "cuda" else None,
                      bucket_cap_mb=bucket_cap_mb, forward_sync_buffers=False, **extra)


def _exit(code: int) -> None:
    """Leave without the interpreter's teardown: the records are closed and the group is
    destroyed, and tearing down torch's modules and freeing every tensor one by one takes
    about a second of CPU per rank (seconds per run when 8 ranks share 2 cores)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
