"""Records made on another machine (the lent GPU one): the machine file archive names them by,
and the self-test's output recorded as a benchmark result."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks import archive, gpu_tables, machine
from benchmarks import selftest as bench_selftest
from testbed.common.errors import TestbedError

ROWS = [{"check": "TCP goodput at 50mbit", "expected": "0.85-1.05 x rate", "measured": "47.8 Mbit/s (0.956)",
         "verdict": "pass", "detail": "", "data": {}},
        {"check": "nccl fp16 on 1 GPU", "expected": "status ok, proof passed", "measured": "status ok, proof passed",
         "verdict": "pass", "detail": "6 iterations in 12 s", "data": {"seconds": 12.2}},
        {"check": "netem delay 10ms", "expected": "RTT 20 ms (+3 ms)", "measured": "-", "verdict": "skip",
         "detail": "skipped: no netem in this kernel", "data": {}}]


def test_this_machine_is_described_without_a_host_name_and_read_back(tmp_path: Path) -> None:
    m = machine.describe()
    assert m["cpus"] == os.cpu_count() and set(m) <= set(machine.FIELDS)
    f = tmp_path / "machine.json"
    f.write_text(json.dumps({**m, "gpus": ["GPU 0: NVIDIA H100 80GB HBM3"]}))
    assert machine.load(f)["gpus"] == ["GPU 0: NVIDIA H100 80GB HBM3"]
    assert machine.line(machine.load(f)).endswith("1 GPU (NVIDIA H100 80GB HBM3)")
    assert machine.line({"cpus": 16, "cpu_model": "Xeon"}) == "16 CPUs (Xeon), memory not recorded"
    assert machine.line({}) == "not recorded"


@pytest.mark.parametrize("content, says", [
    ("[1, 2]", "not a JSON object"),
    ('{"cpus": 2, "hostname": "x"}', "unknown field 'hostname'"),
    ('{"cpus": "2"}', "field 'cpus' is not a int"),
    ('{"cpus": true}', "field 'cpus' is not a int"),
    ('{"gpus": [3]}', "field 'gpus' is not a list"),
    ('{"kernel": "' + "k" * 300 + '"}', "field 'kernel' is not a str"),
    ("{", "--machine"),
])
def test_a_bad_machine_file_is_refused_in_one_line(tmp_path: Path, content: str, says: str) -> None:
    f = tmp_path / "machine.json"
    f.write_text(content)
    with pytest.raises(TestbedError, match=says.replace("(", r"\(").replace(")", r"\)")):
        machine.load(f)


def test_archive_names_the_machine_the_records_were_measured_on(tmp_path: Path) -> None:
    src = tmp_path / "compute"
    archive.record(src, "compute_time", [{"model": "resnet18", "params": 11173962, "median_s": 0.0072,
                                          "min_s": 0.0068, "max_s": 0.0088, "amp": False}],
                   device="NVIDIA H100 80GB HBM3", torch="2.11.0+cu130", iters=20)
    there = {"cpus": 16, "cpu_model": "Xeon", "gpus": ["GPU 0: NVIDIA H100 80GB HBM3"]}
    dest = archive.write([src], "gpu-test", tmp_path / "records", there)
    info = json.loads((dest / "archive.json").read_text())
    assert info["machine"] == there and info["command"].endswith("--machine machine.json")
    named = archive.write([src], "gpu-test-2", tmp_path / "records", there, "h100.json")
    assert json.loads((named / "archive.json").read_text())["command"].endswith("--machine h100.json")
    here = json.loads((archive.write([src], "cpu-test", tmp_path / "records") / "archive.json").read_text())
    assert here["machine"]["cpus"] == os.cpu_count() and "--machine" not in here["command"]
    assert "| ResNet18 | 11.2 M | 7.2 [6.8-8.8] | - |" in gpu_tables.compute_time(dest)


def test_the_self_test_output_is_recorded_with_the_code_it_ran(tmp_path: Path, capsys) -> None:
    out = tmp_path / "selftest.json"
    out.write_text(json.dumps({"ok": True, "seconds": 151.8, "failed": [], "rows": ROWS,
                               "machine": {"cpus": 16, "gpus": ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-e6ee)"],
                                           "hostname": "gpu-17.lab"}}))
    assert bench_selftest.main(["--from", str(out), "--code", "49345c9b4bb4", "--record", str(tmp_path / "r")]) == 0
    res = json.loads((tmp_path / "r" / "result.json").read_text())
    assert res["benchmark"] == "selftest" and res["code_version"] == "49345c9" and res["rows"] == ROWS
    assert res["machine"] == {"cpus": 16, "gpus": ["GPU 0: NVIDIA H100 80GB HBM3"]}, "no UUID or host name kept"
    table = gpu_tables.gpu_selftest(tmp_path)
    assert "| nccl fp16 on 1 GPU | status ok, proof passed | status ok, proof passed | pass |" in table
    assert "| netem delay 10ms | RTT 20 ms (+3 ms) | - (skipped: no netem in this kernel) | skip |" in table
    assert "passed in 151.8 s; 1 NCCL runs passed, 12-12 s each" in table


def test_the_self_test_from_a_file_needs_its_commit_and_its_shape(tmp_path: Path, capsys) -> None:
    out = tmp_path / "selftest.json"
    out.write_text(json.dumps({"rows": [{"check": "x"}]}))
    with pytest.raises(SystemExit) as e:
        bench_selftest.main(["--from", str(out), "--record", str(tmp_path / "r")])
    assert e.value.code == 2 and "--from needs --code COMMIT" in capsys.readouterr().err
    assert bench_selftest.main(["--from", str(out), "--code", "abcdef0", "--record", str(tmp_path / "r")]) == 1
    assert "no self-test rows in it" in capsys.readouterr().err and not (tmp_path / "r").exists()


@pytest.mark.parametrize("change, says", [
    ({"ok": True, "rows": [{**ROWS[0], "verdict": "fail"}]}, "'ok' disagrees with its rows"),
    ({"ok": True, "rows": [{**ROWS[0], "verdict": "maybe"}]}, "a row is not the self-test's"),
    ({"ok": True, "rows": [{**ROWS[0], "measured": 3}]}, "a row is not the self-test's"),
    ({"ok": True, "rows": [{**ROWS[0], "data": []}]}, "a row is not the self-test's"),
])
def test_a_self_test_file_that_is_not_the_self_tests_is_refused(tmp_path: Path, capsys, change, says) -> None:
    out = tmp_path / "selftest.json"
    out.write_text(json.dumps({"seconds": 1.0, **change}))
    assert bench_selftest.main(["--from", str(out), "--code", "abcdef0", "--record", str(tmp_path / "r")]) == 1
    assert says in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_a_cell_with_a_bar_or_a_newline_stays_one_cell(tmp_path: Path) -> None:
    row = {**ROWS[0], "measured": "a | b\nc"}
    archive.record(tmp_path / "r", "selftest", [row], ok=True, seconds=1.0, machine={})
    assert "| a \\| b c | pass |" in gpu_tables.gpu_selftest(tmp_path)
