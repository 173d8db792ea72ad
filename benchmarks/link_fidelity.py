"""Achieved / configured TCP goodput across a shaped link, 10 Mbit/s .. 10 Gbit/s.

A two-worker dumbbell whose switch-to-switch link is set to each rate in turn (with
`link set`, on one running testbed); iperf3, one TCP stream, 4 s after a 1 s warm-up.
The ceiling is 0.956: TCP/IP/Ethernet headers at MTU 1500 (tc counts layer 2).
Needs root and iperf3.

With ``--cross-host`` the same rates are measured a second time with the second switch on
another host: a real sshd in its own namespace on an underlay bridge (the multi-host
tests' lab, tests/kernel/sshhosts.py), so the link is a VXLAN tunnel shaped at both ends,
at MTU 1450 (TCP ceiling 0.955). Needs openssh-server too.

    sudo python -m benchmarks.link_fidelity [--rates 10mbit,100mbit,...] [--seconds 4] [--cross-host]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from testbed import Testbed, load_topology_dict
from testbed.model.units import Rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import dumbbell, iperf3  # noqa: E402

RATES = "10mbit,35mbit,100mbit,500mbit,1gbit,2500mbit,5gbit,10gbit"
TARGET = 0.95


def goodput(tb: Testbed, seconds: float) -> float:
    r = iperf3(tb, seconds, "-O", "1")
    if "sum_received" not in r["end"]:
        raise RuntimeError(f"iperf3: {r.get('error') or r['end']}")
    return r["end"]["sum_received"]["bits_per_second"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default=RATES)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--cross-host", action="store_true", help="also measure a link between two hosts (VXLAN)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    os.environ.setdefault("TESTBED_STATE_DIR", tempfile.mkdtemp(prefix="testbed-bench-"))
    rates = [Rate.parse(r) for r in args.rates.split(",")]
    # access links faster than the fastest bottleneck tested, so only the bottleneck shapes
    topo = dumbbell(name="fidelity", rate=str(rates[0]))
    topo["defaults"] = {"link": {"rate": "40gbit"}}
    rows = {"local (veth)": measure(topo, rates, args.seconds)}
    if args.cross_host:
        from tests.kernel import sshhosts

        lab = sshhosts.build(Path(tempfile.mkdtemp(prefix="testbed-lab-")), 1)
        try:
            topo = dict(topo, name="fidelityx", hosts=lab.host_specs())
            topo["nodes"] = dict(topo["nodes"], s1={"kind": "switch", "host": "h1"})
            rows["cross-host (VXLAN)"] = measure(topo, rates, args.seconds)
        finally:
            sshhosts.destroy(lab)
    print(f"\n{'rate':>9} " + " ".join(f"{k + ' ratio':>24}" for k in rows) + f"  (target >= {TARGET})")
    for i, rate in enumerate(rates):
        print(f"{str(rate):>9} " + " ".join(f"{v[i]:24.3f}" for v in rows.values()))
    for k, v in rows.items():
        print(f"worst ratio, {k}: {min(v):.3f}")


def measure(topo: dict, rates: list, seconds: float) -> list[float]:
    print(f"{'rate':>9} {'goodput Mbit/s':>15} {'ratio':>6}  {topo['name']} (target >= {TARGET}, TCP ceiling 0.956)")
    out = []
    with Testbed.up(load_topology_dict(topo)) as tb:
        try:
            tb.set_links(tb.find_links(bottleneck=True), rate=Rate.parse("400gbit"))
            capacity = goodput(tb, seconds)
            print(f"path capacity of this machine (shaping at 400gbit, i.e. CPU-bound): {capacity / 1e6:.0f} Mbit/s")
            for rate in rates:
                tb.set_links(tb.find_links(bottleneck=True), rate=rate)
                g = goodput(tb, seconds)
                ratio = g / rate.bps
                out.append(ratio)
                print(f"{str(rate):>9} {g / 1e6:15.1f} {ratio:6.3f}{'' if ratio >= TARGET else '  below target'}",
                      flush=True)
        finally:
            tb.close()
    return out

if __name__ == "__main__":
    main()
