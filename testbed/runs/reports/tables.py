"""The report's table: runs grouped by bandwidth, world size and scheme variant (the scheme
with every hyper-parameter), repeats as median and min-max, each row compared with the
allreduce row that shares its bandwidth, world size and training hyper-parameters."""

from __future__ import annotations

import json
import math
import statistics

from testbed.model.units import Rate, UnitError
from testbed.runs.sweeps import grid
from testbed.runs.reports.rundata import RunData
from testbed.runs.reports.stats import compare, pair, pair_key


def bw_key(bw: str) -> float:
    """Sorts bandwidths by rate ("as configured" and other non-rates last)."""
    try:
        return Rate.parse(bw).bps
    except UnitError:
        return float("inf")


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _spread(xs) -> tuple:
    """(median, min, max) of the numbers in xs, or Nones."""
    xs = [x for x in xs if isinstance(x, (int, float))]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)


_TRAIN_KEYS = ("model", "dataset", "width", "depth", "batch_size", "lr", "momentum", "weight_decay", "lr_schedule",
               "epochs", "max_iters", "bucket_cap_mb", "init", "pretrain_dataset", "dilation")
"""Keys of a summary's ``hyper`` that are the training's, not the scheme's: a variant is
compared with the allreduce run that shares them."""


def _hyper(r: RunData) -> dict:
    """The run's hyper-parameters, with the sweep grid point's keys the trainer does not record
    (a user's script records none: its grid point and arguments tell its runs apart)."""
    h = r.summary.get("hyper")
    h = dict(h) if isinstance(h, dict) else {}
    params = r.summary.get("params")
    for k, v in (params.items() if isinstance(params, dict) else ()):
        if grid.norm(str(k)) not in h:
            h[str(k)] = v
    return h


def freeze(d: dict) -> str:
    return json.dumps(d, sort_keys=True, default=str)


def _labels(groups: dict) -> dict:
    """Display label per group key: the scheme's short label, plus the hyper-parameters that
    tell it apart from other groups with the same short label (never merged, never alike)."""
    by_label: dict[str, set[str]] = {}
    for (_, _, label, hyper) in groups:
        by_label.setdefault(label, set()).add(hyper)
    out = {}
    for key in groups:
        _, _, label, hyper = key
        variants = [json.loads(h) for h in sorted(by_label[label])]
        if len(variants) < 2:
            out[key] = label
            continue
        mine = json.loads(hyper)
        keys = sorted({k for v in variants for k in v})
        differ = [k for k in keys if len({freeze({k: v.get(k)}) for v in variants}) > 1]
        out[key] = label + " [" + ", ".join(f"{k}={mine.get(k)}" for k in differ) + "]"
    return out


def table(runs: list[RunData], target: float | None = None, include_unproven: bool = False,
          baseline: str = "allreduce") -> list[dict]:
    """One row per (bandwidth, world size, variant), a variant being the scheme with all its
    hyper-parameters (the summary's ``hyper``: model, dataset, batch, lr, prune ratio, ...):
    runs differing in any of them are never averaged together. Repeats give the median and
    the min-max. Rows are compared with the allreduce row at the same bandwidth, world size
    and training hyper-parameters; when the runs span several world sizes, the scheme
    column names it ("spardl 0.01 (4 ranks)"). Each row is also set against ``baseline``'s
    (a scheme, at the same bandwidth, world size and training hyper-parameters) over paired
    repeats: the median ratio of time to target and of iteration time, its interval (95 %
    from 6 pairs, else the min-max with its coverage) and a verdict (:mod:`testbed.runs.reports.stats`)."""
    groups: dict[tuple[str, int, str, str], list[RunData]] = {}
    for r in runs:
        groups.setdefault((r.bw, _world(r), r.label, freeze(_hyper(r))), []).append(r)
    labels = _labels(groups)
    several = len({w for _, w, _, _ in groups}) > 1
    ranked = ("ok", "unproven") if include_unproven else ("ok",)
    rows = [_row(key, rs, labels[key], target, several, ranked) for key, rs in groups.items()]
    ok = {id(row): [r for r in rs if r.status in ranked] for row, rs in zip(rows, groups.values())}
    for row in rows:
        chosen = _baseline(row, rows, baseline)
        _paired(row, ok[id(row)], ok[id(chosen)] if chosen else [], target)
    for row in rows:  # normalise to allreduce at the same bandwidth (the paper's Fig. 3)
        base = _baseline(row, rows)
        row["tta_vs_allreduce"] = (row["tta_s"] / base["tta_s"] if base and base["tta_s"] and row["tta_s"] is not None
                                   else None)
        row["tta_sustained_vs_allreduce"] = (
            row["tta_sustained_s"] / base["tta_sustained_s"]
            if base and base["tta_sustained_s"] and row["tta_sustained_s"] is not None else None)
        row["iter_time_vs_allreduce"] = (row["mean_iter_s"] / base["mean_iter_s"]
                                         if base and base["mean_iter_s"] and row["mean_iter_s"] else None)
    rows.sort(key=lambda x: (bw_key(x["bw"]), x["world_size"] or 0, x["base_scheme"] != "allreduce", x["variant"]))
    return rows


def _row(key: tuple[str, int, str, str], rs: list[RunData], label: str, target: float | None, several: bool,
         ranked: tuple[str, ...] = ("ok",)) -> dict:
    """One group's row: its runs' median and min-max (only runs whose status is in ``ranked``
    count: "ok", proven, and "unproven" only when asked; never "bypassed" or "failed")."""
    bw, world, _, hyper = key
    ok = [r for r in rs if r.status in ranked]
    ttas = [r.tta(target) for r in ok]
    reached = [t for t in ttas if t is not None]
    ordered = sorted(reached) + [float("inf")] * (len(ttas) - len(reached))  # not reached: after all
    tta_median = statistics.median(ordered) if ordered else None
    held = sorted((t for t in (r.tta_sustained(target) for r in ok) if t is not None))
    held_all = held + [float("inf")] * (len(ok) - len(held))
    acc, it = _spread(r.summary.get("final_accuracy") for r in ok), _spread(r.summary.get("mean_iter_s") for r in ok)
    return {
        "bw": bw, "scheme": f"{label} ({world} ranks)" if several else label, "variant": label,
        "base_scheme": str(rs[0].summary.get("scheme", "?")), "world_size": world or None,
        "runs": len(rs), "ok": len(ok), "unproven_included": sum(r.status == "unproven" for r in ok),
        "target_accuracy": target if target is not None else _mean(r.summary.get("target_accuracy") for r in ok),
        "reached": len(reached),
        "tta_s": tta_median if tta_median is not None and tta_median != float("inf") else None,
        "tta_min_s": min(reached) if reached else None,
        "tta_max_s": max(reached) if reached and len(reached) == len(ok) else None,
        "tta_sustained_s": _finite(statistics.median(held_all)) if held_all else None,
        "sustained_reached": len(held),
        "final_accuracy": acc[0], "final_accuracy_min": acc[1], "final_accuracy_max": acc[2],
        "accuracy_resolution": _resolution(ok),
        "mean_iter_s": it[0], "mean_iter_min_s": it[1], "mean_iter_max_s": it[2],
        "payload_bytes_per_iter": _mean(r.summary.get("mean_payload_bytes") for r in ok),
        "wire_bytes_per_iter": _mean((r.summary.get("bottleneck") or {}).get("bytes_per_iteration") for r in ok),
        "hyper": json.loads(hyper), "paths": [str(r.path) for r in rs],
        "failed": [f"{r.path.name}: {r.status}" for r in rs if r.status not in ranked],
    }


def _baseline(row: dict, rows: list[dict], scheme: str = "allreduce") -> dict | None:
    """The ``scheme`` row this row is compared with (a base scheme, e.g. allreduce, or a
    variant label): same bandwidth, world size and training hyper-parameters (model,
    dataset, batch, lr, checkpoint, ...)."""
    train = {k: row["hyper"].get(k) for k in _TRAIN_KEYS}
    same = [x for x in rows if x["bw"] == row["bw"] and x["world_size"] == row["world_size"]
            and scheme in (x["base_scheme"], x["variant"]) and {k: x["hyper"].get(k) for k in _TRAIN_KEYS} == train]
    return same[0] if len(same) == 1 else None


PAIRED = ("ratio", "ci_low", "ci_high", "interval", "pairs", "verdict")
"""The keys of a row's paired comparison, per metric (tta_sustained_ratio, iter_ci_low, ...;
``interval`` says what the interval is: 95 % from 6 pairs, else the min-max and its coverage)."""


def _paired(row: dict, mine: list[RunData], base: list[RunData], target: float | None) -> None:
    """The row against its baseline's runs, paired by repeat: sustained time to target, and
    mean iteration time."""
    metrics = {"tta_sustained": lambda r: tta_or_never(r, target), "iter": lambda r: r.summary.get("mean_iter_s")}
    for name, value in metrics.items():
        c = compare(pair(mine, base, lambda r: pair_key(r.summary), value)) if base else compare([])
        c["ratio"] = c.pop("median_ratio")
        row.update({f"{name}_{k}": c[k] for k in PAIRED})


def tta_or_never(r: RunData, target: float | None) -> float | None:
    """A run's sustained time to ``target``; infinity when its evaluations never held it, so
    that in a pair it ranks after any run that did (a ratio of 0 or infinity; a pair where
    neither held it has no ratio: ``stats.pair`` leaves it out); None without evaluations."""
    t = r.tta_sustained(target)
    return t if t is not None else (math.inf if r.evals else None)


def _finite(x: float) -> float | None:
    return x if x != float("inf") else None


def _resolution(runs: list[RunData]) -> float | None:
    """One test sample's share of the accuracy (1 / test samples; digits: 1 / 359 = 0.0028)."""
    n = {r.summary.get("test_samples") for r in runs}
    v = n.pop() if len(n) == 1 else None
    return 1 / v if type(v) is int and v > 0 else None


def _world(r: RunData) -> int:
    w = r.summary.get("world_size")
    return w if type(w) is int and w > 0 else 0
