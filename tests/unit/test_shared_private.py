"""What another user can read (issue 43): a new report directory is private (0700, files
0600) whatever the umask, asked through the CLI so that it runs on code from before
testbed.common.outdir too (tests/kernel/test_shared_machine.py asks as a second real user,
for runs, the monitor and the metrics too)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys


def test_a_new_report_directory_and_its_files_are_private_whatever_the_umask(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "request": {"scheme": "allreduce", "bw": "1gbit"}}))
    (run / "summary.json").write_text(json.dumps({"run_id": "r1", "scheme": "allreduce", "bw": "1gbit",
                                                  "status": "ok", "world_size": 2, "mean_iter_s": 0.1}))
    out = tmp_path / "rep"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(tmp_path / "runs"), "--out", str(out)],
                       capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert r.returncode == 0, r.stdout + r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o700, f"{out} is {stat.S_IMODE(out.stat().st_mode):o}"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert "report.csv" in modes and all(m == 0o600 for m in modes.values()), modes
