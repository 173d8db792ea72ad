"""Achieved / configured TCP goodput across a shaped link, 10 Mbit/s .. 10 Gbit/s.

A two-worker dumbbell whose switch-to-switch link is set to each rate in turn (with
`link set`, on one running testbed); iperf3, one TCP stream, 4 s (``--seconds``) after a 1 s
warm-up, and at a low rate long enough to carry 120 Mbit (12 s at 10 Mbit/s): a 4-second
stream at 10 Mbit/s is mostly its slow start into the leaf's 1000-packet queue, so it
measured TCP's ramp more than the shaper (0.937-0.955 in 4 s, 0.954-0.956 in 12 s, the
same day).
The ceiling is 0.956: TCP/IP/Ethernet headers at MTU 1500 (tc counts layer 2).
Needs root and iperf3.

With ``--cross-host`` the same rates are measured a second time with the second switch on
another host: a real sshd in its own namespace on an underlay bridge (the multi-host
tests' lab, tests/kernel/sshhosts.py), so the link is a VXLAN tunnel shaped at both ends,
at MTU 1450 (TCP ceiling 0.955). Needs openssh-server too.

With ``--containers`` they are measured with container workers (the docker backend, the
image of ``testbed image build``) instead of namespaces; ``--no-local`` leaves the namespace
path out (to add a path to an earlier run's record).

    sudo python -m benchmarks.link_fidelity [--rates 10mbit,100mbit,...] [--seconds 4] [--repeats N]
                                            [--cross-host] [--containers] [--no-local] [--record DIR]

``--repeats N`` measures every rate N times, taking turns (rate by rate, then again), so
the table gives median [min-max] over the N; ``--record DIR`` writes every measurement to
DIR/result.json, which ``python -m benchmarks.archive DIR --name NAME`` archives for
docs/results/network.md's table (``benchmarks.network_tables``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.archive import record
from testbed import Testbed, load_topology_dict
from testbed.model.units import Rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import dumbbell, iperf3  # noqa: E402

RATES = "10mbit,35mbit,100mbit,500mbit,1gbit,2500mbit,5gbit,10gbit"
TARGET = 0.95


MIN_BITS = 120e6
"""A stream lasts at least long enough to carry this at its rate."""


def stream_seconds(seconds: float, rate_bps: float) -> float:
    return max(seconds, MIN_BITS / rate_bps)


def goodput(tb: Testbed, seconds: float) -> float:
    r = iperf3(tb, seconds, "-O", "1")
    if "sum_received" not in r["end"]:
        raise RuntimeError(f"iperf3: {r.get('error') or r['end']}")
    return r["end"]["sum_received"]["bits_per_second"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default=RATES)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--repeats", type=int, default=1, help="measure every rate this many times, taking turns")
    ap.add_argument("--cross-host", action="store_true", help="also measure a link between two hosts (VXLAN)")
    ap.add_argument("--containers", action="store_true", help="also measure with container workers (docker)")
    ap.add_argument("--no-local", action="store_true", help="leave the namespace workers' path out")
    ap.add_argument("--record", type=Path, metavar="DIR", help="write every measurement to DIR/result.json")
    args = ap.parse_args()
    if args.repeats < 1:
        sys.exit("--repeats: at least 1")
    if args.no_local and not (args.containers or args.cross_host):
        sys.exit("--no-local: give --containers or --cross-host too, or nothing is measured")
    if os.geteuid() != 0:
        sys.exit("needs root")
    os.environ.setdefault("TESTBED_STATE_DIR", tempfile.mkdtemp(prefix="testbed-bench-"))
    rates = [Rate.parse(r) for r in args.rates.split(",")]
    # access links faster than the fastest bottleneck tested, so only the bottleneck shapes
    topo = dumbbell(name="fidelity", rate=str(rates[0]))
    topo["defaults"] = {"link": {"rate": "40gbit"}}
    rows = {} if args.no_local else {"local (veth)": measure(topo, rates, args.seconds, args.repeats)}
    if args.containers:
        boxed = dict(topo, name="fidelityc", defaults={**topo["defaults"], "backend": "docker"})
        rows["local (containers)"] = measure(boxed, rates, args.seconds, args.repeats)
    if args.cross_host:
        from tests.kernel import sshhosts

        lab = sshhosts.build(Path(tempfile.mkdtemp(prefix="testbed-lab-")), 1)
        try:
            topo = dict(topo, name="fidelityx", hosts=lab.host_specs())
            topo["nodes"] = dict(topo["nodes"], s1={"kind": "switch", "host": "h1"})
            rows["cross-host (VXLAN)"] = measure(topo, rates, args.seconds, args.repeats)
        finally:
            sshhosts.destroy(lab)
    print(f"\n{'rate':>9} " + " ".join(f"{k + ' ratio, median':>24}" for k in rows) + f"  (target >= {TARGET})")
    for rate in rates:
        print(f"{str(rate):>9} " + " ".join(
            f"{statistics.median(m['goodput_bps'] / m['rate_bps'] for m in v['rows'] if m['rate_bps'] == rate.bps):24.3f}"
            for v in rows.values()))
    if args.record:
        out = [dict(m, path=k) for k, v in rows.items() for m in v["rows"]]
        capacity = {k: v["capacity_bps"] for k, v in rows.items()}
        print(f"recorded: {record(args.record, 'link_fidelity', out, seconds=args.seconds, min_bits=MIN_BITS, capacity_bps=capacity)}")


def measure(topo: dict, rates: list, seconds: float, repeats: int = 1) -> dict:
    """Every rate ``repeats`` times on one testbed; {"capacity_bps", "rows": [{rate_bps,
    goodput_bps, repeat}]}."""
    print(f"{'rate':>9} {'goodput Mbit/s':>15} {'ratio':>6}  {topo['name']} (target >= {TARGET}, TCP ceiling 0.956)")
    rows = []
    with Testbed.up(load_topology_dict(topo)) as tb:
        try:
            tb.set_links(tb.find_links(bottleneck=True), rate=Rate.parse("400gbit"))
            capacity = goodput(tb, seconds)
            print(f"path capacity of this machine (shaping at 400gbit, i.e. CPU-bound): {capacity / 1e6:.0f} Mbit/s")
            for k in range(repeats):
                for rate in rates:
                    tb.set_links(tb.find_links(bottleneck=True), rate=rate)
                    g = goodput(tb, stream_seconds(seconds, rate.bps))
                    rows.append({"rate_bps": rate.bps, "goodput_bps": g, "repeat": k})
                    print(f"{str(rate):>9} {g / 1e6:15.1f} {g / rate.bps:6.3f}"
                          f"{'' if g / rate.bps >= TARGET else '  below target'}", flush=True)
        finally:
            tb.close()
    return {"capacity_bps": capacity, "rows": rows}


if __name__ == "__main__":
    main()
