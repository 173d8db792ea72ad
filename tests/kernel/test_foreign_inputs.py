"""Code that is not ours, across a real testbed (issue 43): records a user's script nests too
deeply leave a summary that names the file, and a hook spec naming no factory is one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.helpers import dumbbell

from .conftest import cli

DEEP = """\
import json, os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
path, t = os.environ["TESTBED_RECORDS"], torch.ones(1000)
with open(path, "a") as f:
    f.write(json.dumps({"iter": 1, "time": time.time(), "loss": 1.0, "payload_bytes": 4000}) + "\\n")
    f.write("[" * 100000 + "\\n")
    f.write('{"a":' * 5000 + "1" + "}" * 5000 + "\\n")
for i in range(2, 5):
    dist.all_reduce(t)
    time.sleep(0.6)  # the run's live reader sees the deep lines
    with open(path, "a") as f:
        f.write(json.dumps({"iter": i, "time": time.time(), "loss": 1.0 / i, "payload_bytes": 4000}) + "\\n")
dist.destroy_process_group()
"""


def _topology(tmp_path: Path, name: str) -> Path:
    topo = tmp_path / f"{name}.yaml"
    topo.write_text(yaml.safe_dump(dumbbell(name, rate="1gbit")))
    return topo


def test_records_nested_too_deeply_leave_a_summary_naming_the_file(tmp_path, clean_kernel):
    (tmp_path / "deep.py").write_text(DEEP)
    r = cli("run", "--topology", str(_topology(tmp_path, "fdeep")), "--script", str(tmp_path / "deep.py"),
            "--out", str(tmp_path / "runs"), "--json", timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    s = json.loads(r.stdout)
    rank0 = str(Path(s["run_dir"]) / "rank0.jsonl")
    assert s["status"] == "ok" and s["iterations"] == 4, s
    assert {"file": rank0, "lines": 2, "why": "nested too deeply"} in s["records_skipped"], s["records_skipped"]
    assert f"warning: {rank0}: 2 record lines skipped (nested too deeply)" in r.stderr, r.stderr
    assert json.loads((Path(s["run_dir"]) / "summary.json").read_text())["records_skipped"] == s["records_skipped"]


def test_a_hook_spec_naming_no_factory_is_one_line_from_the_rank(tmp_path, clean_kernel):
    r = cli("run", "hook", "--hook", "os.path:join", "--topology", str(_topology(tmp_path, "fhook")),
            "--max-iters", "2", "--out", str(tmp_path / "runs"), timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"error \(rank \d\): --hook os\.path:join: calling it with the process group raised TypeError",
                     r.stderr), \
        r.stderr
