"""How sure a comparison is: a scheme against a baseline over paired repeats (issues 41, 58).

    pair           runs of two variants matched by repeat (a sweep's repeat k, else the seed)
    median_ci      the interval of the median of paired ratios, labelled with what it covers
    compare        median ratio, its interval and label, the number of pairs and the verdict
    sustained_tta  the first of K_SUSTAINED consecutive evaluations at or above the target

A sweep's repeat k of every scheme uses the same seed (data order, augmentation) and the
same checkpoint, so its runs are paired: the ratio x_k / b_k cancels what the repeat shares
(the seed's luck, the machine's mood at that hour).

The interval is the distribution-free one of the median (order statistics, the sign test's
interval: ``scipy.stats.quantile_test``): it holds the true median with probability at least
95 %, exactly, whatever the ratios' distribution, and infinite ratios (a run that never held
the target) are only ranked. It exists from ``MIN_PAIRS_95`` = 6 pairs: with n pairs even
[smallest, largest] holds the median only with probability 1 - 2 / 2^n, 0.75 for 3 pairs and
0.94 for 5. Below 6 the table gives that min-max and says so, with its coverage, and the
verdict says in how many pairs the direction held, never "lower" or "higher" as if 95 %
stood behind it. (The percentile bootstrap used before labelled a 3-pair min-max "95 %"; a
BCa bootstrap of a median over a handful of pairs is as discrete, with no exact coverage.)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

LEVEL = 0.95
MIN_PAIRS_95 = 6
"""The fewest pairs whose min-max holds the median with probability >= 95 % (1 - 2 / 2^6)."""
K_SUSTAINED = 3
"""Consecutive evaluations at or above the target that make a sustained time-to-accuracy: a
run that touches the target once on a 359-image test set (one image is 0.28 points) has not
reached it."""


def pair_key(summary: dict) -> object:
    """What pairs a run with the baseline's: a sweep's repeat number, else its seed."""
    request = summary.get("request")
    repeat = request.get("repeat") if isinstance(request, dict) else None
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


def minmax_coverage(n: int) -> float:
    """The probability that the smallest and largest of n values hold their median."""
    return 1 - 2 * 0.5 ** n


def median_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, str]:
    """(low, high, label) for the median of ``values`` (two or more): the distribution-free
    ``level`` interval where there are pairs enough, else the min-max, labelled with its
    coverage (module docstring)."""
    n = len(values)
    if n >= MIN_PAIRS_95:
        # only where an interval is made: scipy takes ~1 s to import (and ships no type stubs)
        from scipy.stats import quantile_test  # type: ignore[import-untyped]

        ci = quantile_test(list(values), q=statistics.median(values), p=0.5).confidence_interval(level)
        if not (math.isnan(ci.low) or math.isnan(ci.high)):
            return float(ci.low), float(ci.high), f"{level:.0%} (order statistics)".replace("%", " %")
    return min(values), max(values), f"min-max of {n} (holds the median with probability {minmax_coverage(n):.2f})"


def compare(ratios: Sequence[float], null: float = 1.0) -> dict:
    """``{median_ratio, ci_low, ci_high, interval, pairs, verdict}``. ``interval`` says what
    the interval is (:func:`median_ci`). Verdict, from 6 pairs: "lower" or "higher" when the
    95 % interval excludes ``null``, "no difference shown" when it holds it; below 6: "lower
    in all N pairs" (or "higher ...") when every pair agrees, else "no difference shown";
    "one pair: no interval" or "no pairs" when there is nothing to judge."""
    if not ratios:
        return {"median_ratio": None, "ci_low": None, "ci_high": None, "interval": None, "pairs": 0,
                "verdict": "no pairs"}
    med = statistics.median(ratios)
    if len(ratios) < 2:
        return {"median_ratio": med, "ci_low": None, "ci_high": None, "interval": None, "pairs": 1,
                "verdict": "one pair: no interval"}
    lo, hi, label = median_ci(ratios)
    n = len(ratios)
    side = "no difference shown" if lo <= null <= hi else ("lower" if hi < null else "higher")
    if side != "no difference shown" and n < MIN_PAIRS_95:
        side = f"{side} in all {n} pairs (too few for a 95 % interval)"
    return {"median_ratio": med, "ci_low": lo, "ci_high": hi, "interval": label, "pairs": n, "verdict": side}


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
