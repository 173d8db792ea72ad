"""Sweep's expansion of variants, seeds per repeat and the shared checkpoint's key (logic);
the kernel tests run sweeps for real."""

import pytest

from testbed.cli.workload import with_prune_ratios as _with_prune_ratios
from testbed.common.errors import TestbedError
from testbed.runs.sweeps.sweep import Pretraining, SweepRequest, _request
from workloads.schemes import parse_variant
from workloads.train import hyper_params, parse_args


def test_prune_ratios_expand_every_pactrain_entry_and_nothing_else():
    got = _with_prune_ratios(["allreduce", "topk:0.1", "pactrain", "pactrain:ternary"], "0.1, 0.9")
    assert got == ["allreduce", "topk:0.1", "pactrain:0.1", "pactrain:0.9", "pactrain:0.1:ternary",
                   "pactrain:0.9:ternary"]
    for names, ratios, says in ((["pactrain:0.5"], "0.3", "sets a pruning ratio"),
                                (["allreduce"], "0.3", "needs a pactrain entry"),
                                (["pactrain"], "1.5", "not a ratio in [0, 1)"),
                                (["pactrain"], "x", "not a ratio"), (["pactrain"], ",", "is empty")):
        with pytest.raises(TestbedError, match=says.replace("[", r"\[").replace(")", r"\)")):
            _with_prune_ratios(names, ratios)


def test_each_repeat_gets_its_own_seed(tmp_path):
    """Repeat k runs with the spec's seed + k (read from the typed options, the last --seed
    given winning as in argparse); the user's code gets its arguments unchanged."""
    from testbed.runs.request import UserCode

    req = SweepRequest(schemes=["allreduce"], bws=[], workload_args=["--seed", "1", "--lr", "0.1", "--seed=3"])
    runs = [_request(req, "allreduce", {}, rep, None, "tb", None, tmp_path, f"r{rep}") for rep in (0, 2)]
    assert [r.workload.seed for r in runs] == [3, 5]
    assert runs[1].args == ["--lr", "0.1", "--seed", "5"]
    assert req.spec("allreduce", {}) is req.spec("allreduce", {})  # parsed once per scheme and point
    mine = SweepRequest(schemes=["script:t.py"], bws=[], workload_args=["--seed", "3"],
                        code=UserCode("script", "/x/t.py", tmp_path))
    assert _request(mine, "script:t.py", {}, 2, None, "tb", None, tmp_path, "r2").args == ["--seed", "3"]


def test_the_checkpoint_key_names_the_pretraining_dataset():
    a = Pretraining("cnn", "digits", 2.0)
    b = Pretraining("cnn", "synthetic", 2.0)
    assert a.key != b.key and "synthetic" in b.key
    assert Pretraining("resnet18", "cifar10", 1, width=0.5, depth=2, seed=4).args() == [
        "--model", "resnet18", "--dataset", "cifar10", "--seed", "4", "--epochs", "1", "--width", "0.5", "--depth", "2"]


@pytest.mark.parametrize("spec, name, values", [
    ("topk:0.1", "topk", {"topk_ratio": "0.1"}),
    ("pactrain:0.8:ternary", "pactrain", {"prune_ratio": "0.8", "ternary": "true"}),
    ("pactrain:grasp:stable_iters=5:0.3", "pactrain", {"prune_method": "grasp", "stable_iters": "5",
                                                       "prune_ratio": "0.3"}),
    ("pactrain:prune_ratio=0.2:0.5", None, "unexpected .0.5."),
    ("pactrain:ternary:ternary", None, "ternary is set twice"),
    ("powersgd:8:start_iter=20", "powersgd", {"powersgd_rank": "8", "powersgd_start_iter": "20"}),
    ("terngrad:clip=0", "terngrad", {"terngrad_clip": "0"}),
    ("allreduce:0.1", None, "unexpected '0.1'"),
    ("topk:0.1:0.2", None, "unexpected '0.2'"),
    ("topk:k=3", None, "topk has no parameter 'k'"),
    ("topk:ratio=", None, "has no value"),
    ("nope:1", None, "unknown scheme 'nope'"),
])
def test_variant_specs(spec, name, values):
    if name is None:
        with pytest.raises(ValueError, match=values):
            parse_variant(spec)
        return
    scheme, got = parse_variant(spec)
    assert scheme.name == name and got == values


def test_a_variant_sets_the_train_arguments_and_lands_in_hyper():
    args = parse_args(["--scheme", "pactrain:0.8:ternary", "--lr", "0.1"], raise_errors=True)
    assert (args.scheme, args.variant, args.prune_ratio, args.ternary) == ("pactrain", "pactrain:0.8:ternary", 0.8, True)
    from workloads.schemes import get
    h = hyper_params(args, get("pactrain"))
    assert (h["prune_ratio"], h["ternary"], h["terngrad_clip"], h["lr"]) == (0.8, True, 2.5, 0.1)
    assert "topk_ratio" not in h and "seed" not in h
    plain = hyper_params(parse_args(["--scheme", "pactrain:exact"], raise_errors=True), get("pactrain"))
    assert "terngrad_clip" not in plain, "clip changes nothing without ternary"
    # repeats of a sweep start from checkpoints pre-trained with seeds 0, 1, ...: one variant
    inits = {hyper_params(parse_args(["--init", f"/c/{Pretraining('cnn', 'digits', 2, seed=s).key}.pt"],
                                     raise_errors=True), get("allreduce"))["init"] for s in (0, 1, 12)}
    assert inits == {"cnn-w1-dfull-digits-e2.pt"}
    mine = parse_args(["--init", "/c/my-s1-e2.ckpt"], raise_errors=True)
    assert hyper_params(mine, get("allreduce"))["init"] == "my-s1-e2.ckpt"
    with pytest.raises(ValueError, match="--topk-ratio is given twice"):
        parse_args(["--scheme", "topk:0.1", "--topk-ratio=0.2"], raise_errors=True)
    with pytest.raises(ValueError, match="invalid float value: 'x'"):
        parse_args(["--scheme", "topk:x"], raise_errors=True)


def test_a_cached_checkpoint_that_is_a_link_or_someone_elses_is_refused(tmp_path):
    import os

    from testbed.runs.sweeps.sweep import checkpoint

    pre = Pretraining("cnn", "digits", 2.0)
    (tmp_path / "checkpoints").mkdir(mode=0o700)
    cached = tmp_path / "checkpoints" / f"{pre.key}.pt"
    victim = tmp_path / "victim.pt"
    victim.write_bytes(b"someone's")
    cached.symlink_to(victim)
    with pytest.raises(TestbedError, match="not a file of yours"):
        checkpoint(tmp_path, pre, print)
    cached.unlink()
    cached.write_bytes(b"ours")
    assert checkpoint(tmp_path, pre, print) == cached  # one's own is reused
    if os.geteuid() == 0:
        os.chown(cached, 65534, 65534)
        with pytest.raises(TestbedError, match="not a file of yours"):
            checkpoint(tmp_path, pre, print)


def test_each_repeat_starts_from_its_own_pretrained_checkpoint(tmp_path, monkeypatch):
    """Repeat k pre-trains with seed + k, once (reused by every scheme's repeat k); --init
    is every repeat's start instead; without pre-training there is none."""
    from pathlib import Path

    from testbed.runs.sweeps import sweep as sw

    made = []

    def fake(out, pre, say):
        made.append(pre.seed)
        return out / f"{pre.key}.pt"

    monkeypatch.setattr(sw, "checkpoint", fake)
    pre = Pretraining("cnn", "digits", 1, seed=3)
    inits = sw.Checkpoints(SweepRequest(schemes=["allreduce"], bws=[], workload_args=[], out=tmp_path, pretrain=pre), print)
    got = [inits.get(rep) for rep in (0, 1, 0, 2, 1)]
    assert made == [3, 4, 5]
    assert [p.name for p in got] == [f"{Pretraining('cnn', 'digits', 1, seed=s).key}.pt" for s in (3, 4, 3, 5, 4)]
    given = SweepRequest(schemes=["allreduce"], bws=[], workload_args=[], out=tmp_path, pretrain=pre,
                         init=Path("/c.pt"))
    assert sw.Checkpoints(given, print).get(2) == Path("/c.pt")
    assert sw.Checkpoints(SweepRequest(schemes=["allreduce"], bws=[], workload_args=[]), print).get(1) is None
    assert made == [3, 4, 5]
