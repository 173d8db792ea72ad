"""`testbed link replay`'s argument checks, which live in the library (testbed.engine.replay):
the forms of LINK TRACE, --stop, --duration, and the values the CLI offers as choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.common.errors import TestbedError
from testbed.engine import replay
from testbed.model.topology import load_topology_dict
from testbed.model.trace import MAX_SPAN_S, TraceError, TRACE_FORMATS, load_trace
from tests.helpers import dumbbell


def test_the_three_forms_of_the_target():
    assert replay.parse_target(["s0-s1", "t.csv"]) == replay.Target("s0-s1", Path("t.csv"))
    assert replay.parse_target(["t.csv"], bottleneck=True) == replay.Target(None, Path("t.csv"))
    assert replay.parse_target(["s0-s1"], from_topology=True) == replay.Target("s0-s1", None)


@pytest.mark.parametrize("args, kw, says", [
    (["t.csv"], {}, "give LINK TRACE, or --bottleneck TRACE"),
    ([], {}, "give LINK TRACE"),
    (["l", "t.csv", "x"], {}, "give LINK TRACE"),
    (["l", "t.csv"], {"bottleneck": True}, "with --bottleneck give only the TRACE file"),
    (["l", "t.csv"], {"from_topology": True}, "with --from-topology give only the LINK"),
    (["l"], {"from_topology": True, "bottleneck": True}, "with --from-topology give only the LINK"),
])
def test_a_wrong_form_says_which_to_write(args, kw, says):
    with pytest.raises(TestbedError, match=says):
        replay.parse_target(args, **kw)


def test_stop_takes_nothing_that_starts_a_replay():
    replay.check_stop([])
    for args, kw in ((["l"], {}), ([], {"background": True}), ([], {"bottleneck": True})):
        with pytest.raises(TestbedError, match="--stop takes no LINK"):
            replay.check_stop(args, **kw)


@pytest.mark.parametrize("duration", [0, -1, float("nan"), float("inf"), MAX_SPAN_S + 1])
def test_a_duration_outside_its_range_is_refused(duration):
    with pytest.raises(TestbedError, match="--duration must be a number of seconds"):
        replay.check_options(duration_s=duration)


def test_options_in_range_pass_and_a_bad_pid_is_refused():
    replay.check_options(duration_s=MAX_SPAN_S, while_pid=1)
    replay.check_options()
    with pytest.raises(TestbedError, match="--while-pid 0: not a process id"):
        replay.check_options(while_pid=0)


def test_a_link_without_schedule_says_to_give_a_trace():
    d = dumbbell("rpa")
    d["links"][2]["schedule"] = [{"at": "0s", "rate": "10mbit"}, {"at": "1s", "rate": "20mbit"}]
    topo = load_topology_dict(d)
    assert [s.rate.bps for s in replay.schedule_of(topo.links[2]).steps] == [10_000_000, 20_000_000]
    with pytest.raises(TestbedError, match="link .* has no schedule: in the topology"):
        replay.schedule_of(topo.links[0])


def test_the_trace_formats_offered_are_those_load_trace_reads(tmp_path):
    """The CLI's --format / --trace-format choices: each one loads, nothing else does."""
    p = tmp_path / "t.csv"
    p.write_text("0,100mbit\n1,50mbit\n")
    m = tmp_path / "t.mahi"
    m.write_text("1\n2\n3\n")
    for fmt in TRACE_FORMATS:
        load_trace(m if fmt == "mahimahi" else p, fmt)
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(p, "json")


def test_the_directions_offered_are_those_a_link_change_takes():
    from testbed.model.topology import DIRECTIONS

    assert set(replay.DIRECTION_CHOICES) == {*DIRECTIONS, "both"}


def test_the_replay_log_is_a_regular_file_and_a_fifo_cannot_hang_it(tmp_path):
    """`link replay --log FIFO` without a reader hung forever; a FIFO, a device and a link
    are refused at once, a new or existing regular file is appended to."""
    import os

    from testbed.common.errors import TestbedError
    from testbed.engine.replay import open_log

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(tmp_path / "target.jsonl")
    for bad in (fifo, Path("/dev/null"), tmp_path / "link"):
        with pytest.raises(TestbedError, match="--log"):
            open_log(bad)
    log = tmp_path / "steps.jsonl"
    log.write_text("old\n")
    with open_log(log) as f:
        f.write("new\n")
    assert log.read_text() == "old\nnew\n"


def test_cross_traffic_periods_are_finite_and_at_most_a_day():
    from testbed.common.errors import TestbedError
    from testbed.model.flows import parse_spec

    for spec in ("w0->w1,rate=1mbit,on=" + "1" * 400 + "s,off=1s", "w0->w1,on=2s,off=25h", "w0->w1,on=2min,off=0s"):
        with pytest.raises(TestbedError, match="is not a time in"):
            parse_spec(spec)
    assert parse_spec("w0->w1,on=2s,off=500ms").off_s == 0.5
