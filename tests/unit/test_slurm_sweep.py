"""``sweep --slurm``'s logic: the request file (round trip, hostile fields), sbatch's argv
and the options refused, what each element's state is, and what a re-submission submits,
with a stand-in ``sbatch`` and ``squeue`` on PATH (real subprocesses). The Slurm lab runs
the feature for real: tests/kernel/test_slurm_sweep.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.common.errors import TestbedError
from testbed.model.units import Rate
from testbed.runs.sweeps import slurm as slurmsweep, request as sweepfile
from testbed.runs.request import UserCode
from testbed.runs.sweeps.sweep import Pretraining, SweepRequest
from testbed.runs.sweeps.element import element_name

TOPOLOGY = {"name": "t", "nodes": {"s1": {"kind": "switch"}, "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s1"]}, {"endpoints": ["w1", "s1"]}]}


def _req(out: Path, **kw) -> SweepRequest:
    base = dict(schemes=["allreduce", "topk"], bws=[Rate.parse("100mbit"), Rate.parse("1gbit")],
                workload_args=["--compute-time", "0.05", "--max-iters", "3"], out=out)
    return SweepRequest(**{**base, **kw})


def test_a_request_comes_back_as_it_went_and_its_key_ignores_where_it_lands(tmp_path):
    req = _req(tmp_path, repeats=2, params={"lr": ["0.1", "0.2"]}, timeout=60.0, init=None, tensorboard=True,
               pretrain=Pretraining("cnn", "digits", 1.0, width=0.5, seed=3))
    doc = json.loads(json.dumps(sweepfile.to_dict(req, TOPOLOGY)))
    back = sweepfile.from_dict(doc, "request.json")
    for field in ("schemes", "workload_args", "repeats", "params", "timeout", "tensorboard", "pretrain", "out"):
        assert getattr(back, field) == getattr(req, field), field
    assert [str(b) for b in back.bws] == ["100mbit", "1gbit"]
    assert sweepfile.key(doc) == sweepfile.key({**doc, "out": "/elsewhere"})
    assert sweepfile.key(doc) != sweepfile.key({**doc, "schemes": ["allreduce"]})
    code = UserCode.script(tmp_path / "train.py")
    mine = sweepfile.from_dict(sweepfile.to_dict(_req(tmp_path, schemes=[code.label], workload_args=[], code=code),
                                                 TOPOLOGY), "r")
    assert mine.code == code


@pytest.mark.parametrize("field, value, says", [
    ("version", 2, "version 2 is not 1"),
    ("schemes", "allreduce", "'schemes' is not a list of strings"),
    ("schemes", [], "'schemes' is not a list of strings"),
    ("bws", ["100"], "bws: '100' is not a rate"),
    ("repeats", True, "'repeats' is not a int"),
    ("repeats", 10**9, "'repeats' is not a int"),
    ("timeout", -1, "'timeout' is not a float"),
    ("out", "runs", "'out' is not an absolute path"),
    ("init", 3, "'init' is not a str"),
    ("params", {"lr": [1]}, "'params' is not a grid"),
    ("code", {"kind": "shell", "target": "x", "path": "/"}, "'kind' is not script or module"),
    ("pretrain", {"model": "cnn", "dataset": "digits", "epochs": "2", "seed": 0}, "'epochs' is not a float"),
    ("workload_args", ["--no-such-option"], "no-such-option"),
    ("topology", [], "'topology' is not a dict"),
])
def test_a_hostile_request_is_refused_naming_its_field(tmp_path, field, value, says):
    doc = sweepfile.to_dict(_req(tmp_path), TOPOLOGY)
    with pytest.raises(TestbedError, match=says.replace("(", r"\(")):
        sweepfile.from_dict({**doc, field: value}, "request.json")
    with pytest.raises(TestbedError, match="not a JSON object"):
        sweepfile.from_dict([doc], "request.json")


def test_a_request_file_that_is_not_one_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "request.json"
    bad.write_text("{")
    with pytest.raises(TestbedError, match="is not JSON"):
        sweepfile.read(bad)
    bad.unlink()
    os.mkfifo(bad)  # would block a reader that opened it plainly
    with pytest.raises(TestbedError, match="not a regular file"):
        sweepfile.read(bad)


@pytest.mark.parametrize("option", ["--array=0-3", "-a", "-a0-3", "--output=/tmp/x", "-o", "--error=x", "--wrap=id",
                                    "--parsable", "--wait", "-W", "--chdir=/", "-D/", "--job-name=x", "-Jx",
                                    # sbatch takes abbreviations and bundles (the review of the sweeps)
                                    "--outp=/tmp/x", "--chd=/var/tmp", "--arr=1", "--wr=id", "--parsa", "-vW",
                                    "-Ho/x"])
def test_sbatch_options_testbed_sets_are_refused(option):
    with pytest.raises(TestbedError, match="set by testbed sweep --slurm itself"):
        slurmsweep.check_sbatch(["-N", "1", option])


@pytest.mark.parametrize("options", [["/tmp/evil.sh"], ["--hold", "/tmp/evil.sh"], ["-N", "1", "evil"],
                                     ["-H", "evil"], ["--exclusive", "x"]])
def test_a_word_sbatch_would_take_for_the_script_is_refused(options):
    with pytest.raises(TestbedError, match="is not an option"):
        slurmsweep.check_sbatch(options)


def test_other_sbatch_options_pass_and_the_array_is_a_list_of_ranges():
    ok = ["--partition=lab", "-N", "2", "--time", "10", "--export=ALL", "-p", "lab", "-N2", "--hold", "-vH",
          "--mem", "1G", "--exclusive"]
    assert slurmsweep.check_sbatch(ok) == ok
    assert slurmsweep._ranges([0, 1, 2, 4, 6, 7]) == "0-2,4,6-7"
    assert slurmsweep._ranges([5]) == "5"


def test_an_elements_testbed_is_named_after_its_job_within_the_limit():
    assert element_name("dumbbell", "1234") == "dumbbell-j1234"
    long = element_name("x" * 32, "4294967295")
    assert len(long) == 32 and long.endswith("-j4294967295")


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch and squeue stand-ins on PATH: sbatch records its argv and answers job 41, 42, ...;
    squeue prints ``squeue.txt`` (the queue, as ``%F %K %T`` lines)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "sbatch.jsonl"
    (bin_ / "sbatch").write_text(f"#!{sys.executable}\nimport json, sys\n"
                                 f"p = {str(calls)!r}\n"
                                 "n = sum(1 for _ in open(p)) if __import__('os').path.exists(p) else 0\n"
                                 "open(p, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                                 "print(41 + n)\n")
    queue = tmp_path / "squeue.txt"
    queue.write_text("")
    (bin_ / "squeue").write_text(f"#!/bin/sh\ncat {queue}\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    return calls, queue


def _argvs(calls: Path) -> list[list[str]]:
    return [json.loads(line) for line in calls.read_text().splitlines()]


def test_a_submission_is_one_array_and_the_same_sweep_again_submits_only_what_is_missing(tmp_path, fake_slurm):
    calls, queue = fake_slurm
    req = _req(tmp_path / "runs")
    st, job = slurmsweep.submit(req, TOPOLOGY, ["--partition=lab"], 3, lambda m: None)
    assert job == "41" and len(st.elements) == 4 and {e.state for e in st.elements} == {"lost"}
    [argv] = _argvs(calls)
    d = st.dir
    assert argv == ["--partition=lab", "--parsable", "--array=0-3%3", f"--job-name={slurmsweep.job_name(d)}",
                    f"--output={d}/slurm/logs/%A_%a.out", str(d / "slurm" / "element.sh"), str(d)]  # ours last
    assert (d / "slurm" / "element.sh").read_text().endswith('_sweep-element "$1"\n')  # the directory: an argument
    name = slurmsweep.job_name(d)
    queue.write_text(f"41 0 RUNNING {name}\n41 2 PENDING {name}\n99 1 RUNNING {name}\n"  # 99 is not this sweep's
                     f"41 1 RUNNING testbed-other\n41 3 BOOT_FAIL {name}\n")  # nor another name's, nor an end
    _result(d, 1, "topk-100mbit-r0", "ok")
    _result(d, 3, "topk-1gbit-r0", "failed")
    st = slurmsweep.status(d)
    assert [e.state for e in st.elements] == ["running", "ok", "pending", "failed"]
    index = json.loads((d / "sweep.json").read_text())
    assert [r["run_id"] for r in index["runs"]] == ["topk-100mbit-r0", "topk-1gbit-r0"]
    (d / "topk-1gbit-r0").mkdir()  # the failed attempt's records
    st, job = slurmsweep.submit(_req(tmp_path / "runs"), TOPOLOGY, [], 3, lambda m: None)
    assert job == "42" and st.dir == d
    assert _argvs(calls)[1][1] == "--array=3%3"  # neither the running, the pending nor the ok one
    assert not (d / "topk-1gbit-r0").exists() and (d / "slurm" / "attempts" / "topk-1gbit-r0.1").is_dir()
    assert [e.state for e in st.elements] == ["running", "ok", "pending", "lost"]
    assert st.elements[3].job == "42"
    queue.write_text("")
    for i in (0, 2, 3):
        _result(d, i, st.elements[i].point.run_id, "ok")
    _result(d, 2, "not-this-element", "ok")  # a result that is not its element's: it runs again
    assert [e.state for e in slurmsweep.status(d).elements] == ["ok", "ok", "lost", "ok"]
    other = slurmsweep.submit(_req(tmp_path / "runs", repeats=2), TOPOLOGY, [], 3, lambda m: None)[0]
    assert other.dir != d and len(other.elements) == 8  # another request: another sweep


def _result(d: Path, i: int, run_id: str, status: str) -> None:
    (d / "slurm" / "results" / f"{i}.json").write_text(json.dumps({"run_id": run_id, "status": status}))


def test_what_cannot_be_submitted_is_refused_in_one_line(tmp_path, monkeypatch, fake_slurm):
    with pytest.raises(TestbedError, match="a '%' in the path"):
        slurmsweep.submit(_req(tmp_path / "a%j"), TOPOLOGY, [], 2, lambda m: None)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "a%j").exists()
    with pytest.raises(TestbedError, match="not a sweep submitted with --slurm"):
        slurmsweep.status(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    with pytest.raises(TestbedError, match="sbatch is not installed"):
        slurmsweep.submit(_req(tmp_path / "runs"), TOPOLOGY, [], 2, lambda m: None)


@pytest.mark.parametrize("args, says", [
    (["--wait"], "--sbatch, --array-limit and --wait go with --slurm"),
    (["--slurm", "--testbed", "x"], "give --topology FILE, not --testbed"),
    (["--slurm", "--sbatch", "--array=1"], "set by testbed sweep --slurm itself"),
    (["--slurm", "--sbatch", "'unclosed"], "--sbatch"),
    (["--status", "/nonexistent/sweep"], "no such sweep directory"),
    (["--status", "/", "--cancel", "/"], "give one"),
])
def test_the_commands_errors_are_one_line(tmp_path, args, says):
    r = subprocess.run([sys.executable, "-m", "testbed", "sweep", "--compute-time", "0.05", "--max-iters", "3", *args], cwd=tmp_path,
                       capture_output=True, text=True, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert r.returncode in (1, 2) and says in r.stderr, r.stderr  # 2: a usage error, in click's words
    assert "Traceback" not in r.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("field, value, says", [
    ("params", {f"k{i}": [str(j) for j in range(8)] for i in range(8)}, "'params' is not a grid"),  # 8**8 points
    ("params", {"bad key": ["1"]}, "'params' is not a grid"),
    ("workload_args", ["--lr", "0.1\0"], "'workload_args' is not a list of strings"),
    ("pretrain", {"model": "../../x", "dataset": "digits", "epochs": 1, "seed": 0}, "'model' is not a name"),
    ("pretrain", {"model": "cnn\0", "dataset": "digits", "epochs": 1, "seed": 0}, "'model' is not a"),
    ("bws", [f"{i}mbit" for i in range(1, 1001)], "more than the 10000 a sweep may have"),
])
def test_a_request_too_large_or_with_a_path_in_a_name_is_refused(tmp_path, field, value, says):
    """The review of the sweeps: a 3.6 KB grid was a MemoryError, a NUL a traceback, a '/' in a
    model's name moved the checkpoint out of checkpoints/."""
    doc = sweepfile.to_dict(_req(tmp_path, repeats=11), TOPOLOGY)
    with pytest.raises(TestbedError, match=says.replace("(", r"\(")):
        sweepfile.from_dict({**doc, field: value}, "request.json")


def test_the_paths_sbatch_gets_are_real_and_absolute(tmp_path, fake_slurm, monkeypatch):
    """The review of the sweeps: a link on the way to --out (another user's to swap later), or
    a relative --out that starts with '-' (an option to sbatch), never reaches sbatch."""
    calls, _ = fake_slurm
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    for out in (Path("link/runs"), Path("--wrap=touch x;y")):
        st, _job = slurmsweep.submit(_req(out), TOPOLOGY, [], None, lambda m: None)
        argv = _argvs(calls)[-1]
        assert argv[-1] == str(st.dir) == os.path.realpath(st.dir) and argv[-1].startswith("/")
        assert "--array=0-3" in argv and all(tmp_path.name in a for a in argv[-2:])
    assert st.dir.parent == tmp_path / "--wrap=touch x;y"


def test_cancel_and_status_take_only_the_sweeps_own_jobs(tmp_path, fake_slurm):
    """A job id Slurm reused for another job (another name in the queue) is neither this
    sweep's element nor cancelled by --cancel."""
    calls, queue = fake_slurm
    st, job = slurmsweep.submit(_req(tmp_path / "runs"), TOPOLOGY, [], None, lambda m: None)
    scancel = tmp_path / "bin" / "scancel"
    scancel.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scancel.txt\n")
    scancel.chmod(0o755)
    queue.write_text("41 0 RUNNING someone-elses\n")
    assert slurmsweep.cancel(st.dir) == [] and not (tmp_path / "scancel.txt").exists()
    assert {e.state for e in slurmsweep.status(st.dir).elements} == {"lost"}
    queue.write_text(f"41 0 RUNNING {slurmsweep.job_name(st.dir)}\n")
    assert slurmsweep.cancel(st.dir) == ["41"] and (tmp_path / "scancel.txt").read_text() == "41\n"


def test_a_refused_submission_leaves_nothing(tmp_path, fake_slurm):
    (tmp_path / "bin" / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Invalid partition name' >&2\nexit 1\n")
    with pytest.raises(TestbedError, match="sbatch refused the array: sbatch: error: Invalid partition"):
        slurmsweep.submit(_req(tmp_path / "new" / "runs"), TOPOLOGY, ["--partition=nope"], None, lambda m: None)
    assert not (tmp_path / "new").exists()
