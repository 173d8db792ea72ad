"""Benchmark results as records (benchmarks.archive's result.json) and network.md's tables
made from them (benchmarks.network_tables); the page itself is checked by test_regenerate."""

from __future__ import annotations

import json

import pytest

from benchmarks import archive, network_tables, regenerate


def _fidelity(where, rows, **extra):
    return archive.record(where, "link_fidelity", rows, seconds=4, capacity_bps={"local (veth)": 11.5e9}, **extra)


def test_a_recorded_result_is_archived_and_rendered_with_its_spread(tmp_path):
    rows = [{"path": "local (veth)", "rate_bps": 100e6, "goodput_bps": g, "repeat": k}
            for k, g in enumerate((95.6e6, 95.5e6, 95.0e6))]
    rows.append({"path": "local (veth)", "rate_bps": 10e9, "goodput_bps": 8.9e9, "repeat": 0})
    _fidelity(tmp_path / "fid", rows)
    dest = archive.write([tmp_path / "fid"], "fidelity-test", records=tmp_path / "records")
    assert json.loads((dest / "fid" / "result.json").read_text())["rows"] == rows
    assert archive.runs_of(dest) == []  # a result folder holds no runs
    text = network_tables.link_fidelity(dest)
    assert "| local (veth) | 100mbit | 3 | 95.5 [95.0-95.6] | 0.955 [0.950-0.956] |" in text
    assert "| local (veth) | 10gbit | 1 | 8900.0 | 0.890 |" in text
    assert "local (veth): 11500 Mbit/s" in text
    assert "1 benchmark result of code" in regenerate.provenance(dest)


def test_a_result_without_rows_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "result.json").write_text(json.dumps({"benchmark": "link_fidelity"}))
    with pytest.raises(archive.Refused, match="no list of rows"):
        archive.write([tmp_path / "bad"], "x", records=tmp_path / "records")
    assert not (tmp_path / "records" / "x").exists()


def test_records_without_the_benchmark_name_the_command(tmp_path):
    with pytest.raises(Exception, match="benchmarks.link_fidelity --record"):
        network_tables.link_fidelity(tmp_path)


def test_collective_efficiency_per_congestion_control(tmp_path):
    rows = [{"cc": cc, "asked": asked, "repeat": k, "rate_bps": 100e6, "payload": 10e6, "mean": mean,
             "best": mean * 0.99, "tcp": [0.955, 0.933], "wire": 20e6}
            for k in range(2) for cc, asked, mean in (("reno", "reno", 0.836 + k / 1000), ("bbr", "host", 0.907))]
    archive.record(tmp_path / "ce", "collective_efficiency", rows, bytes=10_000_000, iters=8)
    dest = archive.write([tmp_path / "ce"], "ce-test", records=tmp_path / "records")
    text = network_tables.collective_efficiency(dest)
    # 80 Mbit / 0.836 s / 100 Mbit/s = 0.957
    assert "| Reno (shipped topologies) | 2 | 0.956 [0.956-0.957] |" in text
    assert "| BBR (this host's default) | 2 | 0.882 [0.882-0.882] |" in text
    assert "10 MB float32 all-reduce" in text and "100mbit" in text


def test_up_down_rows_per_kind_with_ratios_of_medians(tmp_path):
    rows = [{"kind": "star", "workers": 8, "repeat": k, "up_s": 0.12 + k / 100, "floor_up_s": 0.06, "down_s": 0.008,
             "floor_down_s": 0.004} for k in range(3)]
    rows += [{"kind": "rootless", "workers": 8, "repeat": 0, "root_up_s": 0.5, "root_down_s": 0.3, "user_up_s": 0.6,
              "user_down_s": 0.45}]
    archive.record(tmp_path / "ud", "up_down", rows)
    dest = archive.write([tmp_path / "ud"], "ud-test", records=tmp_path / "records")
    star = network_tables.up_down(dest, "star")
    assert "| 8 | 3 | 0.130 [0.120-0.140] | 0.060 [0.060-0.060] | 2.17 | 0.008 [0.008-0.008] |" in star
    rootless = network_tables.up_down(dest, "rootless")
    assert "| 8 | 1 | 0.500 | 0.600 | 1.20 | 0.300 | 0.450 | 1.50 |" in rootless  # user / root
    with pytest.raises(Exception, match="no docker rows"):
        network_tables.up_down(dest, "docker")


def test_results_are_read_without_following_links_and_two_results_pool(tmp_path):
    rows = [{"path": "local (veth)", "rate_bps": 100e6, "goodput_bps": 95.6e6, "repeat": 0}]
    for name in ("a", "b"):
        _fidelity(tmp_path / "records" / "two" / name, rows)
    text = network_tables.link_fidelity(tmp_path / "records" / "two")
    assert "| local (veth) | 100mbit | 2 | 95.6 [95.6-95.6] |" in text  # both results' rows in one row
    (tmp_path / "records" / "two" / "c").mkdir()
    (tmp_path / "records" / "two" / "c" / "result.json").symlink_to(tmp_path / "records" / "two" / "a" / "result.json")
    with pytest.raises(archive.Refused, match="link"):
        network_tables.link_fidelity(tmp_path / "records" / "two")


def test_a_result_missing_a_field_is_a_one_line_error_of_regenerate(tmp_path, capsys):
    records = tmp_path / "records"
    archive.record(records / "bad" / "r", "link_fidelity", [{"path": "local (veth)", "rate_bps": 1e8}], seconds=4)
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_text("<!-- regenerate: link_fidelity records=bad -->\n<!-- /regenerate -->\n")
    assert regenerate.main(["--check", "--docs", str(tmp_path / "docs"), "--records", str(records)]) == 1
    err = capsys.readouterr().err
    assert "link_fidelity cannot read" in err and "goodput_bps" in err and "Traceback" not in err


def test_the_quick_start_row_joins_its_timings_and_its_archived_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "20261127-1200-pactrain", "request": {"scheme": "pactrain"}}))
    (run / "summary.json").write_text(json.dumps({
        "run_id": "20261127-1200-pactrain", "status": "ok", "scheme": "pactrain", "iterations": 75, "median_iter_s": 0.1354,
        "final_accuracy": 0.96936, "bottleneck": {"bytes_per_iteration": 2.92e6}}))
    archive.record(tmp_path / "result", "quick_start", [{
        "install_s": 101.6, "run_s": 27.9, "venv_bytes": 1.31e9, "torch": "2.13.0+cpu", "run_id": "20261127-1200-pactrain",
        "tree": "abc1234", "env": ["PIP_FIND_LINKS"], "user_processes_gone_s": 0.4}])
    dest = archive.write([tmp_path / "result", tmp_path / "run"], "qs", records=tmp_path / "records")
    assert "| abc1234 | 102 | 1.31 | 2.13.0+cpu | 28 | 75 | 135 | 0.9694 | 2.92 | ok | 0.4 |" in network_tables.quick_start(dest)


def test_compute_times_on_cpu_are_recorded_and_rendered_per_model_and_precision(tmp_path):
    """benchmarks.compute_time --record on this machine's CPU (the GPU's run is the same
    command), rendered by gpu_tables: a real measurement, so only its shape is checked."""
    from benchmarks import compute_time, gpu_tables

    assert compute_time.main(["--models", "resnet18", "--iters", "1", "--batch-size", "2", "--device", "cpu",
                              "--record", str(tmp_path / "ct")]) == 0
    dest = archive.write([tmp_path / "ct"], "ct", records=tmp_path / "records")
    text = gpu_tables.compute_time(dest)
    assert "| ResNet18 | 11.2 M | " in text and text.splitlines()[2].endswith("| - |")  # no bf16 run
    assert "CPU (" in text and "1 timed steps" in text


def test_vm_rows_give_boot_per_vm_and_the_guest_kernel_alone(tmp_path):
    rows = [{"kind": "vm", "workers": 4, "up_s": u, "floor_up_s": 5.0, "down_s": 0.2, "accel": "tcg", "repeat": k}
            for k, u in enumerate((22.0, 24.0))]
    archive.record(tmp_path / "ud", "up_down", rows + [{"kind": "star", "workers": 8, "up_s": 0.1}])
    dest = archive.write([tmp_path / "ud"], "ud", records=tmp_path / "records")
    assert "| 4 | 2 | tcg | 23.0 [22.0-24.0] | 5.8 [5.5-6.0] | 5.0 [5.0-5.0] | 0.20 [0.20-0.20] |" in \
        network_tables.up_down_vm(dest)


def test_a_trace_run_gives_the_mean_iteration_at_each_rate(tmp_path):
    run = tmp_path / "tr"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": "t1", "request": {"scheme": "allreduce"}}))
    (run / "summary.json").write_text(json.dumps({
        "run_id": "t1", "status": "ok", "proof": "passed", "iterations": 120, "bw_trace": {
            "file": "/x/uplink.csv", "steps_applied": 4, "late_s": {"median": 0.0021, "max": 0.0035},
            "iterations_by_rate": [{"rate_bps": 1e7, "iterations": 5, "mean_iter_s": 0.6612},
                                   {"rate_bps": 1e8, "iterations": 83, "mean_iter_s": 0.0631}]}}))
    dest = archive.write([run], "tr", records=tmp_path / "records")
    text = network_tables.trace_run(dest)
    assert "| t1 | 10mbit | 5 | 0.661 |" in text and "| t1 | 100mbit | 83 | 0.063 |" in text
    assert "4 trace steps applied, in force a median 2.1 ms (at most 3.5 ms)" in text


def test_a_low_rate_stream_lasts_long_enough_to_carry_its_minimum_and_the_table_says_so(tmp_path):
    from benchmarks import link_fidelity

    assert link_fidelity.stream_seconds(4, 10e6) == 12.0 and link_fidelity.stream_seconds(4, 100e6) == 4
    _fidelity(tmp_path / "fid", [{"path": "local (veth)", "rate_bps": 10e6, "goodput_bps": 9.55e6, "repeat": 0}],
              min_bits=120e6)
    dest = archive.write([tmp_path / "fid"], "f", records=tmp_path / "records")
    assert "One TCP stream for 4 s, and at least long enough to carry 120 Mbit at the rate" in \
        network_tables.link_fidelity(dest)
