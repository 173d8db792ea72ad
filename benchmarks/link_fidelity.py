"""Achieved / configured TCP goodput across a shaped link, 10 Mbit/s .. 10 Gbit/s.

A two-worker dumbbell whose switch-to-switch link is set to each rate in turn (with
`link set`, on one running testbed); iperf3, one TCP stream, 4 s after a 1 s warm-up.
The ceiling is 0.956: TCP/IP/Ethernet headers at MTU 1500 (tc counts layer 2).
Needs root and iperf3.

    sudo python -m benchmarks.link_fidelity [--rates 10mbit,100mbit,...] [--seconds 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from testbed import Testbed, load_topology_dict
from testbed.units import Rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import dumbbell, iperf3  # noqa: E402

RATES = "10mbit,35mbit,100mbit,500mbit,1gbit,2500mbit,5gbit,10gbit"
TARGET = 0.95


def goodput(tb: Testbed, seconds: float) -> float:
    return iperf3(tb, seconds, "-O", "1")["end"]["sum_received"]["bits_per_second"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default=RATES)
    ap.add_argument("--seconds", type=float, default=4)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    os.environ.setdefault("TESTBED_STATE_DIR", tempfile.mkdtemp(prefix="testbed-bench-"))
    rates = [Rate.parse(r) for r in args.rates.split(",")]
    # access links faster than the fastest bottleneck tested, so only the bottleneck shapes
    topo = dumbbell(name="fidelity", rate=str(rates[0]))
    topo["defaults"] = {"link": {"rate": "40gbit"}}
    print(f"{'rate':>9} {'goodput Mbit/s':>15} {'ratio':>6}  (target >= {TARGET}, TCP ceiling 0.956)")
    worst = 1.0
    with Testbed.up(load_topology_dict(topo)) as tb:
        tb.set_links(tb.find_links(bottleneck=True), rate=Rate.parse("400gbit"))
        capacity = goodput(tb, args.seconds)
        print(f"path capacity of this machine (shaping at 400gbit, i.e. CPU-bound): {capacity / 1e6:.0f} Mbit/s")
        for rate in rates:
            tb.set_links(tb.find_links(bottleneck=True), rate=rate)
            g = goodput(tb, args.seconds)
            ratio = g / rate.bps
            worst = min(worst, ratio)
            print(f"{str(rate):>9} {g / 1e6:15.1f} {ratio:6.3f}{'' if ratio >= TARGET else '  below target'}", flush=True)
    print(f"worst ratio {worst:.3f}")


if __name__ == "__main__":
    main()
