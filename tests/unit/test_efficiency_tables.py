"""docs/results/efficiency.md's tables (benchmarks.efficiency_tables) on constructed runs
whose bounds are known; the page itself is checked against its records by test_regenerate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import efficiency_tables as et
from testbed.runs.reports.rundata import RunData

ITERS = 20


def _run(tmp: Path, label: str, bw: str, rep: int, iter_s: float, mb_per_iter: float) -> RunData:
    """A run of ``label`` whose steady iterations take ``iter_s`` (the first four take 1 s:
    left out) and whose busiest bottleneck direction carried ``mb_per_iter`` MB an iteration."""
    scheme, *rest = label.split()
    path = tmp / "sweep" / f"{label.replace(' ', '_')}-{bw}-r{rep}"
    path.mkdir(parents=True)
    with open(path / "rank0.jsonl", "w") as f:
        for i in range(ITERS):
            f.write(json.dumps({"iter": i, "iter_s": 1.0 if i < 4 else iter_s, "compute_s": 0.03,
                                "comm_s": iter_s - 0.03, "overlap_s": 0.0}) + "\n")
    summary = {"scheme": scheme, "bw": bw, "status": "ok", "iterations": ITERS, "request": {"repeat": rep},
               "bottleneck": {"links": {"s1:up": {"bytes": mb_per_iter * 1e6 * ITERS},
                                        "s1:down": {"bytes": mb_per_iter * 1e5 * ITERS}}}}
    if scheme == "pactrain":
        summary.update(prune_ratio=float(rest[0]), ternary=rest[1] == "ternary")
    return RunData(path, summary, [])


def test_each_scheme_is_set_against_its_own_bounds(tmp_path):
    runs = [_run(tmp_path, "allreduce", bw, k, t, 4.5) for k in range(2)
            for bw, t in (("10gbit", 0.1), ("100mbit", 0.4))]
    text = et.table(runs, ["allreduce"])
    row = next(line for line in text.splitlines() if line.startswith("| 100 Mbit"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # T 0.4, C 0.1 (its 10 Gbit T), W 4.5 MB, W/R = 4.5e6 / 12.5e6 = 0.36 s
    assert cells[:9] == ["100 Mbit", "allreduce", "2", "0.400", "0.100", "4.50", "0.360", "0.360", "0.460"]
    assert cells[9] == "0.90 [0.90-0.90]" and cells[10] == "1.15 [1.15-1.15]"
    assert cells[11] == "0.030 / 0.370 / 0.000"
    assert "allreduce 0.100, 0.030 / 0.070" in text  # C and DDP's timers at 10 Gbit
    assert "10 Gbit |" not in text  # the 10 Gbit runs give C, not a row


def test_a_scheme_without_10gbit_runs_has_no_bound(tmp_path):
    runs = [_run(tmp_path, "fp16", "100mbit", 0, 0.2, 2.5)]
    row = next(line for line in et.table(runs, ["fp16"]).splitlines() if line.startswith("| 100 Mbit"))
    assert [c.strip() for c in row.strip("|").split("|")][4:10] == ["-", "2.50", "0.200", "-", "-", "-"]


def test_ternary_is_paired_with_exact_by_repeat(tmp_path, monkeypatch):
    runs = [_run(tmp_path, f"pactrain 0.5 {v}", "100mbit", k, t * (1 + k / 10), w)
            for k in range(3) for v, t, w in (("exact", 0.2, 2.9), ("ternary", 0.1, 1.6))]
    monkeypatch.setattr(et, "_runs", lambda folder, labels: runs)
    text = et.ternary_table(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| 100 Mbit"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "0.50x [0.50, 0.50] (3 pairs, min-max)"  # every repeat's pair: half the time
    assert cells[2].startswith("0.55x")  # 1.6 / 2.9 MB
    assert cells[3:] == ["0.220", "0.110"]


def test_records_without_the_section_name_the_command(tmp_path):
    with pytest.raises(Exception, match="--sections eff"):
        et.pactrain_table(tmp_path)
