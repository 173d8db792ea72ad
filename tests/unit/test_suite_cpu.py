"""benchmarks.suite_cpu: a test's wall and machine CPU as a pytest plugin, summed per file."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.suite_cpu import busy_s, summary

ROOT = Path(__file__).resolve().parents[2]


def test_busy_counts_the_cpu_a_busy_loop_spends():
    before = busy_s()
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    assert busy_s() - before >= 0.25  # machine-wide: this loop's 0.3 s at least, others' too


def test_the_plugin_writes_a_row_per_test_and_the_summary_sums_them_per_file(tmp_path):
    (tmp_path / "test_a.py").write_text("import time\ndef test_one():\n    time.sleep(0.2)\ndef test_two():\n    pass\n")
    out = tmp_path / "cpu.jsonl"
    out.write_text('{"test": "an earlier run::t", "wall_s": 1, "cpu_s": 1}\n')  # not summed in
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.suite_cpu", "-p", "no:cacheprovider",
                        str(tmp_path / "test_a.py")], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "SUITE_CPU_OUT": str(out)})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["test"].split("::")[1] for x in rows] == ["test_one", "test_two"]
    assert rows[0]["wall_s"] >= 0.2 and rows[1]["wall_s"] < rows[0]["wall_s"]
    assert {x["cpus"] for x in rows} == {os.cpu_count()}
    s = summary(rows + [{"test": "b.py::t", "wall_s": 1.0, "cpu_s": 9.0}], top=1)
    assert s["tests"] == 3 and s["top_tests"][0]["test"] == "b.py::t"
    assert s["files"] == [{"file": "b.py", "tests": 1, "wall_s": 1.0, "cpu_s": 9.0}]


def test_the_summary_names_the_measuring_machines_cpus_not_the_readers():
    rows = [{"test": "a.py::t", "wall_s": 1.0, "cpu_s": 2.0, "cpus": 2}, {"test": "a.py::u", "wall_s": 1, "cpu_s": 1,
                                                                          "cpus": 2}]
    assert summary(rows, top=1)["cpus"] == "2"
    assert summary([{"test": "a.py::t", "wall_s": 1, "cpu_s": 1}], top=1)["cpus"] == "an unrecorded number of"
