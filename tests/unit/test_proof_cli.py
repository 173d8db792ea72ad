"""The proof where results are read (issue 40, item 3): the run table's measured / bound row
per bottleneck direction, and `testbed report`'s ranking of proven runs only, unless
``--include-unproven`` asks for the unproven ones too (never bypassed or failed ones)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from testbed.cli.runs import _proof_rows, _render_summary

from .test_report import _write_run

LINKS = {"s1-s0 forward": {"bytes": 9}, "s1-s0 reverse": {"bytes": 9}, "s2-s0 forward": {"bytes": 9},
         "s2-s0 reverse": {"bytes": 9}}


def _summary(**proof_links) -> dict:
    return {"run_id": "r1", "run_dir": "/runs/r1", "scheme": "allreduce", "bw": "100mbit", "world_size": 8,
            "iterations": 10, "bottleneck": {"links": LINKS, "bytes_per_iteration": 1.0}, "proof": "passed",
            "proof_links": {"w0-s1 forward": {"bound_bytes": 5, "measured_bytes": 9}, **proof_links}}


def test_the_run_table_has_measured_against_bound_for_each_bottleneck_direction():
    s = _summary(**{"s1-s0 forward": {"bound_bytes": 1_000_000, "measured_bytes": 1_850_000},
                    "s1-s0 reverse": {"bound_bytes": 1_000_000, "measured_bytes": 1_000_000},
                    "s2-s0 forward": {"bound_bytes": 0, "measured_bytes": 70},  # nothing had to cross: no ratio
                    "s2-s0 reverse": {"bound_bytes": "x", "measured_bytes": 70}})  # not a number: no row
    assert _proof_rows(s) == [
        ("  s1-s0 forward", "measured 1,850,000 B, bound 1,000,000 B (1.85x)"),
        ("  s1-s0 reverse", "measured 1,000,000 B, bound 1,000,000 B (1.00x)"),
        ("  s2-s0 forward", "measured 70 B, bound 0 B")]  # only bottleneck directions: not w0-s1's


def test_a_summary_without_a_proof_has_no_bound_rows():
    assert _proof_rows({"bottleneck": {"links": LINKS}}) == []
    assert _proof_rows({"bottleneck": {"links": LINKS}, "proof_links": None}) == []
    assert _proof_rows({}) == []


def test_the_rendered_run_table_prints_the_rows_under_the_proof(capsys):
    s = _summary(**{"s1-s0 forward": {"bound_bytes": 400, "measured_bytes": 800}})
    _render_summary(s)
    text = capsys.readouterr().out
    proof, row = text.index("passed"), text.index("s1-s0 forward")
    assert proof < row and "measured 800 B, bound 400 B (2.00x)" in text, text
    assert "w0-s1" not in text and "s2-s0" not in text, text


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", "report", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})


def test_report_ranks_unproven_runs_only_with_include_unproven(tmp_path):
    runs = tmp_path / "runs"
    _write_run(runs / "ok", "allreduce", "100mbit", 1.0, {}, proof="passed")
    _write_run(runs / "unproven", "allreduce", "100mbit", 3.0, {}, status="unproven", proof="unproven")
    _write_run(runs / "bypassed", "allreduce", "100mbit", 9.0, {}, status="bypassed", proof="bypassed")
    r = _report(str(runs), "--out", str(tmp_path / "rep1"), "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["rows"]
    assert (row["ok"], row["mean_iter_s"], row["unproven_included"]) == (1, 1.0, 0)
    assert row["failed"] == ["bypassed: bypassed", "unproven: unproven"]
    r = _report(str(runs), "--out", str(tmp_path / "rep2"), "--include-unproven", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["rows"]
    assert (row["ok"], row["mean_iter_s"], row["unproven_included"]) == (2, 2.0, 1)  # median of 1.0 and 3.0
    assert row["failed"] == ["bypassed: bypassed"]  # never ranked, even when asked
    r = _report(str(runs), "--out", str(tmp_path / "rep3"), "--include-unproven")  # the table says the same
    assert r.returncode == 0 and "2/3" in r.stdout and "bypassed: bypassed" in r.stdout, r.stdout + r.stderr
