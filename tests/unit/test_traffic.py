"""Cross-traffic specs and iperf3 server logs."""

from __future__ import annotations

import pytest

from testbed.common.errors import TestbedError
from testbed.plan.actions import TRAFFIC_MARKER as MARKER
from testbed.model.flows import check_flows, parse_spec
from testbed.runs.traffic import parse_server_log

LOG = """1795381758 -----------------------------------------------------------
1795381758 Server listening on 5301 (test #1)
1795381758 Accepted connection from 10.0.0.1, port 47754
1795381758 [  6] local 10.0.0.2 port 5301 connected to 10.0.0.1 port 47760
1795381758 [  9] local 10.0.0.2 port 5301 connected to 10.0.0.1 port 47766
1795381759 [ ID] Interval           Transfer     Bitrate
1795381759 [  6]   0.00-1.00   sec  1.19 MBytes  10.0 Mbits/sec
1795381759 [  9]   0.00-1.00   sec  1.19 MBytes  10.0 Mbits/sec
1795381759 [SUM]   0.00-1.00   sec  2.38 MBytes  20.0 Mbits/sec
1795381760 [  6]   1.00-2.00   sec   610 KBytes  5.00 Mbits/sec
1795381760 [  9]   1.00-2.00   sec   610 KBytes  5.00 Mbits/sec
1795381760 [SUM]   1.00-2.00   sec  1.19 MBytes  10.0 Mbits/sec
1795381762 [SUM]   0.00-2.00   sec  3.57 MBytes  15.0 Mbits/sec                  receiver
1795381763 Server listening on 5301 (test #2)
1795381764 [  5]   0.00-1.00   sec   122 KBytes  1.00 Mbits/sec
"""


def test_server_log_gives_one_record_per_interval_summed_over_streams():
    recs = parse_server_log(LOG)
    assert [(r["time"], r["bits_per_second"]) for r in recs] == [
        (1795381759.0, 20e6), (1795381760.0, 10e6), (1795381764.0, 1e6)]  # the final summary is left out
    assert recs[0]["bytes"] == pytest.approx(2.38 * 2 ** 20)
    # streams without a SUM line are added up
    no_sum = "\n".join(l for l in LOG.splitlines() if "SUM" not in l)
    assert [r["bits_per_second"] for r in parse_server_log(no_sum)] == [20e6, 10e6, 1e6]


def test_specs_parse_and_bad_ones_are_named():
    f = parse_spec("w0->w7,flows=2")
    assert (f.src, f.dst, f.flows, f.rate, f.onoff) == ("w0", "w7", 2, None, False)
    f = parse_spec("w1 -> w6, rate=20mbit, on=2s, off=500ms")
    assert (str(f.rate), f.on_s, f.off_s) == ("20mbit", 2.0, 0.5) and f.label() == "w1->w6 20mbit on 2s off 0.5s"
    for spec, words in [("w0", "start with SRC->DST"), ("w0->w1,flows=0", "flows"), ("w0->w1,flows=x", "flows"),
                        ("w0->w1,speed=1", "'speed=1' is not one of"), ("w0->w1,rate=10mbps", "rate"),
                        ("w0->w1,on=1s", "needs both on and off"), ("w0->w1,on=0s,off=1s", r"not a time in \(0 s"),
                        ("w0->w0", "both 'w0'"), ("w0->w1,flows=2,flows=3", "flows= is given twice")]:
        with pytest.raises(TestbedError, match=words):
            parse_spec(spec)
    with pytest.raises(TestbedError, match="'w9' is not a worker"):
        check_flows([parse_spec("w0->w9")], ["w0", "w1"])


def test_only_markers_testbed_writes_are_accepted():
    assert MARKER.fullmatch("--logfile=/runs/x/traffic-0-server.log")
    for bad in ("--logfile=/etc/passwd", "--logfile=relative/traffic-0-server.log", "--sd-file=/x/traffic-0-server.log",
                "--logfile=/x/traffic-0-server.log --other"):
        assert not MARKER.fullmatch(bad), bad


def test_on_and_off_written_bare_in_yaml_are_the_periods(tmp_path):
    """PyYAML reads bare `on:`/`off:` keys as booleans; the documented form must still work."""
    from testbed import load_topology

    f = tmp_path / "t.yaml"
    f.write_text("name: onoff\nnodes: {s0: {kind: switch}, w0: {kind: worker}, w1: {kind: worker}}\n"
                 "links: [{endpoints: [w0, s0]}, {endpoints: [w1, s0]}]\n"
                 "traffic:\n  - {from: w0, to: w1, rate: 50mbit, on: 2s, off: 3s}\n")
    flow = load_topology(f).traffic[0]
    assert (flow.on_s, flow.off_s) == (2.0, 3.0)
