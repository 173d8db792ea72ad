"""`testbed sweep --param`: the grid's parsing, its points per scheme, and the CLI's refusals
(logic only; tests/kernel/test_usercode.py sweeps a script and hooks on a real testbed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.common.errors import TestbedError
from testbed.runs.sweeps import grid
from testbed.runs.request import RunRequest, UserCode

from .test_cli import cli

ROOT = Path(__file__).resolve().parents[2]


def test_every_combination_runs_in_the_order_given():
    g = grid.parse(["lr=0.1,0.01", "batch=32,64"])
    assert grid.points(g) == [{"lr": "0.1", "batch": "32"}, {"lr": "0.1", "batch": "64"},
                              {"lr": "0.01", "batch": "32"}, {"lr": "0.01", "batch": "64"}]
    assert grid.points({}) == [{}]
    assert grid.argv({"lr": "0.1", "hook": "m:f"}) == ["--lr", "0.1", "--hook", "m:f"]
    assert grid.slug({"lr": "0.1", "hook": "m.sub:f"}) == "lr0.1-hookm.sub_f"


def test_a_switch_in_the_grid_picks_the_trainers_flag_and_your_code_gets_it_as_written():
    """`sweep --param ternary=on,off` runs pactrain with --ternary and with --no-ternary; a
    user's script gets `--ternary off` as it was written (it is not our flag)."""
    from workloads.arguments import parse_args

    assert grid.argv({"ternary": "off", "lr": "0.1"}, builtin=True) == ["--no-ternary", "--lr", "0.1"]
    assert grid.argv({"ternary": "ON"}, builtin=True) == ["--ternary"]
    assert grid.argv({"ternary": "maybe"}, builtin=True) == ["--ternary", "maybe"]  # the trainer refuses it
    assert grid.argv({"ternary": "off"}) == ["--ternary", "off"]
    req = RunRequest(scheme="pactrain", workload_args=["--epochs", "1"], params={"ternary": "off"})
    assert parse_args(["--scheme", "pactrain", *req.args], raise_errors=True).ternary is False
    mine = RunRequest(scheme="script", workload_args=[], params={"ternary": "off"},
                      code=UserCode("script", "/x/train.py", Path("/x")))
    assert mine.args == ["--ternary", "off"]


def test_a_point_reaches_the_code_after_its_own_arguments():
    req = RunRequest(scheme="allreduce", workload_args=["--epochs", "1", "--backend", "gloo"],
                     params={"lr": "0.1", "backend": "nccl"})
    assert req.args == ["--epochs", "1.0", "--lr", "0.1", "--backend", "nccl"]  # typed, rendered once
    assert req.compute_backend == "nccl"  # the point's, after the arguments: the last one wins, as in argparse
    mine = RunRequest(scheme="s", workload_args=["--epochs", "1", "--backend", "gloo"], params={"backend": "nccl"},
                      code=UserCode("script", "/x/train.py", Path("/x")))
    assert mine.args == ["--epochs", "1", "--backend", "gloo", "--backend", "nccl"]  # not ours: as given


def test_a_schemes_own_parameter_goes_only_to_the_schemes_that_have_it():
    g = grid.parse(["hook=m:a,m:b", "lr=0.1,0.01"])
    assert grid.for_scheme(g, "allreduce") == [{"lr": "0.1"}, {"lr": "0.01"}]  # once per lr, not per hook
    assert len(grid.for_scheme(g, "hook")) == 4
    assert grid.for_scheme(grid.parse(["topk-ratio=0.1,0.01"]), "topk:0.5") == [{"topk-ratio": "0.1"},
                                                                                {"topk-ratio": "0.01"}]
    assert len(grid.for_scheme(g, None)) == 4  # the user's code gets every point


@pytest.mark.parametrize("specs, words", [
    (["lr"], "is not KEY=VALUE"), (["=1"], "is not KEY=VALUE"), (["l r=1"], "is not KEY=VALUE"),
    (["--lr=1"], "is not KEY=VALUE"), (["lr=1,,2"], "empty value"), (["lr=1,1"], "1 given twice"),
    (["lr=1", "lr=2"], "given twice"), (["batch-size=1", "batch_size=2"], "given twice"),
    ([f"k{i}=1,2" for i in range(11)], "2048 points"),
])
def test_bad_grids_are_refused_naming_what_is_wrong(specs, words):
    with pytest.raises(TestbedError, match=words):
        grid.parse(specs)


@pytest.mark.parametrize("args, words, status", [
    (("--script", "{ex}", "--lr", "0.1"), "--lr configures the built-in trainer", 2),
    (("--script", "{ex}", "--schemes", "topk"), "--schemes configures the built-in trainer", 2),
    (("--script", "{ex}", "-m", "x"), "not both", 2),
    (("--expect-bytes", "10",), "No such option: --expect-bytes", 2),
    (("--script", "{ex}", "--param", "lr"), "--param 'lr' is not KEY=VALUE", 1),
    (("--schemes", "allreduce,hook", "--param", "hook=os;rm"), "--hook must be package.module:factory", 1),
    (("--schemes", "allreduce", "--param", "nosuch=1"), "nosuch", 1),
])
def test_bad_sweeps_are_refused_before_anything_is_built(args, words, status, tmp_path):
    ex = str(ROOT / "examples" / "ddp_digits.py")
    r = cli("sweep", "--out", str(tmp_path / "runs"), *[a.replace("{ex}", ex) for a in args])
    assert r.returncode == status and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "runs").exists()
