"""summary.json: a run's outcome (``records.SUMMARY_FIELDS``), written by rank 0 at the end.

``gather`` runs on every rank (it all-reduces payload and memory over ranks); ``summary``
builds the dictionary rank 0 writes.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist

from workloads import data, schemes
from workloads.arguments import hyper_params, target
from workloads.loop import Progress
from workloads.measure import max_rss_bytes, pss_bytes


@dataclass(frozen=True)
class Totals:
    """Over all ranks."""

    mean_payload_bytes: float
    """Per rank and iteration."""
    final_payload_bytes: float
    """Of the last iteration, per rank."""
    max_rss_bytes_per_rank: float
    max_rss_bytes_all_ranks: float
    pss_bytes_all_ranks: float | None = None
    """The ranks' proportional set sizes at the end, summed: the memory they hold together."""
    overruns: int = 0
    """--gpu-time: iterations that overran, summed over ranks (``workloads.pacing``)."""
    late_max_s: float = 0.0
    real_compute_max_s: float = 0.0
    need_max: float = 0.0
    """--gpu-time: over all ranks and iterations (real seconds)."""


def gather(progress: Progress, world: int, device: torch.device) -> Totals:
    """Payload and peak memory over all ranks (every rank must call it)."""
    pay = torch.tensor([sum(progress.payloads), len(progress.payloads), progress.payloads[-1]],
                       dtype=torch.float64, device=device)
    dist.all_reduce(pay)
    pss = pss_bytes()
    rss = torch.tensor([max_rss_bytes()], dtype=torch.float64, device=device)
    sums = torch.tensor([max_rss_bytes(), pss if pss is not None else math.nan], dtype=torch.float64, device=device)
    paced = torch.tensor([progress.late_max_s, progress.real_compute_max_s, progress.need_max], dtype=torch.float64,
                         device=device)
    overruns = torch.tensor([progress.overruns], dtype=torch.float64, device=device)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    dist.all_reduce(paced, op=dist.ReduceOp.MAX)
    dist.all_reduce(sums)
    dist.all_reduce(overruns)
    pss_all = float(sums[1]) if math.isfinite(float(sums[1])) else None
    return Totals(float(pay[0] / pay[1]), float(pay[2] / world), float(rss[0]), float(sums[0]), pss_all,
                  int(overruns[0]), float(paced[0]), float(paced[1]), float(paced[2]))


def summary(args: argparse.Namespace, scheme: schemes.Scheme, ds: data.Dataset, *, world: int, backend: str,
            progress: Progress, totals: Totals, per_epoch: int, wall_s: float, dense_bytes: int,
            kept_fraction: float | None, pretrained: dict | None, placement: dict,
            scheme_stats: dict | None = None) -> dict:
    """The summary.json of a run (keys in the order they have always been written);
    ``scheme_stats``: the scheme state's ``stats()`` where it has one (prunex)."""
    stats = scheme_stats or {}
    values = vars(args)
    return {
        "scheme": scheme.name, "variant": args.variant,
        "hyper": hyper_params(args, scheme, (pretrained or {}).get("dataset")),
        "seed": args.seed, "model": args.model, "dataset": ds.name, "test_samples": len(ds.y_test),
        "world_size": world,
        "backend": backend, "iterations": progress.iterations, "epochs": round(progress.iterations / per_epoch, 4),
        "wall_s": wall_s, "train_s": progress.train_s, "final_accuracy": progress.accuracy,
        "target_accuracy": target(args), "time_to_target_s": progress.time_to_target_s,
        "mean_iter_s": statistics.fmean(progress.iter_s), "median_iter_s": statistics.median(progress.iter_s),
        "mean_payload_bytes": totals.mean_payload_bytes, "final_payload_bytes": totals.final_payload_bytes,
        "dense_bytes": dense_bytes,
        **schemes.summary_values(scheme, values),  # prune_ratio, ternary, topk_ratio, ... (null: not this scheme's)
        "kept_fraction": kept_fraction,
        "dense_iterations": stats.get("dense_iterations"), "control_bytes": stats.get("control_bytes"),
        **{k: stats.get(k) for k in ("admm_updates", "admm_every", "compaction_events", "compacted_channels",
                                    "spardl_teams_used", "spardl_h_trajectory")},
        "init": pretrained, "from_scratch": pretrained is None,
        "compute_time_s": args.compute_time, "accuracy_measured": args.compute_time is None,
        "dilation": args.dilation, **_paced(args, totals),
        "max_rss_bytes_per_rank": totals.max_rss_bytes_per_rank,
        "max_rss_bytes_all_ranks": totals.max_rss_bytes_all_ranks,
        "pss_bytes_all_ranks": totals.pss_bytes_all_ranks,
        "placement": placement}


def _paced(args: argparse.Namespace, totals: Totals) -> dict:
    """--gpu-time's fields (null without it): the GPU's seconds T, the budget K x T, the
    iterations that overran it (summed over ranks), the latest miss and the longest real
    compute (real seconds), and the smallest K whose deadlines that real compute meets."""
    t = getattr(args, "gpu_time_s", None)
    if t is None:
        return {"gpu_time_s": None, "compute_budget_s": None, "overruns": None}
    return {"gpu_time_s": t, "compute_budget_s": t * args.dilation, "overruns": totals.overruns,
            "overrun_late_max_s": totals.late_max_s, "real_compute_max_s": totals.real_compute_max_s,
            "dilation_fits": math.ceil(args.dilation * totals.need_max)}
