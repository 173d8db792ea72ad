"""Shaping fidelity: TCP goodput across a shaped path, and live rate changes."""

import shutil
import threading
import time

import pytest

from testbed import Testbed, load_topology_dict
from testbed.model.units import Rate
from tests.helpers import TcSampler, dumbbell, iperf3

pytestmark = pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 not installed (apt-get install iperf3)")


@pytest.mark.parametrize("rate", ["100mbit", "500mbit", "1gbit"])
def test_tcp_goodput_matches_configured_rate(clean_kernel, rate):
    with Testbed.up(load_topology_dict(dumbbell(name="fid", rate=rate))) as tb:
        ratios = []
        # CPU noise on a 2-core machine can only lower goodput (0.825 of 1 Gbit seen once in
        # CI, 0.95 otherwise), so up to three tries; none may exceed the rate
        while len(ratios) < 3 and (not ratios or max(ratios) < 0.90):
            res = iperf3(tb, 3, "-O", "1")
            ratios.append(res["end"]["sum_received"]["bits_per_second"] / Rate.parse(rate).bps)
        print(f"{rate}: goodput/rate {', '.join(f'{r:.3f}' for r in ratios)}")
        assert 0.90 <= max(ratios) <= 1.0


def test_link_set_takes_effect_within_a_second_on_a_running_flow(clean_kernel):
    """Sample the bottleneck's tc byte counter while a flow runs; change 500 -> 100 Mbit/s."""
    with Testbed.up(load_topology_dict(dumbbell(name="chg", rate="500mbit"))) as tb:
        result = {}
        flow = threading.Thread(target=lambda: result.update(iperf3(tb, 15)))
        flow.start()
        with TcSampler(tb.egress[(2, "forward")]) as wire:
            deadline = time.monotonic() + 30
            while wire.recent_rate(1.5) < 0.9 * 500e6:  # the flow is up to the rate
                assert flow.is_alive() and time.monotonic() < deadline, "the flow never came up to the rate"
                time.sleep(0.1)
            t_change = time.monotonic()
            tb.set_links(tb.find_links("s0-s1"), rate=Rate.parse("100mbit"))
            flow.join()
        before = wire.rate_between(t_change - 1.5, t_change)
        after = wire.rate_between(t_change + 1.0, t_change + 2.5)
        print(f"wire rate before {before / 1e6:.1f} Mbit/s, from 1 s after the change {after / 1e6:.1f} Mbit/s")
        assert 0.90 * 500e6 <= before <= 1.02 * 500e6
        assert 0.90 * 100e6 <= after <= 1.02 * 100e6
        assert result["end"]["sum_received"]["bytes"] > 0, "the flow survived the change"
