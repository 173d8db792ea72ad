"""training.md's benchmark tables (benchmarks.training_tables) from constructed results of
benchmarks.scale_exchange and benchmarks.schemes, archived as their --record writes them;
the page itself is checked by test_regenerate."""

from __future__ import annotations

import pytest

from benchmarks import archive, regenerate, training_tables

MS = {"max": 20.0, "max-dissemination": 4.0, "sum": 20.0, "sum-int8": 18.0, "ternary": 28.0}
"""Each op's median call at 1 Gbit in run 0, in ms; run 1 takes 10 % longer on every op."""


def _exchange(where, rates=(1e9, 100e6)):
    rows = [{"rate_bps": bps, "repeat": k, "op": op, "bytes": 64, "world_size": 8, "mean_s": 1.0, "min_s": 0.5,
             "median_s": ms * (1 + k / 10) * (1e9 / bps if op == "sum" else 1) / 1e3}
            for k in range(2) for bps in rates for op, ms in MS.items()]
    archive.record(where, "scale_exchange", rows, layers=16, elements=272378, iters=200, warmup=5, repeats=2,
                   topology="three_switch", load_before=0.5, load_after=1.25)
    return archive.write([where], "se-test", records=where.parent / "records")


def test_scale_exchange_rows_per_rate_with_the_spread_over_runs(tmp_path):
    text = training_tables.scale_exchange(_exchange(tmp_path / "se"))
    lines = text.splitlines()
    assert lines[0] == ("| uplinks | runs | scales, ring all-reduce ms | scales, dissemination ms | fp32 all-reduce ms | "
                        "int8 all-reduce ms | ternary whole ms | ring / dissemination | int8 / fp32 | ternary / fp32 | "
                        "ternary - int8 - scales ms |")
    # medians of two runs (x1.0 and x1.1); ratios equal in both runs; remainder 28 - 18 - 4 = 6 (and 6.6)
    assert lines[2] == ("| 1 Gbit | 2 | 21.00 [20.00-22.00] | 4.20 [4.00-4.40] | 21.00 [20.00-22.00] | "
                        "18.90 [18.00-19.80] | 29.40 [28.00-30.80] | 5.00 [5.00-5.00] | 0.90 [0.90-0.90] | "
                        "1.40 [1.40-1.40] | 6.30 [6.00-6.60] |")
    assert lines[3].startswith("| 100 Mbit | 2 | 21.00 [20.00-22.00] | 4.20 [4.00-4.40] | 210.00 [200.00-220.00] |")
    assert "| 0.09 [0.09-0.09] | 0.14 [0.14-0.14] |" in lines[3]
    assert "8 ranks on three_switch" in text and "200 calls timed after 5 warm-up calls" in text
    assert "load average (1 min): 0.50 when the benchmark began, 1.25 when it ended." in text


def test_scale_exchange_without_its_result_names_the_command(tmp_path):
    archive.record(tmp_path / "r", "schemes", [{"part": "grouped"}])
    with pytest.raises(Exception, match="benchmarks.scale_exchange --record"):
        training_tables.scale_exchange(tmp_path)


def _schemes(where, one=True):
    rows = []
    if one:
        rows += [{"part": "one process", "scheme": s, "payload_bytes": p, "hook_s": h} for s, p, h in (
            ("allreduce", 40e6, [0.003, 0.004, 0.005]),
            ("fp16", 20e6, [0.008, 0.010, 0.009]),
            ("pactrain 0.5 exact", 20.02e6, [0.02, 0.03, 0.025]))]
    rows += [{"part": "grouped", "scheme": s, "ranks": 4, "payload_bytes": p, "between_bytes": b, "messages": n,
              "iter_s": t} for s, p, b, n, t in (
        ("allreduce", 40e6, None, None, [3.0, 3.2, 2.9]),
        ("prunex 0.5", 60e6, 40e6, None, [3.3, 3.0, 3.2]),
        ("spardl 0.01 d=2", 1e6, 0.5e6, 12.0, [3.6, 3.4, 3.5]))]
    extra = {"model": "resnet18", "batch_size": 32, "reps": 3, "warmup": 6, "load_before": 1.0, "load_after": 2.0}
    if one:
        extra.update(device="2 threads", torch="2.5.1", prune_ratio=0.5, backward_s=[0.6, 0.5, 0.7, 0.65],
                     pack_s=[0.012, 0.015, 0.013], buckets=7, kept_fraction=0.5004)
    archive.record(where, "schemes", rows, **extra)
    return archive.write([where], "sc-test", records=where.parent / "records")


def test_scheme_costs_one_process_with_pack_scatter(tmp_path):
    text = training_tables.scheme_costs(_schemes(tmp_path / "sc"))
    lines = text.splitlines()
    assert lines[:5] == ["| scheme | payload / allreduce | hook ms | hook / backward |", "| --- | ---: | ---: | ---: |",
                         "| allreduce | 1.0000 | 4.0 [3.0-5.0] | 0.006 [0.005-0.008] |",
                         "| fp16 | 0.5000 | 9.0 [8.0-10.0] | 0.014 [0.013-0.016] |",
                         "| pactrain 0.5 exact | 0.5005 | 25.0 [20.0-30.0] | 0.040 [0.032-0.048] |"]
    assert "backward pass, 625 ms [500-700] (4 passes" in text  # median of 0.5, 0.6, 0.65, 0.7
    assert "each hook timed 3 times after 6 warm-up iterations" in text
    assert "pack/scatter alone: 13.0 [12.0-15.0] ms per iteration over its 7 buckets, 0.021 of backward" in text
    assert "payload is 0.10% above (1 - 0.5) x dense" in text and "0.5004 of the parameters are kept" in text
    assert "load average (1 min): 1.00 when the benchmark began, 2.00 when it ended." in text


def test_scheme_costs_grouped_relative_to_allreduce(tmp_path):
    text = training_tables.scheme_costs_grouped(_schemes(tmp_path / "sc", one=False))
    lines = text.splitlines()
    assert lines[0].startswith("| scheme (4 ranks) | payload per rank / allreduce | between domains / allreduce |")
    assert lines[2:5] == ["| allreduce | 1.0000 | - | 3000 [2900-3200] | 1.000 | - |",
                          "| prunex 0.5 | 1.5000 | 1.0000 | 3200 [3000-3300] | 1.067 | - |",
                          "| spardl 0.01 d=2 | 0.0250 | 0.0125 | 3500 [3400-3600] | 1.167 | 12 |"]
    assert "3 iterations per scheme timed after 6 warm-up ones" in text
    with pytest.raises(Exception, match="no one process allreduce row"):
        training_tables.scheme_costs(tmp_path / "records" / "sc-test")


def test_a_result_missing_a_field_is_a_one_line_error_of_regenerate(tmp_path, capsys):
    records = tmp_path / "records"
    archive.record(records / "bad" / "r", "scale_exchange", [{"rate_bps": 1e9, "op": "max", "repeat": 0}])
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_text("<!-- regenerate: scale_exchange records=bad -->\n<!-- /regenerate -->\n")
    assert regenerate.main(["--check", "--docs", str(tmp_path / "docs"), "--records", str(records)]) == 1
    err = capsys.readouterr().err
    assert "scale_exchange cannot read" in err and "median_s" in err and "Traceback" not in err


def test_the_generators_are_registered():
    assert {"scale_exchange", "scheme_costs", "scheme_costs_grouped"} <= set(regenerate.GENERATORS)
