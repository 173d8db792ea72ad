"""What the proof promises (issue 56): for the built-in trainer, every iteration's gradients
reached collectives carrying at least the scheme's floor (testbed.runs.volume), checked from
counts files; for your own code, what is and is not proven, said in the summary and the run's
table. The rank side for real: tests/workloads/test_volume.py and test_proof_gradients.py;
real runs: tests/kernel/test_proof.py."""

from __future__ import annotations

import json

import pytest

from testbed.cli.runs import _render_summary
from testbed.runs import volume
from testbed.runs.bounds import cuts
from testbed.runs.proof import apply, judge, read_counts

from .test_proof import THREE, WORKERS, _measured, _write

N = 10_000
"""Gradient elements of the model in these files."""


def _volume(floor=N * 4, carried=None, handed=N, iters=3, scheme="allreduce", checked=True, lost=()) -> dict:
    return {"scheme": scheme, "checked": checked, "elements": N, "element_bytes": 4,
            "handed": None if handed is None else [handed] * iters, "floor": [floor] * iters,
            "carried": carried or [floor] * iters, "lost": list(lost)}


def _proof(tmp_path, workload="trainer", **volumes) -> dict:
    """Eight ranks whose links carried plenty; ``volumes``: rank (r0..r7) -> its volume (None: none)."""
    _write(tmp_path)
    for r in range(8):
        v = volumes.get(f"r{r}", volumes.get("every"))
        if v is not None:
            f = tmp_path / f"collectives{r}.json"
            f.write_text(json.dumps(json.loads(f.read_text()) | {"volume": v}))
    return judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(10**9, 10**9), workload=workload)


def test_a_built_in_run_whose_every_iteration_met_its_floor_passes(tmp_path):
    proof = _proof(tmp_path, every=_volume())
    assert proof["verdict"] == "passed", proof
    g = proof["gradients"]
    assert (g["checked"], g["scheme"], g["elements"], g["iterations"], g["reason"]) == (True, "allreduce", N, 3, "")


def test_an_iteration_that_carried_less_than_the_floor_names_rank_iteration_and_shortfall(tmp_path):
    short = _volume(floor=800, carried=[800, 4, 800], scheme="topk")
    proof = _proof(tmp_path, every=_volume(floor=800, scheme="topk"), r5=short)
    assert proof["verdict"] == "unproven"
    assert proof["reason"] == ("the gradients did not all reach the collectives: rank 5 iteration 2: its collectives "
                               "carried 4 bytes, 796 short of the 800 bytes topk must move for its 10,000 gradient "
                               "elements")


def test_gradients_ddp_never_handed_the_hook_never_reached_a_collective(tmp_path):
    proof = _proof(tmp_path, every=_volume(floor=0, carried=[4, 4, 4], handed=0, scheme="fp16"))
    assert proof["verdict"] == "unproven"
    assert proof["reason"].endswith("rank 0 iteration 1: DDP handed fp16's hook 0 of the model's 10,000 gradient "
                                    "elements: 10,000 never reached a collective (and 23 more rank-iterations short)")


def test_the_first_failing_iteration_is_named_whichever_rank_it_is(tmp_path):
    proof = _proof(tmp_path, every=_volume(), r6=_volume(carried=[N * 4, 0, 0]), r2=_volume(carried=[N * 4] * 2 + [0]))
    assert "rank 6 iteration 2:" in proof["reason"] and "(and 2 more rank-iterations short)" in proof["reason"]


def test_iterations_whose_counts_were_lost_are_not_checked_but_counted(tmp_path):
    proof = _proof(tmp_path, every=_volume(carried=[N * 4, 0, N * 4], lost=[1]))
    assert proof["verdict"] == "passed" and proof["gradients"]["lost"] == 8 and proof["gradients"]["iterations"] == 2
    proof = _proof(tmp_path, every=_volume(carried=[0, 0, 0], lost=[0, 1, 2]))
    assert proof["verdict"] == "unproven" and "no training iteration of any rank could be checked" in proof["reason"]


def test_the_built_in_trainer_must_leave_a_volume(tmp_path):
    proof = _proof(tmp_path)
    assert proof["verdict"] == "unproven" and "rank(s) 0, 1, 2, 3, 4, 5, 6, 7 left no gradient volume" \
        in proof["reason"]
    proof = _proof(tmp_path, every=_volume(), r3=None, workload="code")  # one rank without: no user's code either
    assert proof["verdict"] == "unproven" and "rank(s) 3 left no gradient volume, which the others" in proof["reason"]


def test_your_own_code_passes_on_its_collectives_and_says_what_is_not_checked(tmp_path):
    proof = _proof(tmp_path, workload="code")
    assert proof["verdict"] == "passed"
    assert proof["gradients"]["checked"] is False and proof["gradients"]["note"] == volume.USER_CODE
    assert _proof(tmp_path, workload="module")["gradients"]["note"] == volume.OTHER_MODULE  # e.g. workloads.collective
    proof = _proof(tmp_path, every=_volume(scheme="hook", checked=False, floor=0, carried=[4, 4, 4]))
    assert proof["verdict"] == "passed" and proof["gradients"]["note"] == volume.OWN_HOOK


@pytest.mark.parametrize("damage", [{"floor": [1, 2], "carried": [1]}, {"floor": [-1]}, {"checked": "yes"},
                                    {"handed": [1] * 4}, {"floor": "x"}, {"lost": [True]}])
def test_a_damaged_volume_makes_the_rank_uncounted(tmp_path, damage):
    proof = _proof(tmp_path, every=_volume(), r4=_volume() | damage)
    assert proof["verdict"] == "unproven" and proof["reason"].startswith("rank(s) 4 left no collective counts")


def _table(capsys, proof: dict) -> str:
    s = {"run_id": "r1", "run_dir": "/runs/r1", "scheme": "script:x.py", "bottleneck": {"links": {}}}
    apply(s, proof)
    _render_summary(s)
    return " ".join(capsys.readouterr().out.replace("│", " ").split())  # the cells' text, wrapped lines joined


def test_the_run_table_says_what_a_user_scripts_proof_does_not_show(tmp_path, capsys):
    text = _table(capsys, _proof(tmp_path, workload="code"))
    assert "proven the bytes every rank handed to torch.distributed crossed the shaped links" in text, text
    assert "not proven your own code: the proof sees only the bytes it hands to torch.distributed; that its " \
           "gradients were exchanged at all is not checked (an exchange through files or its own sockets beside " \
           "small collectives is not caught)" in text, text


def test_the_run_table_says_a_built_in_runs_gradients_reached_their_collectives(tmp_path, capsys):
    text = _table(capsys, _proof(tmp_path, every=_volume(scheme="topk", floor=800)))
    assert "every iteration's 10,000 gradient elements reached topk's collectives, carrying at least what it must " \
           "send" in text and "not proven" not in text, text
    text = _table(capsys, _proof(tmp_path, every=_volume(carried=[0, N * 4, N * 4], lost=[0])))
    assert "carrying at least what it must send (8 rank-iterations with lost counts not checked)" in text, text
    text = _table(capsys, _proof(tmp_path, every=_volume(scheme="hook", checked=False, floor=0)))
    assert "not proven your own hook: no floor is known for what it must send" in text, text


def test_a_run_that_is_not_proven_promises_nothing(tmp_path, capsys):
    text = _table(capsys, _proof(tmp_path, every=_volume(carried=[0, 0, 0])))
    assert "unproven: the gradients did not all reach the collectives" in text and "proven the" not in text, text
