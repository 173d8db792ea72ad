"""The workload's options as one typed spec (testbed.runs.spec): parsed once by the workload's
own parser, rendered once for the ranks, paths absolute, checked without loading data."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.common.errors import TestbedError
from testbed.runs.request import RunRequest, UserCode
from testbed.runs.spec import WorkloadSpec
from workloads.arguments import parse_args


def _ckpt(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PK\x03\x04" + b"\0" * 60)  # begins as torch.save's zip does
    return path


@pytest.mark.parametrize("scheme, argv", [
    ("allreduce", []),
    ("topk:0.1", ["--lr", "0.2", "--stop-at-target", "--target-acc", "0.5", "--seed", "7"]),
    ("pactrain:0.5", ["--no-ternary", "--epochs", "0.3", "--width", "0.5", "--depth", "2", "--backend", "gloo"]),
    ("powersgd", ["--max-iters", "3", "--compute-time", "0.01", "--iface", "eth1", "--threads", "2"]),
])
def test_rendering_reads_back_as_the_same_options(scheme, argv):
    spec = WorkloadSpec.parse(scheme, argv)
    rendered = spec.argv()
    assert rendered[:2] == ["--scheme", scheme]  # a variant stays one (the summary's "variant")
    assert vars(parse_args(rendered, raise_errors=True)) == {**vars(spec.options), "out": None}
    assert WorkloadSpec.parse(scheme, spec.args()).options == spec.options  # parse(render(x)) == x
    assert spec.argv(Path("/r/x"))[-2:] == ["--out", "/r/x"]


def test_the_last_flag_given_wins_as_in_argparse():
    spec = WorkloadSpec.parse("allreduce", ["--backend", "gloo", "--seed", "1", "--backend=nccl", "--seed=4"])
    assert (spec.backend, spec.seed) == ("nccl", 4)
    assert spec.args().count("--backend") == 1 and spec.args().count("--seed") == 1


def test_the_backend_after_the_double_dash_is_read_from_the_spec():
    """`testbed run allreduce --backend gloo -- --backend nccl`: the typed option first, what
    followed `--` after it; the run's GPUs follow what the ranks will read."""
    from testbed.cli.workload import RUN_DEFAULTS, WORKLOAD_OPTIONS, workload_args

    w = {n: None for n, _, _ in WORKLOAD_OPTIONS} | RUN_DEFAULTS | {"backend": "gloo", "seed": 0,
                                                                      "stop_at_target": False}
    req = RunRequest(scheme="allreduce", workload_args=workload_args(w, ["--backend", "nccl"]))
    assert req.compute_backend == "nccl"
    assert RunRequest("allreduce", ["--epochs", "1"]).compute_backend == "auto"
    code = UserCode("script", "/x/t.py", Path("/x"))
    assert RunRequest("s", ["--backend", "nccl"], code=code).compute_backend == "auto"  # not ours to read
    assert RunRequest("s", ["--backend", "nccl"], code=code).workload is None


def test_paths_are_made_absolute_in_both_spellings(tmp_path, monkeypatch):
    """Ranks run in the run directory: a relative --init (also ``--init=FILE``), --data-dir or
    --hook-path is made absolute once, and the directories they need are mounted."""
    monkeypatch.chdir(tmp_path)
    _ckpt(tmp_path / "ck" / "p.pt")
    (tmp_path / "hooks").mkdir()
    spec = WorkloadSpec.parse("allreduce", ["--init=ck/p.pt", "--data-dir", "data", "--lr", "0.1"])
    assert spec.init == tmp_path / "ck" / "p.pt"
    assert spec.options.data_dir == str(tmp_path / "data")
    assert spec.mounts() == [tmp_path / "ck", tmp_path / "data"]
    assert ["--init", str(tmp_path / "ck" / "p.pt")] == spec.args()[spec.args().index("--init"):][:2]
    hook = WorkloadSpec.parse("hook", ["--hook", "m:f"])  # its module is found from where run started
    assert hook.options.hook_path == str(tmp_path) and tmp_path in hook.mounts()
    assert WorkloadSpec.parse("hook", ["--hook", "m:f", "--hook-path", "hooks"]).mounts() == [tmp_path / "hooks"]
    moved = spec.replace(init="ck/p.pt", seed=3)
    assert moved.init == tmp_path / "ck" / "p.pt" and moved.seed == 3 and spec.seed == 0  # a copy


@pytest.mark.parametrize("scheme, argv, says", [
    ("topk2", [], "unknown scheme 'topk2'"),
    ("allreduce", ["--epochs", "nan"], "--epochs must be a number > 0"),
    ("allreduce", ["--dataset", "mnist"], "unknown dataset 'mnist'"),
    ("allreduce", ["--model", "gpt"], "unknown model 'gpt'"),
    ("allreduce", ["--dataset", "cifar10"], "needs --data-dir"),
    ("allreduce", ["--dataset", "cifar10", "--data-dir", "/nonexistent"], "no cifar-10-batches-py/"),
    ("hook", [], "scheme hook needs --hook"),
    ("allreduce", ["--init", "/nonexistent.pt"], "no such file"),
    ("allreduce", ["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_options_are_one_line_errors(scheme, argv, says):
    with pytest.raises(TestbedError, match=says) as e:
        WorkloadSpec.parse(scheme, argv)
    assert "\n" not in e.value.message


def test_a_cifar_directory_needs_its_batches_as_regular_files(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    for f in [*(f"data_batch_{i}" for i in range(1, 6))]:
        (d / f).write_bytes(b"x")
    with pytest.raises(TestbedError, match="lacks test_batch"):
        WorkloadSpec.parse("allreduce", ["--dataset", "cifar10", "--data-dir", str(tmp_path)])
    (d / "test_batch").mkdir()
    with pytest.raises(TestbedError, match="lacks test_batch as regular files"):
        WorkloadSpec.parse("allreduce", ["--dataset", "cifar10", "--data-dir", str(tmp_path)])
    (d / "test_batch").rmdir()
    (d / "test_batch").write_bytes(b"not a pickle")  # what only loading finds is the ranks' to say
    assert WorkloadSpec.parse("allreduce", ["--dataset", "cifar10", "--data-dir", str(tmp_path)]).options.dataset \
        == "cifar10"


def test_a_checkpoint_is_checked_by_its_first_bytes_only(tmp_path):
    (tmp_path / "zeros.pt").write_bytes(b"\0" * 1024)
    with pytest.raises(TestbedError, match="not a checkpoint"):
        WorkloadSpec.parse("allreduce", ["--init", str(tmp_path / "zeros.pt")])
    assert WorkloadSpec.parse("allreduce", ["--init", str(_ckpt(tmp_path / "ok.pt"))]).init == tmp_path / "ok.pt"


def test_validation_loads_no_dataset_and_builds_no_model(tmp_path, monkeypatch):
    """The CLI's check reads names and file types: loading the data or building the model is
    the ranks' work (it was done in the CLI too, then again on every rank)."""
    import workloads.data
    import workloads.models
    import workloads.train

    def refuse(*a, **k):
        raise AssertionError("loaded in the CLI")

    monkeypatch.setattr(workloads.data, "load", refuse)
    for module, name in ((workloads.models, "build_model"), (workloads.train, "build_model"),
                         (workloads.train, "load_into")):
        monkeypatch.setattr(module, name, refuse)
    for f in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (tmp_path / f).write_bytes(b"x")
    WorkloadSpec.parse("pactrain", ["--init", str(_ckpt(tmp_path / "c.pt"))])
    WorkloadSpec.parse("allreduce", ["--dataset", "cifar10", "--data-dir", str(tmp_path), "--model", "resnet18"])
