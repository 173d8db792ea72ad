"""docs/results/cli.md's tables from benchmark results (benchmarks.cli_tables), and what the
benchmarks record (cli_start, run_checks, rank_start --record); the page itself is checked by
test_regenerate."""

from __future__ import annotations

import pytest

from benchmarks import archive, cli_start, cli_tables, rank_start

THIS = {"tree": 0, "commit": "abc1234", "uncommitted": ["benchmarks/x.py", "testbed/cli/y.py"]}
OLD = {"tree": 1, "commit": "7b2c8b8"}


def _archived(tmp_path, benchmark, rows, **extra):
    archive.record(tmp_path / "res", benchmark, rows, **extra)
    return archive.write([tmp_path / "res"], "test", records=tmp_path / "records")


def _cli_rows(row, after, before):
    return [{"tree": t, "commit": c, "row": row, "repeat": k, "s": s}
            for t, c, xs in ((0, "abc1234", after), (1, "7b2c8b8", before)) for k, s in enumerate(xs)]


def test_cli_start_before_after_with_targets(tmp_path):
    rows = (_cli_rows("--version", [0.12, 0.10, 0.14], [0.30, 0.33, 0.29])
            + _cli_rows("up", [0.61, 0.70, 0.65], [0.90, 0.95, 0.85])
            + _cli_rows("library down", [0.02, 0.01, 0.03], [0.15, 0.16, 0.14]))
    dest = _archived(tmp_path, "cli_start", rows, runs=3, cpus=2, root=True, topology="three_switch",
                     trees=[THIS, OLD], targets_s={"--version": 0.2, "up": 0.3}, heavy=["pyroute2", "yaml"],
                     imports={"testbed.cli": [[], ["pyroute2", "yaml"]]})
    text = cli_tables.cli_start(dest)
    assert ("| ms, median [min-max] | before (7b2c8b8) | after (abc1234 + 2 uncommitted files) | after / before "
            "| target (issue 44) | met |") in text
    assert "| `testbed --version` | 300 [290-330] | 120 [100-140] | 0.40 | 200 | met |" in text
    assert "| `testbed up three_switch` | 900 [850-950] | 650 [610-700] | 0.72 | 300 | not met |" in text
    assert "| library `down` | 150 [140-160] | 20 [10-30] | 0.13 | - | - |" in text
    assert text.index("--version") < text.index("up three_switch") < text.index("library")
    assert "3 runs, the trees taking turns in each; 2 CPUs, as root." in text
    assert "1 of them the package's code (testbed/cli/y.py)" in text
    assert "`import testbed.cli` imports none of them after and pyroute2, yaml before (7b2c8b8)" in text


def test_run_checks_per_case(tmp_path):
    rows = [{"case": case, "tree": t, "commit": c, "repeat": k, "s": s}
            for case, new, old in (("digits (allreduce)", [0.4, 0.5, 0.3], [3.0, 3.4, 3.2]),
                                   ("digits (pactrain: pre-trains)", [0.5, 0.5, 0.6], [12.0, 13.0, 14.0]))
            for t, c, xs in ((0, "abc1234", new), (1, "1521cc1", old)) for k, s in enumerate(xs)]
    dest = _archived(tmp_path, "run_checks", rows, runs=3, cpus=2,
                     trees=[{"tree": 0, "commit": "abc1234", "uncommitted": []}, {"tree": 1, "commit": "1521cc1"}])
    text = cli_tables.run_checks(dest)
    assert "| before (1521cc1) | after (abc1234) | after / before |" in text
    assert "| digits (allreduce) | 3.20 [3.00-3.40] | 0.40 [0.30-0.50] | 0.12 |" in text
    assert "| digits (pactrain: pre-trains) | 13.00 [12.00-14.00] | 0.50 [0.50-0.60] | 0.04 |" in text
    assert "abc1234 had no uncommitted changes." in text


def _rank_result():
    return {"ranks": 8, "runs": {
        "zygote": [{"wall_s": 10.0, "cpu_s": 13.0, "max_rss": 300e6, "pss_all": 1300e6, "status": "ok"},
                   {"wall_s": 12.0, "cpu_s": 15.0, "max_rss": 310e6, "pss_all": 1250e6, "status": "ok"}],
        "plain": [{"wall_s": 18.0, "cpu_s": 26.0, "max_rss": 350e6, "pss_all": 2100e6, "status": "ok"},
                  {"wall_s": 20.0, "cpu_s": 24.0, "max_rss": 352e6, "pss_all": None, "status": "ok"}]}}


def test_rank_start_records_every_run_and_the_tables(tmp_path):
    rows = rank_start.records([_rank_result()])
    assert rows[0] == {"ranks": 8, "zygote": True, "repeat": 0, "wall_s": 10.0, "cpu_s": 13.0,
                       "max_rss_bytes_per_rank": 300e6, "pss_bytes_all_ranks": 1300e6, "status": "ok"}
    assert [(r["zygote"], r["repeat"]) for r in rows] == [(True, 0), (True, 1), (False, 0), (False, 1)]
    dest = _archived(tmp_path, "rank_start", rows, scheme="allreduce", iters=3, compute_time=0.05, cpus=2)
    text = cli_tables.rank_start(dest)
    assert "| 8 | 2 | 11.0 [10.0-12.0] | 19.0 [18.0-20.0] | 0.58 | 14.0 [13.0-15.0] | 25.0 [24.0-26.0] | 0.56 |" in text
    assert "`testbed run allreduce --compute-time 0.05 --max-iters 3 --no-exporter`" in text
    memory = cli_tables.rank_start_memory(dest)
    # a field a run did not report is left out of its median, not counted as 0
    assert "| 8 | 305 [300-310] | 351 [350-352] | 0.87 | 1275 [1250-1300] | 2100 | 0.61 |" in memory


def test_a_before_after_table_takes_one_run_of_both_trees(tmp_path):
    rows = _cli_rows("--version", [0.1], [0.3])
    for name in ("a", "b"):
        archive.record(tmp_path / "two" / name, "cli_start", rows, trees=[THIS, OLD])
    with pytest.raises(Exception, match="2 cli_start results, not one"):
        cli_tables.cli_start(tmp_path / "two")
    archive.record(tmp_path / "alone" / "a", "cli_start", rows, trees=[THIS])
    with pytest.raises(Exception, match="needs this tree and another"):
        cli_tables.cli_start(tmp_path / "alone")


def test_a_record_names_each_trees_commit():
    with pytest.raises(SystemExit, match="one per --tree"):
        cli_start.trees_of(["/tmp/base"], [], recording=True)
    with pytest.raises(SystemExit, match="one per --tree"):
        cli_start.trees_of(["/tmp/base"], ["a", "b"], recording=False)
    trees = cli_start.trees_of(["/tmp/base"], ["7b2c8b8"], recording=True)
    assert [t["tree"] for t in trees] == [0, 1] and trees[1]["commit"] == "7b2c8b8"
    assert isinstance(trees[0]["uncommitted"], list) and trees[0]["commit"]
    assert cli_start.trees_of([], [], recording=True)[1:] == []  # no other tree: nothing to name
