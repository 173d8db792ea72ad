"""A disk that fills during a run, for real (a tmpfs a few dozen KiB large as --out).

The run ends with one line naming the run directory's file system and what was kept, no
traceback; the records written before stay readable; the ranks are stopped and the
bottleneck's shape from before --bw is back. `report` on a disk too small for its figures
says which file it could not write.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from testbed.common.files import read_jsonl
from tests.helpers import dumbbell

from .conftest import cli, cli_json, pids_of_this_session

pytestmark = pytest.mark.kernel
TRAIN = ["--", "--dataset", "digits", "--epochs", "50", "--max-iters", "5000", "--eval-every", "100000"]


@contextlib.contextmanager
def tiny_disk(path: Path, size: str):
    """A tmpfs of ``size`` mounted at ``path`` for the block."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _ranks_running() -> list[int]:
    """Every ``workloads.train`` process but those of the unit and workload tests that
    another pytest-xdist worker runs beside the kernel tests."""
    return pids_of_this_session("workloads.train")


def test_a_disk_that_fills_during_a_run_ends_it_cleanly_and_keeps_the_records(clean_kernel, tmp_path):
    topo = tmp_path / "fd.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("fd", rate="100mbit")))
    cli_json("up", str(topo))
    try:
        with tiny_disk(tmp_path / "disk", "96k") as disk:
            r = cli("run", "allreduce", "-t", "fd", "--bw", "50mbit", "--out", str(disk / "runs"), "--no-exporter",
                    *TRAIN, timeout=300)
            assert r.returncode == 1, r.stdout + r.stderr
            assert "Traceback" not in r.stderr, r.stderr
            run_dir = next((disk / "runs").iterdir())
            assert f"the file system of {run_dir} is full" in r.stderr or "No space left on device" in r.stderr, \
                r.stderr
            assert f"kept in {run_dir}: rank0.jsonl" in r.stderr, r.stderr
            assert "df -h" in r.stderr, r.stderr
            # what was written before is readable, complete records only
            recs = read_jsonl(run_dir / "rank0.jsonl")
            assert len(recs) >= 10 and [x["iter"] for x in recs] == list(range(1, len(recs) + 1))
            assert not _ranks_running()
        # the bottleneck is back to its shape from before --bw
        st = cli_json("status", "fd")
        shaped = [l for l in st["links"] if l["bottleneck"]]
        assert shaped and all(l["forward"]["shape"]["rate"] == "100mbit" for l in shaped), shaped
        # the same testbed runs again once there is space
        r = cli("run", "allreduce", "-t", "fd", "--out", str(tmp_path / "runs"), "--no-exporter", "--json",
                "--", "--dataset", "digits", "--max-iters", "5", timeout=300)
        assert r.returncode == 0, r.stderr
    finally:
        cli("down", "fd")


def test_report_on_a_full_disk_names_the_file_it_could_not_write(clean_kernel, tmp_path):
    topo = tmp_path / "fdr.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("fdr")))
    runs = tmp_path / "runs"
    r = cli("run", "allreduce", "--topology", str(topo), "--out", str(runs), "--no-exporter",
            "--", "--dataset", "digits", "--max-iters", "10", timeout=300)
    assert r.returncode == 0, r.stderr
    size = sum(p.stat().st_size for p in runs.rglob("*") if p.is_file())
    with tiny_disk(tmp_path / "disk", f"{size // 1024 + 40}k") as disk:  # the records and a little more
        shutil.copytree(runs, disk / "runs")
        r = cli("report", str(disk / "runs"))
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert f"could not write {disk / 'runs' / 'report'}/" in r.stderr and "ENOSPC" in r.stderr, r.stderr
        # the run's own records are untouched
        assert json.loads((next((disk / "runs").glob("2*")) / "summary.json").read_text())["status"] == "ok"
