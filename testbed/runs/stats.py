"""How sure a comparison is: a scheme against a baseline over paired repeats (issue 41).

    pair           runs of two variants matched by repeat (a sweep's repeat k, else the seed)
    bootstrap_ci   the percentile bootstrap interval of the median of paired ratios
    compare        median ratio, its 95 % interval, the number of pairs and the verdict
    sustained_tta  the first of K_SUSTAINED consecutive evaluations at or above the target

A sweep's repeat k of every scheme uses the same seed (data order, augmentation) and the
same checkpoint, so its runs are paired: the ratio x_k / b_k cancels what the repeat shares
(the seed's luck, the machine's mood at that hour). The interval resamples the pairs with
replacement (``N_BOOT`` times, a fixed seed, so a report is the same each time it is made)
and takes the 2.5th and 97.5th percentiles of the resampled medians. With n pairs the
median of a resample can only be one of the n ratios (or the mean of two), so with 3 pairs
the interval is at best [smallest, largest]: a claim needs more repeats, and says so.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence

N_BOOT = 10_000
LEVEL = 0.95
K_SUSTAINED = 3
"""Consecutive evaluations at or above the target that make a sustained time-to-accuracy: a
run that touches the target once on a 359-image test set (one image is 0.28 points) has not
reached it."""


def pair_key(summary: dict) -> object:
    """What pairs a run with the baseline's: a sweep's repeat number, else its seed."""
    request = summary.get("request") if isinstance(summary.get("request"), dict) else {}
    repeat = request.get("repeat")
    if isinstance(repeat, int) and not isinstance(repeat, bool):
        return ("repeat", repeat)
    seed = summary.get("seed")
    return ("seed", seed) if isinstance(seed, int) and not isinstance(seed, bool) else None


def pair(xs: Sequence, bs: Sequence, key: Callable, value: Callable, diff: bool = False) -> list[float]:
    """Ratios value(x) / value(b) (with ``diff``, differences value(x) - value(b)) over runs
    x of ``xs`` and b of ``bs`` with the same key (each key once on each side; runs without
    a key or a value, or for a ratio a value that is not positive, are left out, and so are
    pairs whose two values are both infinite: a target neither run held)."""
    def by_key(runs) -> dict:
        out: dict = {}
        for r in runs:
            k, v = key(r), value(r)
            if k is not None and isinstance(v, (int, float)) and (diff or v > 0):
                out.setdefault(k, []).append(float(v))
        return {k: v[0] for k, v in out.items() if len(v) == 1}

    x, b = by_key(xs), by_key(bs)
    keys = sorted(set(x) & set(b), key=repr)
    pairs = (x[k] - b[k] if diff else x[k] / b[k] for k in keys)
    return [q for q in pairs if not math.isnan(q)]  # inf / inf: neither side has a value


def bootstrap_ci(ratios: Sequence[float], n_boot: int = N_BOOT, level: float = LEVEL,
                 seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the median of ``ratios`` (resampled with replacement)."""
    rng = random.Random(seed)
    n = len(ratios)
    meds = sorted(statistics.median(rng.choices(ratios, k=n)) for _ in range(n_boot))
    lo = meds[int((1 - level) / 2 * n_boot)]
    hi = meds[min(n_boot - 1, int((1 + level) / 2 * n_boot))]
    return lo, hi


def compare(ratios: Sequence[float]) -> dict:
    """``{median_ratio, ci95_low, ci95_high, pairs, verdict}``; verdict: "lower" or "higher"
    when the interval excludes 1, "no difference shown" when it holds 1, "one pair: no
    interval" or "no pairs" when there is nothing to resample."""
    if not ratios:
        return {"median_ratio": None, "ci95_low": None, "ci95_high": None, "pairs": 0, "verdict": "no pairs"}
    med = statistics.median(ratios)
    if len(ratios) < 2:
        return {"median_ratio": med, "ci95_low": None, "ci95_high": None, "pairs": 1,
                "verdict": "one pair: no interval"}
    lo, hi = bootstrap_ci(ratios)
    verdict = "no difference shown" if lo <= 1 <= hi else ("lower" if hi < 1 else "higher")
    return {"median_ratio": med, "ci95_low": lo, "ci95_high": hi, "pairs": len(ratios), "verdict": verdict}


def sustained_tta(evals: Sequence[dict], target: float, k: int = K_SUSTAINED, at: str = "train_s") -> float | None:
    """Training seconds (or the evaluation's field ``at``, e.g. "iter") at the first
    evaluation from which ``k`` consecutive evaluations are at or above ``target`` (None:
    never; a run that ends, or stops at the target, before k evaluations held it has not
    sustained it)."""
    run = 0
    for i, e in enumerate(evals):
        run = run + 1 if e["accuracy"] >= target else 0
        if run == k:
            return evals[i - k + 1].get(at)
    return None
