"""The report's statistics (issues 41, 58): paired repeats, the median's interval labelled
with the coverage it has (checked by simulation), the verdicts, and the sustained time to
accuracy."""

from __future__ import annotations

import math
import random
from math import comb
from pathlib import Path

import pytest

from testbed.runs.reports.rundata import RunData
from testbed.runs.reports.stats import K_SUSTAINED, compare, median_ci, pair, sustained_tta
from testbed.runs.reports.tables import table


@pytest.mark.parametrize("n", [3, 5])
def test_below_six_pairs_the_interval_is_the_min_max_labelled_with_its_true_coverage(n):
    """Issue 58: a 3-pair "95 %" interval was a min-max that holds the median 75 % of the time."""
    ratios = [0.5 + 0.05 * i for i in range(n)]
    lo, hi, label = median_ci(ratios)
    assert (lo, hi) == (min(ratios), max(ratios))
    assert label == f"min-max of {n} (holds the median with probability {1 - 2 / 2 ** n:.2f})"
    assert "95" not in label


@pytest.mark.parametrize("n", [6, pytest.param(8, marks=pytest.mark.slow), pytest.param(12, marks=pytest.mark.slow)])
def test_from_six_pairs_the_95_percent_interval_holds_the_median_95_percent_of_the_time(n):
    """The interval's coverage, measured: 1000 samples of n log-normal ratios whose median is
    known (1.0), 1500 times; it must hold it in at least 95 % of them (less 3 standard errors), and it
    is the order statistics the binomial distribution gives (n = 8: the min-max, n = 12: the
    3rd smallest to the 3rd largest)."""
    rng = random.Random(n)
    trials, held = 1000 if n != 8 else 300, 0
    for _ in range(trials):
        xs = [math.exp(rng.gauss(0, 0.3)) for _ in range(n)]
        lo, hi, label = median_ci(xs)
        held += lo <= 1.0 <= hi
    assert label == "95 % (order statistics)"
    assert held / trials >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / trials), held / trials
    xs = [float(i) for i in range(n)]
    k = max(j for j in range(1, n // 2 + 1) if 1 - 2 * sum(comb(n, i) for i in range(j)) / 2 ** n >= 0.95)
    assert median_ci(xs)[:2] == (xs[k - 1], xs[n - k])
    if n == 8:
        assert median_ci(xs)[:2] == (0.0, 7.0)


def test_verdicts():
    assert compare([0.5, 0.52, 0.48, 0.51, 0.47, 0.49])["verdict"] == "lower"
    assert compare([1.5, 1.52, 1.48, 1.51, 1.53, 1.49])["verdict"] == "higher"
    assert compare([0.5, 0.52, 0.48, 0.51])["verdict"] == "lower in all 4 pairs (too few for a 95 % interval)"
    c = compare([0.9, 1.1, 1.0])
    assert c["verdict"] == "no difference shown" and (c["ci_low"], c["ci_high"]) == (0.9, 1.1)
    assert c["interval"].startswith("min-max of 3")
    assert compare([0.7])["verdict"] == "one pair: no interval" and compare([])["verdict"] == "no pairs"


def test_runs_are_paired_by_key_and_unmatched_ones_left_out():
    xs = [("a", 2.0), ("b", 3.0), ("c", 4.0), ("d", None)]
    bs = [("a", 4.0), ("b", 3.0), ("d", 1.0), ("e", 1.0)]
    assert pair(xs, bs, key=lambda r: r[0], value=lambda r: r[1]) == [0.5, 1.0]
    twice = [("a", 2.0), ("a", 5.0)]  # a key twice on one side: no pair for it
    assert pair(twice, bs, key=lambda r: r[0], value=lambda r: r[1]) == []


def test_sustained_time_to_accuracy():
    evals = [{"accuracy": a, "train_s": float(t)} for t, a in enumerate([0.5, 0.91, 0.89, 0.92, 0.93, 0.95, 0.9])]
    assert K_SUSTAINED == 3
    assert sustained_tta(evals, 0.9) == 3.0  # 0.91 at 1 s touched it, then fell back
    assert sustained_tta(evals, 0.99) is None
    assert sustained_tta(evals[:5], 0.9) is None  # two at or above at the end: not yet held


def _run(scheme: str, repeat: int, iter_s: float, accs: list[float]) -> RunData:
    summary = {"status": "ok", "scheme": scheme, "bw": "100mbit", "world_size": 4, "mean_iter_s": iter_s,
               "request": {"repeat": repeat}, "seed": repeat, "test_samples": 359, "target_accuracy": 0.9,
               "hyper": {"model": "cnn", "lr": 0.05}}
    evals = [{"accuracy": a, "train_s": 10.0 * (i + 1) * iter_s} for i, a in enumerate(accs)]
    return RunData(Path(f"/runs/{scheme}-{repeat}"), summary, evals)


def test_the_report_sets_each_scheme_against_the_baseline_over_paired_repeats():
    climb = [0.5, 0.92, 0.93, 0.95, 0.96]
    runs = [_run("allreduce", k, 1.0 + 0.1 * k, climb) for k in range(5)]
    runs += [_run("fp16", k, 0.5 + 0.05 * k, climb) for k in range(5)]  # twice as fast, repeat by repeat
    runs += [_run("topk", k, 1.0 + 0.1 * ((k + 2) % 5), climb) for k in range(5)]  # the same, shuffled
    rows = {r["variant"]: r for r in table(runs)}
    fp16, topk = rows["fp16"], rows["topk"]
    lower5 = "lower in all 5 pairs (too few for a 95 % interval)"
    assert fp16["iter_ratio"] == pytest.approx(0.5) and fp16["iter_verdict"] == lower5 and fp16["iter_pairs"] == 5
    assert fp16["tta_sustained_ratio"] == pytest.approx(0.5) and fp16["tta_sustained_verdict"] == lower5
    assert topk["iter_verdict"] == "no difference shown" and topk["iter_ci_low"] < 1 < topk["iter_ci_high"]
    assert topk["iter_interval"] == "min-max of 5 (holds the median with probability 0.94)"
    assert rows["allreduce"]["iter_ratio"] == 1.0 and rows["allreduce"]["accuracy_resolution"] == pytest.approx(
        1 / 359)
    assert rows["allreduce"]["tta_sustained_s"] == pytest.approx(20.0 * 1.2)  # the median repeat's 2nd evaluation
    assert fp16["tta_sustained_vs_allreduce"] == pytest.approx(fp16["tta_sustained_s"] / (20.0 * 1.2))
    assert rows["allreduce"]["tta_sustained_vs_allreduce"] == 1.0  # what tta.png's second bars show
    against_fp16 = {r["variant"]: r for r in table(runs, baseline="fp16")}
    assert against_fp16["allreduce"]["iter_ratio"] == pytest.approx(2.0)


def test_report_prints_each_scheme_against_the_chosen_baseline(tmp_path):
    import json
    import os
    import subprocess
    import sys

    climb = [0.5, 0.92, 0.93, 0.95, 0.96]
    runs = [_run("allreduce", k, 1.0 + 0.1 * k, climb) for k in range(3)]
    runs += [_run("fp16", k, 0.5 + 0.05 * k, climb) for k in range(3)]
    for r in runs:
        d = tmp_path / "sweep" / r.path.name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(r.summary))
        (d / "run.json").write_text(json.dumps({"run_id": d.name, "request": {"scheme": r.summary["scheme"]}}))
        (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in r.evals))
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(tmp_path / "sweep"), "--baseline",
                        "allreduce"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    assert "accuracy resolution: 0.28 points (one test sample)" in p.stdout
    minmax, few = "min-max of 3 (holds the median with probability 0.75)", "lower in all 3 pairs (too few for a 95 % interval)"
    assert (f"fp16 / allreduce: iteration time x0.50 [0.50-0.50: {minmax}] (3 pairs: {few}); sustained time to "
            f"target x0.50 [0.50-0.50: {minmax}] (3 pairs: {few})") in p.stdout, p.stdout


def test_a_run_that_never_held_the_target_counts_in_its_pair_and_two_such_runs_do_not():
    climb, flat = [0.5, 0.92, 0.93, 0.95, 0.96], [0.5, 0.6, 0.7, 0.8, 0.85]
    runs = [_run("allreduce", k, 1.0, climb if k < 4 else flat) for k in range(5)]
    runs += [_run("fp16", k, 0.5, climb if k not in (2, 4) else flat) for k in range(5)]
    fp16 = {r["variant"]: r for r in table(runs)}["fp16"]
    # repeats 0, 1, 3: 0.5; repeat 2: fp16 never held it (infinity, ranked last); repeat 4: neither did
    assert fp16["tta_sustained_pairs"] == 4 and fp16["tta_sustained_ratio"] == pytest.approx(0.5)
    assert fp16["tta_sustained_ci_high"] == float("inf") and fp16["tta_sustained_verdict"] == "no difference shown"
    assert pair([("a", float("inf"))], [("a", float("inf"))], key=lambda r: r[0], value=lambda r: r[1]) == []
