"""The quick start's run has a time to target (issue 59): digits' default target is 0.9 when
the run trains, none with --compute-time (no accuracy) or on another data set, and the
command line a sweep renders stays the user's."""

from __future__ import annotations

from workloads.arguments import parse_args, render, target


def test_digits_runs_are_timed_to_its_default_target_and_others_to_theirs():
    assert target(parse_args([])) == 0.9
    assert target(parse_args(["--target-acc", "0.5"])) == 0.5
    assert target(parse_args(["--dataset", "cifar10"])) is None
    assert target(parse_args(["--compute-time", "0.1", "--max-iters", "3"])) is None
    assert "--target-acc" not in render(parse_args([]))  # not written into the ranks' argv


def test_the_runs_table_names_the_target():
    from testbed.cli import runs
    from testbed.cli.render import out

    summary = {"run_id": "r", "scheme": "allreduce", "bw": "100mbit", "world_size": 8, "iterations": 75,
               "final_accuracy": 0.97, "target_accuracy": 0.9, "time_to_target_s": 4.13, "mean_iter_s": 0.16,
               "mean_payload_bytes": 1e6, "bottleneck": {}, "proof": "passed", "run_dir": "runs/r"}
    with out.capture() as cap:
        runs._render_summary(summary)
    assert "time to 0.9 accuracy" in cap.get() and "4.1 s" in cap.get()
    with out.capture() as cap:
        runs._render_summary({**summary, "target_accuracy": None, "time_to_target_s": None})
    assert "time to target" in cap.get()
