"""Time-to-accuracy composed (issue 58, item 1b): a real run's accuracy per iteration against a
paper-scale run's time per state, on constructed run directories whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.common.errors import TestbedError
from testbed.runs.reports.compose import compose, seconds_at

HYPER = {"model": "cnn", "batch_size": 32, "lr": 0.05, "max_iters": 8}


def _run(d: Path, payloads: list[int], iter_s: list[float], evals: list[tuple[int, float]] | None = None,
         **summary) -> Path:
    d.mkdir(parents=True)
    s = {"status": "ok", "scheme": "pactrain", "model": "cnn", "dataset": "digits", "world_size": 4,
         "hyper": dict(HYPER), "proof": "passed", "accuracy_measured": True, "final_accuracy": 0.9,
         "compute_time_s": None, "dilation": 1, **summary}
    (d / "summary.json").write_text(json.dumps(s))
    (d / "rank0.jsonl").write_text("".join(json.dumps({"iter": i + 1, "iter_s": t, "payload_bytes": p}) + "\n"
                                           for i, (p, t) in enumerate(zip(payloads, iter_s))))
    (d / "eval.jsonl").write_text("".join(json.dumps({"iter": i, "accuracy": a}) + "\n" for i, a in evals or []))
    return d


def test_each_iteration_takes_the_time_of_its_state_and_states_between_are_interpolated(tmp_path):
    # the time run: dense (1000 B) for 3 iterations then pruned (400 B); its first left out
    tim = _run(tmp_path / "t", [1000, 1000, 1000, 400, 400, 400], [9.0, 0.5, 0.5, 0.2, 0.2, 0.2],
               compute_time_s=0.05, accuracy_measured=False, final_accuracy=None)
    # the accuracy run at CPU speed (its own times are ignored): dense, then 700 B, then 400 B
    acc = _run(tmp_path / "a", [1000, 1000, 700, 400], [5.0, 5.0, 5.0, 5.0], [(2, 0.5), (3, 0.7), (4, 0.95)])
    c = compose(acc, tim)
    assert c.seconds_per_state == {400: 0.2, 1000: 0.5}
    assert [(p["iter"], p["accuracy"]) for p in c.points] == [(2, 0.5), (3, 0.7), (4, 0.95)]
    assert [p["train_s"] for p in c.points] == pytest.approx([1.0, 1.35, 1.55])  # 700 B: half way, 0.35 s
    assert seconds_at(c.seconds_per_state, 400) == 0.2 and c.flags == []


@pytest.mark.parametrize("change, error", [
    ({"model": "resnet18"}, "model differs"),
    ({"hyper": {**HYPER, "lr": 0.1}}, "hyper-parameter lr differs"),
    ({"compute_time_s": None}, "is not a paper-scale run"),
    ({"proof": "unproven"}, "its proof did not pass"),
    ({"status": "failed"}, "not a finished run"),
])
def test_runs_that_cannot_be_composed_are_refused_in_one_line(tmp_path, change, error):
    tim = _run(tmp_path / "t", [1000, 1000], [1.0, 0.5], **{"compute_time_s": 0.05, **change})
    acc = _run(tmp_path / "a", [1000], [1.0], [(1, 0.5)])
    with pytest.raises(TestbedError) as e:
        compose(acc, tim)
    assert error in e.value.message and "\n" not in e.value.message


def test_a_state_the_time_run_never_passed_through_is_not_extrapolated(tmp_path):
    tim = _run(tmp_path / "t", [1000, 1000, 1000], [1.0, 0.5, 0.5], compute_time_s=0.05)
    acc = _run(tmp_path / "a", [1000, 400], [1.0, 1.0], [(2, 0.5)])
    with pytest.raises(TestbedError, match="outside what the time run measured"):
        compose(acc, tim)


def test_an_unvalidated_dilation_or_a_hook_of_ones_own_is_flagged(tmp_path):
    tim = _run(tmp_path / "t", [1000, 1000], [1.0, 0.5], compute_time_s=0.05, dilation=8, dilation_validated=False,
               scheme="hook")
    acc = _run(tmp_path / "a", [1000, 1000, 1000, 1000], [1.0] * 4, [(1, 0.9), (2, 0.91), (3, 0.92), (4, 0.5)],
               scheme="hook")
    c = compose(acc, tim)
    assert len(c.flags) == 2 and "not validated" in c.flags[0] and "your own hook" in c.flags[1]
    assert c.tta(0.9) == pytest.approx(0.5)  # held at iterations 1-3: sustained from the first
    assert c.tta(0.95) is None
