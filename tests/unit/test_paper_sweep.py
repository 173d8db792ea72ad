"""The bound arithmetic that benchmarks/paper_sweep.py and paper_scale.py print (benchmarks/bounds.py)."""

import math
from pathlib import Path

import pytest

from benchmarks import bounds
from benchmarks.paper_sweep import efficiency_section
from testbed.runs.reports.rundata import RunData


def test_a_scheme_at_its_perfect_overlap_bound_has_efficiency_1_and_hides_everything():
    c, rate, w = 0.1, 1e9 / 8, 4e6  # link time 0.032 s
    e = bounds.efficiency(0.1, c, w, rate)
    assert e.overlap_bound == pytest.approx(0.1) and e.serial_time == pytest.approx(0.132)
    assert e.overlap == pytest.approx(1.0) and e.hidden == pytest.approx(1.0)
    assert e.serial == pytest.approx(1.32)


def test_a_scheme_that_overlaps_nothing_sits_at_its_no_overlap_time():
    e = bounds.efficiency(0.132, 0.1, 4e6, 1e9 / 8)
    assert e.serial == pytest.approx(1.0) and e.hidden == pytest.approx(0.0)
    assert e.overlap == pytest.approx(0.1 / 0.132)


def test_link_bound_when_the_bytes_take_longer_than_the_compute():
    e = bounds.efficiency(0.5, 0.1, 50e6, 100e6 / 8)  # link time 4 s
    assert e.overlap_bound == pytest.approx(4.0) and e.overlap == pytest.approx(8.0)  # faster than physics: a bad W
    assert math.isnan(bounds.efficiency(0.0, 0.1, 1, 1).overlap)


def test_row_gives_the_spread_over_runs_and_no_bound_without_c():
    line = bounds.row([0.10, 0.11, 0.12], 0.1, 4e6, 1e9 / 8)
    assert " 3 " in line and "[" in line  # median [min-max] of both efficiencies
    assert "no C" in bounds.row([0.1], None, 4e6, 1e9 / 8)
    assert "[" not in bounds.row([0.1], 0.1, 4e6, 1e9 / 8)  # one run: one value, no range


def _run(bw: str, scheme: str, iter_s: float, wire: float) -> RunData:
    summary = {"scheme": scheme, "bw": bw, "mean_iter_s": iter_s, "iterations": 10,
               "bottleneck": {"links": {"s1-s0": {"bytes": wire * 10}, "s0-s1": {"bytes": wire * 5}}}}
    return RunData(Path("/nonexistent"), summary)


def test_every_scheme_gets_its_own_c_from_its_runs_at_10gbit(capsys):
    runs = [_run("10gbit", "allreduce", 0.10, 4e6), _run("10gbit", "fp16", 0.12, 2e6),
            _run("100mbit", "allreduce", 0.40, 4e6), _run("100mbit", "allreduce", 0.42, 4e6),
            _run("100mbit", "fp16", 0.30, 2e6), _run("100mbit", "hook", 0.3, 1e6)]
    efficiency_section("test", runs, ("100mbit",))
    out = capsys.readouterr().out
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith(" 100mbit")}
    assert set(rows) == {"allreduce", "fp16", "hook"}
    assert rows["allreduce"].split()[2:4] == ["2", "0.410"] and rows["allreduce"].split()[4] == "0.100"
    assert rows["fp16"].split()[4] == "0.120"  # its own C, not allreduce's
    assert "no C" in rows["hook"]


def test_strong_scaling_topologies_and_their_one_switch_references():
    from benchmarks.strong_scaling import parse_configs, plan, topology
    from testbed.model.topology import load_topology_dict

    assert plan(parse_configs("4x2,16x4")) == [(2, 1), (4, 1), (4, 2), (16, 4)]
    t = load_topology_dict(topology(16, 4, "500mbit"))
    bottlenecks = [l for l in t.links if l.bottleneck]
    assert len(bottlenecks) == 4 and all(l.forward.rate.bps == 500e6 for l in bottlenecks)
    assert sum(1 for l in t.links if "s4" in (l.a, l.b) and l.a.startswith("w")) == 4  # 4 ranks per switch
    ref = load_topology_dict(topology(4, 1, "500mbit"))  # the proof needs a crossed bottleneck
    assert [l.name for l in ref.links if l.bottleneck] == ["w0-s1"]
    with pytest.raises(SystemExit):
        parse_configs("6x4")


def test_the_prunex_section_can_run_a_batch_norm_model_on_fewer_workers(tmp_path):
    """`--prunex-model resnet18 --prunex-workers 4`: the model's flags, and three_switch cut to
    4 workers, two behind each edge switch (the uplinks still the only way across)."""
    import argparse

    import yaml

    from benchmarks.paper_sweep import _prunex_extra

    args = argparse.Namespace(prunex_model="resnet18", prunex_width="0.5", prunex_workers=4)
    extra = _prunex_extra(args, tmp_path)
    assert extra[:4] == ["--model", "resnet18", "--width", "0.5"] and extra[4] == "--topology"
    topo = yaml.safe_load(Path(extra[5]).read_text())
    workers = {k for k, v in topo["nodes"].items() if v.get("kind") != "switch"}
    edges = {tuple(link["endpoints"]) for link in topo["links"]}
    assert workers == {"w0", "w1", "w2", "w3"}
    assert {("w0", "s1"), ("w1", "s1"), ("w2", "s2"), ("w3", "s2")} <= edges
    assert _prunex_extra(argparse.Namespace(prunex_model=None, prunex_width=None, prunex_workers=8), tmp_path) == []


def test_ternary_against_exact_pairs_the_runs_by_seed(capsys):
    """benchmarks/ternary.py: per rate the two variants' T, and ternary / exact of the medians
    and of each seed's pair."""
    from benchmarks.ternary import report

    def run(ternary: bool, seed: int, iter_s: float) -> RunData:
        return RunData(Path("/nonexistent"), {
            "scheme": "pactrain", "prune_ratio": 0.5, "ternary": ternary, "seed": seed, "bw": "1gbit",
            "mean_iter_s": iter_s, "iterations": 10, "bottleneck": {"links": {"s1-s0": {"bytes": 1e7}}}})

    report([run(False, 0, 0.10), run(False, 1, 0.12), run(True, 0, 0.09), run(True, 1, 0.12)], ["1gbit"])
    out = capsys.readouterr().out
    assert "pactrain 0.5 exact" in out and "pactrain 0.5 ternary" in out
    assert "ternary / exact: 0.955 of the medians; per seed 0.900-1.000 over 2 pairs" in out, out


@pytest.mark.parametrize("k", [1.0, 16.0])
def test_uplink_bytes_per_timed_iteration_of_a_dilated_run(tmp_path, k):
    """Records' and link samples' times are the wall clock, a dilated run's iter_s is
    emulated (/ K): the timed window is the timed iterations' wall-clock span, so the bytes
    per iteration are the same at any K (at K = 16 they came out 2/3 too few before)."""
    import json

    from benchmarks.paper_scale import steady_wire

    wall = 2.0  # wall-clock seconds per iteration; 1 MB crosses the uplink per iteration
    t0 = 1000.0
    (tmp_path / "rank0.jsonl").write_text("".join(
        json.dumps({"rank": 0, "iter": i, "time": t0 + i * wall, "iter_s": wall / k}) + "\n" for i in range(1, 5)))
    (tmp_path / "links.jsonl").write_text("".join(
        json.dumps({"time": t0 + s * 0.5, "link": "s1-s0", "direction": "forward", "bytes": s * 0.5 / wall * 1e6})
        + "\n" for s in range(24)))
    summary = {"dilation": k, "iterations": 4, "bottleneck": {"links": {"s1-s0 forward": {"bytes": 4e6}}}}
    r = RunData(tmp_path, summary, [], [])
    got, timed_only = steady_wire(r)
    assert timed_only and got == pytest.approx(1e6)


def _paper_scale_run(where, variant: str, iter_s: float, mb_per_iter: float, bw: str = "100mbit") -> RunData:
    """A paper-scale run of ResNet18: 3 iterations of ``iter_s`` (the first untimed) and
    ``mb_per_iter`` MB per iteration on its uplink, sampled every 0.5 s."""
    import json

    where.mkdir(parents=True)
    t0 = 1000.0
    (where / "rank0.jsonl").write_text("".join(
        json.dumps({"rank": 0, "iter": i, "time": t0 + (i + 1) * iter_s, "iter_s": iter_s}) + "\n" for i in range(3)))
    (where / "links.jsonl").write_text("".join(
        json.dumps({"time": t0 + s * 0.5, "link": "s1-s0", "direction": "forward",
                    "bytes": s * 0.5 / iter_s * mb_per_iter * 1e6}) + "\n" for s in range(int(8 * iter_s))))
    summary = {"model": "resnet18", "variant": variant, "scheme": variant.split(":")[0], "bw": bw, "status": "ok",
               "iterations": 3, "compute_time_s": 0.02, "dense_bytes": 44.7e6, "max_rss_bytes_per_rank": 0.5e9,
               "bottleneck": {"links": {"s1-s0 forward": {"bytes": 3 * mb_per_iter * 1e6}}}}
    return RunData(where, summary, [], [])


def test_the_paper_scale_tables_from_records(tmp_path):
    """Speed-ups are the other scheme's iteration time over this one's; W comes from the
    timed window (3 s and more) and gives both efficiencies; a window under 3 s gives the
    whole run's W in brackets and no efficiency."""
    from benchmarks import paper_scale

    runs = [_paper_scale_run(tmp_path / "a", "allreduce", 6.0, 60.0),
            _paper_scale_run(tmp_path / "f", "fp16", 3.0, 30.0),
            _paper_scale_run(tmp_path / "t", "pactrain:0.5:ternary", 1.0, 7.5)]
    rows = [line for line in paper_scale.markdown(runs, "100mbit").splitlines() if line.startswith("| ")][2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert cells[0][:9] == ["ResNet18 (45 MB)", "allreduce", "1", "6.000", "1.00", "0.50", "-", "60.0", "0.80"]
    assert cells[0][9] == "0.80"  # W / R = 60 MB / 12.5 MB/s = 4.8 s of 6; C = 0.02
    assert cells[2][1] == "pactrain 0.5 ternary" and cells[2][4:6] == ["6.00", "3.00"]
    assert cells[2][7] == "(7.5)*" and cells[2][8:10] == ["-", "-"]  # a 2 s window: no bound
    speed = paper_scale.speedups_markdown(runs).splitlines()[2]
    assert speed.startswith("| ResNet18 | 100mbit | 6.00x | 3.00x | - | 1 |")
