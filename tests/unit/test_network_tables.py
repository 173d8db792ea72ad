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
