"""Trace and schedule parsing: CSV, Mahimahi and inline schedules become the same steps."""

import pytest

from testbed.model.trace import MAX_STEPS, TraceError, load_trace, parse_csv, parse_mahimahi, parse_schedule
from testbed.model.units import MIN_RATE_BPS


def rates(trace):
    return [(s.at_s, s.rate.bps) for s in trace.steps]


def test_csv_steps_with_header_comments_and_optional_columns():
    t = parse_csv(["time_s,rate,delay,loss", "# a comment", "", "0,200mbit", "10, 50mbit ,20ms",
                   "20.5,200mbit,0,0.1%  # back up"])
    assert rates(t) == [(0, 200_000_000), (10, 50_000_000), (20.5, 200_000_000)]
    assert t.steps[1].delay.us == 20_000 and t.steps[1].loss is None
    assert t.steps[2].loss.percent == 0.1 and not t.loop and t.needs_netem
    assert t.at(5).rate.bps == 200_000_000 and t.at(10).rate.bps == 50_000_000 and t.at(99).rate.bps == 200_000_000
    assert [round(x, 1) for x, _ in t.events(25)] == [0, 10, 20.5]


def test_a_looping_trace_ends_where_it_starts_and_repeats():
    t = parse_csv(["0,1gbit", "30,100mbit", "60,1gbit"], loop=True)
    assert t.period_s == 60 and rates(t) == [(0, 10**9), (30, 10**8)]
    assert t.at(75).rate.bps == 10**9 and t.at(95).rate.bps == 10**8
    assert [(x, s.rate.bps) for x, s in t.events(120)] == [(0, 10**9), (30, 10**8), (60, 10**9), (90, 10**8),
                                                           (120, 10**9)]
    with pytest.raises(TraceError, match="last step .at 60 s. must have the first step's values"):
        parse_csv(["0,1gbit", "30,100mbit", "60,200mbit"], loop=True)


@pytest.mark.parametrize("lines,words", [
    (["0,100mbps"], "<csv>:1: '100mbps' is ambiguous"),
    (["0,100"], "<csv>:1: '100' has no unit"),
    (["0,1gbit", "0,2gbit"], "<csv>:2: time 0 s does not come after"),
    (["5,1gbit", "3,2gbit"], "<csv>:2: time 3 s does not come after"),
    (["x,1gbit"], "time 'x' is not a number"),
    (["nan,1gbit"], "finite number of seconds"),
    (["-1,1gbit"], "finite number of seconds"),
    (["0,1gbit,1ms,1%,extra"], "5 columns"),
    (["0"], "1 columns"),
    (["# only a comment"], "the trace has no steps"),
    (["0,1gbit,5ms,50"], "'50' is not a loss"),
    (["9999999999,1gbit"], "more than 7 days"),
])
def test_csv_errors_name_the_line_and_value(lines, words):
    with pytest.raises(TraceError) as e:
        parse_csv(lines)
    assert words in str(e.value)


def test_mahimahi_opportunities_become_rates_per_window():
    # 1 s windows over a 3 s trace: 1000, 0 and 500 deliveries of 1500 bytes
    lines = [str(i) for i in range(1000)] + [str(2000 + 2 * i) for i in range(500)] + ["3000"]
    t = parse_mahimahi(lines, 1.0)
    assert t.period_s == 3.0 and t.loop
    # the last line (3000 ms) is the wrap point: it counts in the first window
    assert rates(t) == [(0, 1001 * 1500 * 8), (1.0, MIN_RATE_BPS), (2.0, 500 * 1500 * 8)]
    # a trace that is not a whole number of windows: the last window is shorter
    t = parse_mahimahi(["1"] * 12 + ["1500"], 1.0)
    assert rates(t) == [(0, 13 * 12000), (1.0, MIN_RATE_BPS)]
    # 12 Mbit/s as Mahimahi writes it (one opportunity per ms) reads back as 12 Mbit/s
    t = parse_mahimahi([str(i) for i in range(1, 10001)], 0.5)
    assert {s.rate.bps for s in t.steps} == {12_000_000} and len(t.steps) == 20


@pytest.mark.parametrize("lines,window,words", [
    (["1", "0"], 1.0, "goes back in time"),
    (["1", "x2"], 1.0, "is not a millisecond timestamp"),
    (["0", "0"], 1.0, "needs timestamps after 0 ms"),
    (["1"], 0.0, "between 1 ms and 1 h"),
    (["1"], float("nan"), "between 1 ms and 1 h"),
    ([str(10**9)], 0.001, "more than 7 days"),
    ([str(10**8)], 0.001, f"more than {MAX_STEPS}"),
])
def test_mahimahi_errors(lines, window, words):
    with pytest.raises(TraceError, match=words):
        parse_mahimahi(lines, window)


def test_inline_schedule_uses_the_topology_units():
    t = parse_schedule([{"at": 0, "rate": "1gbit"}, {"at": "30s", "rate": "100mbit", "delay": "5ms"},
                        {"at": "1min", "rate": "1gbit"}], loop=True, path="links[8].schedule")
    assert t.period_s == 60 and rates(t) == [(0, 10**9), (30, 10**8)] and t.steps[1].delay.us == 5000
    for items, words in [
        ({"at": 0}, "must be a list"),
        ([{"at": "5", "rate": "1gbit"}], "links[8].schedule[0].at: '5' is not a time"),
        ([{"at": 0, "rate": "1gbit", "colour": 1}], "unknown key 'colour'"),
        ([{"rate": "1gbit"}], "needs 'at' and 'rate'"),
        ([{"at": "2s", "rate": "1gbit"}, {"at": "1s", "rate": "1gbit"}], "links[8].schedule[1]: time 1 s"),
        ([{"at": 0, "rate": "10tbit"}], "outside the supported range"),
    ]:
        with pytest.raises(TraceError) as e:
            parse_schedule(items, path="links[8].schedule")
        assert words in str(e.value), (items, str(e.value))
    with pytest.raises(TraceError, match="must be true or false"):
        parse_schedule([{"at": 0, "rate": "1gbit"}], loop="yes")


def test_files_are_bounded_and_formats_detected(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("0,100mbit\n1,50mbit\n")
    assert rates(load_trace(csv)) == [(0, 10**8), (1, 5 * 10**7)]
    mm = tmp_path / "t.mahi"
    mm.write_text("".join(f"{i}\n" for i in range(1, 1001)))
    assert load_trace(mm).loop and load_trace(mm).steps[0].rate.bps == 12_000_000
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(tmp_path / "missing.csv")
    (tmp_path / "bin").write_bytes(b"\xff\xfe0,1gbit")
    with pytest.raises(TraceError, match="not UTF-8"):
        load_trace(tmp_path / "bin")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(csv, fmt="pcap")
    big = tmp_path / "big.csv"
    big.write_text("".join(f"{i},1gbit\n" for i in range(MAX_STEPS + 2)))
    with pytest.raises(TraceError, match=f"more than {MAX_STEPS}"):
        load_trace(big)


def test_replay_refuses_a_trace_the_links_cannot_take_before_changing_anything():
    from testbed.common.errors import TestbedError
    from testbed.engine.replay import ReplayResult, check
    from testbed.model.topology import load_topology_dict
    from tests.helpers import dumbbell

    links = load_topology_dict(dumbbell("x", rate="1gbit", delay="10ms")).links
    ok = parse_csv(["0,100mbit", "1,200mbit,20ms"])
    check(links, ok)
    # 400 Gbit/s with 1 s of delay needs a queue beyond the loader's limit: the step is named
    bad = parse_csv(["0,100mbit", "2,400gbit,1s"], "t.csv")
    with pytest.raises(TestbedError, match=r"t.csv step at 2 s: link .* needs a queue of"):
        check(links, bad)
    late = ReplayResult(steps=[{"late_s": x} for x in (0.004, 0.001, 0.002, 0.010)]).lateness()
    assert late == {"steps": 4, "median_s": 0.003, "p95_s": 0.010, "p99_s": 0.010, "max_s": 0.010}


def test_rate_timeline_matches_a_direct_integration():
    """`run --bw-trace` annotates each record with the rate in force while it ran."""
    import random

    from testbed.runs.experiment import RateTimeline

    rng = random.Random(3)
    steps = sorted((rng.uniform(0, 100), rng.choice([1e6, 1e7, 1e8])) for _ in range(200))
    tl = RateTimeline(steps, 5e8)

    def direct(t0, t1, n=20000):  # midpoint rule over the rate in force at each instant
        h = (t1 - t0) / n
        vals = []
        for i in range(n):
            t = t0 + (i + 0.5) * h
            vals.append(next((r for s, r in reversed(steps) if s <= t), 5e8))
        return sum(vals) / n

    for t0, t1 in [(-5, 3), (10, 10.5), (0, 100), (50, 120), (99, 101)]:
        assert tl.over(t0, t1) == pytest.approx(direct(t0, t1), rel=2e-3)
    assert tl.at(-1) == 5e8 and tl.at(steps[0][0]) == steps[0][1]
    assert tl.changes_within(steps[3][0] - 1e-6, steps[3][0] + 1e-6)
    assert not tl.changes_within(steps[3][0], steps[4][0])  # both ends excluded
