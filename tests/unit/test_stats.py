"""The report's statistics (issue 41): paired repeats, the bootstrap interval checked against
its exact answer, the verdicts, and the sustained time to accuracy."""

from __future__ import annotations

from math import comb
from pathlib import Path

import pytest

from testbed.runs.rundata import RunData
from testbed.runs.stats import K_SUSTAINED, bootstrap_ci, compare, pair, sustained_tta
from testbed.runs.tables import table


def _exact_quantile(values: list[float], q: float) -> float:
    """The q-quantile of the median of n draws with replacement from n distinct ``values``
    (n odd), from its exact distribution: median <= v_j iff at least (n + 1) / 2 draws are
    among the j smallest."""
    n, need = len(values), (len(values) + 1) // 2
    ordered = sorted(values)
    for j in range(1, n + 1):
        p = j / n
        if sum(comb(n, m) * p ** m * (1 - p) ** (n - m) for m in range(need, n + 1)) >= q:
            return ordered[j - 1]
    return ordered[-1]


@pytest.mark.parametrize("n", [3, 5, 7, 9, 11])
def test_the_bootstrap_interval_is_the_exact_one(n):
    """(Sizes whose exact distribution has no atom within 3 standard errors of 2.5 %: at
    n = 15 the median is at most the 4th smallest with probability 0.0255.)"""
    ratios = [0.5 + 0.05 * i for i in range(n)]
    lo, hi = bootstrap_ci(ratios)
    assert (lo, hi) == (_exact_quantile(ratios, 0.025), _exact_quantile(ratios, 0.975))
    if n == 3:  # three repeats: the interval is all of them
        assert (lo, hi) == (min(ratios), max(ratios))
    if n == 9:
        assert (lo, hi) == (ratios[1], ratios[-2])


def test_verdicts():
    assert compare([0.5, 0.52, 0.48, 0.51])["verdict"] == "lower"
    assert compare([1.5, 1.52, 1.48])["verdict"] == "higher"
    c = compare([0.9, 1.1, 1.0])
    assert c["verdict"] == "no difference shown" and (c["ci95_low"], c["ci95_high"]) == (0.9, 1.1)
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
    assert fp16["iter_ratio"] == pytest.approx(0.5) and fp16["iter_verdict"] == "lower" and fp16["iter_pairs"] == 5
    assert fp16["tta_sustained_ratio"] == pytest.approx(0.5) and fp16["tta_sustained_verdict"] == "lower"
    assert topk["iter_verdict"] == "no difference shown" and topk["iter_ci95_low"] < 1 < topk["iter_ci95_high"]
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
    assert ("fp16 / allreduce: iteration time x0.50 [0.50-0.50] (3 pairs: lower); sustained time to target x0.50 "
            "[0.50-0.50] (3 pairs: lower)") in p.stdout, p.stdout


def test_a_run_that_never_held_the_target_counts_in_its_pair_and_two_such_runs_do_not():
    climb, flat = [0.5, 0.92, 0.93, 0.95, 0.96], [0.5, 0.6, 0.7, 0.8, 0.85]
    runs = [_run("allreduce", k, 1.0, climb if k < 4 else flat) for k in range(5)]
    runs += [_run("fp16", k, 0.5, climb if k not in (2, 4) else flat) for k in range(5)]
    fp16 = {r["variant"]: r for r in table(runs)}["fp16"]
    # repeats 0, 1, 3: 0.5; repeat 2: fp16 never held it (infinity, ranked last); repeat 4: neither did
    assert fp16["tta_sustained_pairs"] == 4 and fp16["tta_sustained_ratio"] == pytest.approx(0.5)
    assert fp16["tta_sustained_ci95_high"] == float("inf") and fp16["tta_sustained_verdict"] == "no difference shown"
    assert pair([("a", float("inf"))], [("a", float("inf"))], key=lambda r: r[0], value=lambda r: r[1]) == []
