"""Rootless BASE on the nodes of a Slurm job (one per node and job, also outside agents) and
the removal of the folders ended jobs left in the shared home directory."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from testbed.common import hostbase, rootless


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for k in ("SLURM_JOB_ID", "SLURMD_NODENAME", rootless.ENV, "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(k, raising=False)
    return tmp_path


def test_a_command_on_a_node_of_a_job_has_that_nodes_own_base(home, monkeypatch):
    """A batch script or `srun testbed doctor`: host-NODE-jobID, even where a runtime
    directory exists (it may be on the shared home, or another job's), so two nodes never
    share one holder."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(home))
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07.cluster")
    assert rootless.base_dir() == home / ".local/state/testbed/host-gpu07-job12"
    monkeypatch.setenv("SLURMD_NODENAME", "gpu08")
    assert rootless.base_dir() == home / ".local/state/testbed/host-gpu08-job12"


def test_salloc_s_shell_off_the_nodes_and_no_job_keep_the_users_base(home, monkeypatch):
    assert rootless.base_dir() == home / ".local/state/testbed"
    monkeypatch.setenv("SLURM_JOB_ID", "12")  # salloc's shell on a login machine: no node name
    assert rootless.base_dir() == home / ".local/state/testbed"
    monkeypatch.setenv("SLURM_JOB_ID", "x; rm")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert rootless.base_dir() == home / ".local/state/testbed"


def test_a_host_agent_in_a_job_takes_the_node_and_job_and_outside_one_the_host(home, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURMD_NODENAME", "n/1")
    rootless.use_host_base()
    assert os.environ[rootless.ENV] == str(home / ".local/state/testbed/host-n_1-job12")
    monkeypatch.delenv(rootless.ENV)
    monkeypatch.delenv("SLURM_JOB_ID")
    rootless.use_host_base()
    assert os.environ[rootless.ENV] == str(home / ".local/state/testbed" / f"host-{hostbase.safe_name(os.uname().nodename)}")


def _base(root: Path, name: str) -> Path:
    d = root / name
    (d / "ns").mkdir(parents=True)
    (d / "holder.lock").touch()
    (d / "holder.pid").write_text("1\n")
    return d


def test_prune_removes_what_nothing_uses_and_only_that(tmp_path):
    root = tmp_path / "testbed"
    root.mkdir()
    ended = _base(root, "host-n1-job1")  # this node's, no holder, no command inside
    current = _base(root, "host-n1-job2")  # the job this runs in
    busy = _base(root, "host-n1-job3")  # a command works inside (its lock)
    held = _base(root, "host-n1-job4")  # its holder runs on this node
    other_ended = _base(root, "host-n2-job5")  # another node's, job ended
    other_live = _base(root, "host-n2-job6")  # another node's, job running
    ssh = _base(root, "host-n1")  # an SSH host agent's: no job, never pruned
    outside = tmp_path / "outside"
    _base(outside, "x")
    (root / "host-n1-job7").symlink_to(outside / "x")  # a planted link: left, and its target too
    (root / "host-n1-job8").write_text("a file")
    (ended / "ns" / "out").symlink_to(outside / "x")  # a link inside: removed, not followed
    lock = os.open(busy / "holder.lock", os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_SH)
    asked = []

    def slurm(jobs):
        asked.append(set(jobs))
        return {5}

    try:
        got = hostbase.prune(lambda p: p == held, root, node="n1", job="2", ask_slurm=True, ended=slurm)
    finally:
        os.close(lock)
    assert sorted(got) == [ended, other_ended]
    assert asked == [{5, 6}]
    assert not ended.exists() and not other_ended.exists()
    assert all(p.exists() for p in (current, busy, held, other_live, ssh, root / "host-n1-job8"))
    assert (root / "host-n1-job7").is_symlink() and (outside / "x" / "holder.pid").exists()
    # without asking Slurm (an agent starting on n1): other nodes' folders stay
    assert hostbase.prune(lambda p: False, root, node="n2", job="", ended=slurm) == [other_live]
    assert asked == [{5, 6}]


def test_prune_leaves_a_root_that_is_no_directory_of_ours(tmp_path):
    (tmp_path / "real").mkdir()
    _base(tmp_path / "real", "host-n1-job1")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert hostbase.prune(lambda p: False, tmp_path / "link", node="n1", job="") == []
    assert hostbase.prune(lambda p: False, tmp_path / "missing", node="n1", job="") == []
    assert (tmp_path / "real" / "host-n1-job1").exists()


def test_slurm_says_which_jobs_ended(monkeypatch):
    out = "5 RUNNING\n6 COMPLETING\n7 CANCELLED\n8 PENDING\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, ""))
    assert hostbase.ended_jobs({5, 6, 7, 9}) == {7, 9}  # 9: purged, no longer known
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "no controller"))
    assert hostbase.ended_jobs({5, 9}) == set()

    def missing(*a, **k):
        raise FileNotFoundError("squeue")

    monkeypatch.setattr(subprocess, "run", missing)
    assert hostbase.ended_jobs({5}) == set()
    assert hostbase.ended_jobs(set()) == set()
