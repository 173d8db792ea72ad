"""The user's own code (`testbed run --script` / `-m`): the rank-side runner, the records
contract read back into a summary, the command line's refusals (the proof: test_proof.py).
Real processes; no testbed needed (the kernel test runs them across one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.runs.request import RunRequest, UserCode
from testbed.runs.userrecords import clean, summary_from_records

from .test_cli import cli

ROOT = Path(__file__).resolve().parents[2]


def _runner(tmp_path: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    """``python -P -m workloads.userscript ARGS`` from an unrelated directory, as a rank runs it."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-P", "-m", "workloads.userscript", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_script_runs_as_main_with_its_arguments_and_its_siblings_importable(tmp_path):
    d = tmp_path / "code"
    d.mkdir()
    (d / "helper.py").write_text("VALUE = 41\n")
    (d / "train.py").write_text("import sys, helper\nprint(__name__, sys.argv[1:], helper.VALUE + 1)\n")
    r = _runner(tmp_path, str(d / "train.py"), "--lr", "0.1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "__main__ ['--lr', '0.1'] 42"


def test_the_working_directory_is_not_importable(tmp_path):
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "helper.py").write_text("raise SystemExit('imported from the working directory')\n")
    (tmp_path / "train.py").write_text("import importlib.util\nprint(importlib.util.find_spec('helper'))\n")
    r = _runner(tmp_path, str(tmp_path / "train.py"))
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stdout + r.stderr


@pytest.mark.parametrize("body, status, err", [
    ("import sys; sys.exit(3)", 3, ""),
    ("import sys; sys.exit('bad input')", 1, "bad input"),
    ("raise ValueError('boom')", 1, "ValueError: boom"),
    ("pass", 0, ""),
])
def test_the_rank_exits_with_the_scripts_status(tmp_path, body, status, err):
    (tmp_path / "s.py").write_text(body + "\n")
    r = _runner(tmp_path, str(tmp_path / "s.py"))
    assert r.returncode == status and err in r.stderr, r.stderr


def test_a_module_runs_from_the_given_path(tmp_path):
    pkg = tmp_path / "proj" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    r = _runner(tmp_path, "--module", "mypkg.train", "--path", str(tmp_path / "proj"), "x")
    assert r.returncode == 0 and r.stdout.strip() == "__main__ ['x']", r.stderr
    assert _runner(tmp_path, "--module", "mypkg.train").returncode == 2  # --path is required


def test_records_are_taken_only_with_the_contracts_types():
    assert clean({"iter": 3, "loss": 0.5, "payload_bytes": 10, "accuracy": 0.9, "extra": "kept out"}) == \
        {"iter": 3, "loss": 0.5, "payload_bytes": 10.0, "accuracy": 0.9}
    assert clean({"iter": True, "loss": "0.5", "time": float("nan"), "iter_s": float("inf")}) == {}
    assert clean({"iter": -1}) == {} and clean([1, 2]) is None and clean("x") is None


def _req(tmp_path) -> RunRequest:
    return RunRequest(scheme="script:t.py", workload_args=["30"], code=UserCode.script(tmp_path / "t.py"))


def test_a_summary_and_evaluations_come_from_the_records(tmp_path):
    t0 = 1000.0
    for rank in range(2):
        lines = [json.dumps({"iter": i, "time": t0 + i, "iter_s": 1.0, "loss": 1.0 / i, "payload_bytes": 100 + rank,
                             **({"accuracy": 0.1 * i} if rank == 0 and i % 2 == 0 else {})}) for i in range(1, 5)]
        lines.insert(1, "not json at all" if rank else json.dumps(["a list"]))
        (tmp_path / f"rank{rank}.jsonl").write_text("\n".join(lines[:3]) + "\n")  # rank 1: cut at the bad line
    s = summary_from_records(tmp_path, _req(tmp_path), 2, t_start=t0 - 50, duration=60.0)
    assert s["iterations"] == 2 and s["world_size"] == 2 and s["scheme"] == "script:t.py"
    assert s["final_accuracy"] == pytest.approx(0.2) and s["final_loss"] == pytest.approx(0.5)
    assert s["mean_iter_s"] == 1.0 and s["mean_payload_bytes"] == pytest.approx(301 / 3)  # rank 1 kept one record
    evals = [json.loads(l) for l in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert evals == [{"iter": 2, "time": t0 + 2, "train_s": 2.0, "accuracy": pytest.approx(0.2)}]  # from step 1's start


def test_hostile_records_leave_a_summary(tmp_path):
    """Numbers past float's range or near it, lists, deep nesting: each was a traceback after
    training (OverflowError in isfinite or fsum, AttributeError, RecursionError), and the
    run ended without summary.json."""
    good = json.dumps({"iter": 1, "time": 1000.0, "iter_s": 1.0, "payload_bytes": 100, "tx_bytes": 5})
    hostile = ['{"iter": 2, "payload_bytes": 1' + "0" * 400 + ', "tx_bytes": 1' + "0" * 400 + "}",
               '{"iter": 3, "payload_bytes": 1e308, "loss": 1e308, "time": 1e308}', "[1, 2, 3]",
               "[" * 50_000 + "]" * 50_000]
    (tmp_path / "rank0.jsonl").write_text("\n".join([good, *hostile, good.replace('"iter": 1', '"iter": 4')]) + "\n")
    s = summary_from_records(tmp_path, _req(tmp_path), 1, t_start=990.0, duration=20.0)
    assert s["iterations"] == 4 and s["mean_payload_bytes"] == 100.0 and s["final_loss"] is None


def test_records_skipped_are_named_in_the_summary_and_a_warning(tmp_path):
    """Records nested too deeply ended a running script's run with no summary.json and no
    file named (issue 43): the summary says which file lost how many lines, and why."""
    good = [json.dumps({"iter": i, "time": 1000.0 + i, "loss": 1.0}) for i in (1, 2, 3)]
    (tmp_path / "rank0.jsonl").write_text("\n".join([good[0], "[" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000,
                                                       "[1]", good[1], good[2]]) + "\n")
    (tmp_path / "rank1.jsonl").write_text(good[0] + "\n" + '{"iter": 2, "lo' + "\n" + good[2] + "\n")
    warned = []
    s = summary_from_records(tmp_path, _req(tmp_path), 2, t_start=990.0, duration=20.0, warn=warned.append)
    assert s["iterations"] == 3 and s["records"]["records_rank0"] == 3
    r0, r1 = str(tmp_path / "rank0.jsonl"), str(tmp_path / "rank1.jsonl")
    assert s["records_skipped"] == [{"file": r0, "lines": 2, "why": "nested too deeply"},
                                    {"file": r0, "lines": 1, "why": "not a JSON object"},
                                    {"file": r1, "lines": 2, "why": "not JSON (reading stopped there)"}]
    assert warned[0] == f"warning: {r0}: 2 record lines skipped (nested too deeply); the summary is made of the rest"
    assert len(warned) == 3 and all("\n" not in w for w in warned)
    assert summary_from_records(tmp_path, _req(tmp_path), 1, 990.0, 20.0)["records_skipped"][0]["file"] == r0


def test_an_oversized_or_foreign_records_file_is_skipped_whole_and_the_summary_written(tmp_path):
    from testbed.common.files import LIMITS

    (tmp_path / "rank0.jsonl").write_text(json.dumps({"iter": 1, "time": 1000.0, "loss": 1.0}) + "\n")
    with open(tmp_path / "rank1.jsonl", "wb") as f:
        f.truncate(LIMITS["records"] + 1)
    os.mkfifo(tmp_path / "rank2.jsonl")
    warned = []
    s = summary_from_records(tmp_path, _req(tmp_path), 3, t_start=990.0, duration=20.0, warn=warned.append)
    assert s["iterations"] == 1 and s["records"]["ranks_with_records"] == 1
    assert [(x["file"].rsplit("/", 1)[1], x["lines"]) for x in s["records_skipped"]] == [("rank1.jsonl", None),
                                                                                        ("rank2.jsonl", None)]
    assert "MiB" in s["records_skipped"][0]["why"] and "FIFO" in s["records_skipped"][1]["why"]
    assert warned[0].startswith(f"warning: skipped {tmp_path / 'rank1.jsonl'} (") and len(warned) == 2


def test_no_records_at_all_is_a_summary_without_figures(tmp_path):
    s = summary_from_records(tmp_path, _req(tmp_path), 3, t_start=0.0, duration=5.0)
    assert s["iterations"] == 0 and s["mean_payload_bytes"] is None and s["final_accuracy"] is None
    assert s["records"]["ranks_with_records"] == 0


@pytest.mark.parametrize("args, words, status", [
    ((), "give a SCHEME", 2),
    (("nosuchscheme",), "Invalid value for '[SCHEME]': unknown scheme 'nosuchscheme'", 2),
    (("--script", "x.py", "-m", "m"), "not both", 2),
    (("--script", "{ex}", "--model", "resnet18"), "--model configures the built-in trainer", 2),
    (("--script", "{ex}", "--epochs", "3"), "--epochs configures the built-in trainer", 2),
    (("allreduce", "--expect-bytes", "10"), "No such option: --expect-bytes", 2),  # the proof needs no hint
    (("--script", "/nonexistent/t.py"), "--script /nonexistent/t.py: No such file", 1),
    (("--script", "/dev/null"), "--script /dev/null is a character device, not a regular file", 1),
    (("-m", "os; rm -rf /"), "is not a module name", 1),
    (("hook",), "scheme hook needs --hook package.module:factory", 1),
    (("hook", "--hook", "os;rm -rf /"), "--hook must be package.module:factory", 2),
])
def test_bad_requests_for_your_own_code_are_refused_before_anything_is_built(args, words, status):
    ex = str(ROOT / "examples" / "ddp_digits.py")
    r = cli("run", *[a.replace("{ex}", ex) for a in args])
    assert r.returncode == status and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_what_another_host_gets_of_your_code_is_its_directory_without_outputs_bounded(tmp_path, monkeypatch):
    from testbed.common.errors import TestbedError
    from testbed.hosts import runplace

    proj = tmp_path / "proj"
    for d in ("pkg/sub", ".git", "__pycache__", "runs/r1", "out", "old"):
        (proj / d).mkdir(parents=True)
    for f in ("train.py", "sib.py", "pkg/__init__.py", "pkg/sub/m.py", ".git/HEAD", "__pycache__/x.pyc",
              "runs/r1/rank0.jsonl", "out/a.txt", "old/run.json", "old/rank0.log", ".hidden"):
        (proj / f).write_text("x")
    (proj / "secret").symlink_to("/etc/hostname")
    tree = UserCode.script(proj / "train.py").tree(proj / "out")
    got = sorted(str(f.relative_to(proj)) for f, _ in tree.files())
    assert got == ["pkg/__init__.py", "pkg/sub/m.py", "runs/r1/rank0.jsonl", "sib.py", "train.py"]
    # a module: only its top-level package (or file) from the start directory
    assert [p.name for p in UserCode.module("pkg.sub.m", proj).tree(proj / "out").entries] == ["pkg"]
    assert [p.name for p in UserCode.module("sib", proj).tree(proj / "out").entries] == ["sib.py"]
    assert UserCode.module("installed.elsewhere", proj).tree(proj / "out").entries == ()
    monkeypatch.setattr(runplace, "MAX_CODE_FILES", 3)
    with pytest.raises(TestbedError, match=f"your code's directory {proj} holds more than 3 files"):
        tree.files()
