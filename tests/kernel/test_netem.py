"""Delay, jitter and loss (netem) measured end to end.

This host's kernel has no sch_netem, so these skip here; CI runs them inside a VM whose
kernel has it (tests/kernel/test_vm.py::test_netem_tests_pass_inside_a_vm).
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import pytest

from testbed import Testbed, load_topology, load_topology_dict
from tests.helpers import dumbbell, iperf3
from tests.kernel.conftest import cli_json

pytestmark = [pytest.mark.kernel]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _netem():
    from testbed.net.probe import probe

    ok, detail = probe()["netem"]
    if not ok:
        pytest.skip(f"netem unavailable on this kernel ({detail}); CI runs these inside a VM "
                    "(tests/kernel/test_vm.py::test_netem_tests_pass_inside_a_vm)")


def _rtts(tb, src: str, dst: str, count: int, interval: float = 0.05) -> list[float]:
    r = tb.exec(src, ["ping", "-n", "-c", str(count), "-i", str(interval), "-W", "2", tb.address(dst)],
                capture_output=True, text=True, timeout=count * interval + 60)
    return [float(m) for m in re.findall(r"time=([\d.]+) ms", r.stdout)]


def test_wan_rtt_is_the_configured_delay(clean_kernel):
    """wan_two_site: 25 ms each way (+-2 ms jitter): the RTT across the WAN is 50 ms
    within 5 %, once the path's own RTT (the same path with the delay set to 0) is taken
    off. Medians: jitter is symmetric, and a guest under TCG adds rare stalls."""
    with Testbed.up(load_topology(ROOT / "topologies" / "wan_two_site.yaml")) as tb:
        wan = _rtts(tb, "a0", "b0", 41)[1:]  # the first waits for ARP
        assert len(wan) >= 38
        cli_json("link", "set", "wan", "--delay", "0ms", "--jitter", "0ms", "--testbed", "wan")
        base = statistics.median(_rtts(tb, "a0", "b0", 21)[1:])
        delay = statistics.median(wan) - base
        print(f"wan: RTT {statistics.median(wan):.2f} ms, path's own {base:.2f} ms, delay {delay:.2f} ms of 50")
        assert abs(delay - 50.0) <= 0.05 * 50.0, (delay, base, wan)


def test_jitter_spreads_rtt_as_configured(clean_kernel):
    """netem's jitter without a distribution table is uniform in +-J each way, so the RTT
    is 2 x delay plus a triangular spread on +-2J: its interquartile range is
    4 (1 - 1/sqrt 2) J = 1.17 J, and no sample is below 2 (delay - J). Quartiles, not the
    standard deviation: a guest under TCG adds rare multi-ms stalls."""
    j = 4.0
    with Testbed.up(load_topology_dict(dumbbell("jit", rate="1gbit", delay="20ms", jitter=f"{j:g}ms"))) as tb:
        rtts = _rtts(tb, "w0", "w1", 201, 0.02)[1:]  # the first waits for ARP
    assert len(rtts) >= 195
    q1, med, q3 = statistics.quantiles(rtts, n=4)
    expected = 4 * (1 - 1 / math.sqrt(2)) * j
    print(f"jitter {j} ms: RTT median {med:.2f} ms, IQR {q3 - q1:.2f} ms (expected {expected:.2f})")
    assert 0.75 * expected <= q3 - q1 <= 1.3 * expected, (q3 - q1, expected, rtts)
    assert 39.0 <= med <= 43.0, med  # 2 x 20 ms; a guest under TCG adds up to ~1 ms per netem hop
    # netem never sends a packet before delay - J: no RTT below 2 (delay - J). (Above the
    # spread, a guest under TCG adds stalls of up to ~20 ms to a few % of the samples.)
    assert min(rtts) >= 2 * (20.0 - j) - 0.5, min(rtts)
    over = [r for r in rtts if r > med + 2 * j + 1.0]
    assert len(over) <= 0.1 * len(rtts), over


def test_loss_is_within_its_binomial_interval(clean_kernel):
    """1 % loss each way: a ping round trip is lost with p = 1 - 0.99^2; the count lost of
    n must fall inside the 99.9 % normal interval of Binomial(n, p)."""
    n = 3000
    with Testbed.up(load_topology_dict(dumbbell("loss", rate="1gbit", loss="1%"))) as tb:
        r = tb.exec("w0", ["ping", "-n", "-q", "-c", str(n), "-i", "0.002", "-W", "1", tb.address("w1")],
                    capture_output=True, text=True, timeout=180)
    m = re.search(r"(\d+) packets transmitted, (\d+) received", r.stdout)
    assert m, r.stdout + r.stderr
    sent, got = int(m.group(1)), int(m.group(2))
    assert sent == n
    p = 1 - 0.99 ** 2
    mu, sigma = n * p, math.sqrt(n * p * (1 - p))
    lost = sent - got
    print(f"loss 1 % each way: {lost} of {n} round trips lost (expected {mu:.1f} +- {3.29 * sigma:.1f})")
    assert mu - 3.29 * sigma <= lost <= mu + 3.29 * sigma, (lost, mu, sigma)


def test_link_set_delay_changes_a_running_link(clean_kernel):
    with Testbed.up(load_topology_dict(dumbbell("dset", rate="1gbit", delay="10ms"))) as tb:
        before = statistics.median(_rtts(tb, "w0", "w1", 15))
        st = cli_json("link", "set", "s0-s1", "--delay", "30ms", "--testbed", "dset")
        assert st
        after = statistics.median(_rtts(tb, "w0", "w1", 15))
    print(f"link set --delay: RTT {before:.2f} ms at 10 ms, {after:.2f} ms at 30 ms")
    # never short of the delay; the path's own time on top (CI runs these in a TCG guest, where
    # 20 ms read 22.1 once: the guest's own path and clock)
    assert 20.0 - 1.0 <= before <= 20.0 + 3.0, before
    assert 60.0 - 1.0 <= after <= 60.0 + 4.0, after


def test_rate_and_delay_together_reach_the_rate_on_a_long_rtt_path(clean_kernel):
    """50 Mbit/s with 25 ms each way (BDP 312 KB): TCP goodput within [0.8, 1.0] of the
    rate (the queue holds 2 BDP, so one flow fills the pipe after slow start; 0.8, not 0.85:
    inside CI's TCG guest one run read 0.84, the guest's CPU its limit)."""
    with Testbed.up(load_topology_dict(dumbbell("rdel", rate="50mbit", delay="25ms"))) as tb:
        res = iperf3(tb, 10, "-O", "3")
    bps = res["end"]["sum_received"]["bits_per_second"]
    print(f"50 Mbit/s + 25 ms each way: goodput {bps / 1e6:.1f} Mbit/s")
    assert 0.8 * 50e6 <= bps <= 1.0 * 50e6, bps / 1e6
