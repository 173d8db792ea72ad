"""How cross-traffic shares a shaped link: two greedy flows, and a training run against one.

1. Two greedy iperf3 flows w0->w1 on a dumbbell whose uplink is ``--rate`` (20 Mbit/s),
   for ``--seconds``; each flow's share of what the servers received over the last 9 s and
   over everything after a 2 s warm-up, for each queue limit in ``--limits`` (0: tc's
   default of 1000 packets).
2. ``testbed run allreduce`` (2 ranks, ``--width``) with one greedy flow w0->w1: the run's
   share of the forward direction from tc's counters (training sends about as much each
   way, so forward minus reverse is the flow), next to the flow's bytes from iperf3, and
   the mean iteration time.

    sudo python -m benchmarks.cross_traffic [--rate 20mbit] [--seconds 20] [--limits 0,100,30] [--record DIR]

``--record DIR`` writes one row per queue limit and window and one for the run (with the
host's 1-minute load average at the start and end of each) to DIR/result.json, for
``python -m benchmarks.archive DIR --name NAME``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.archive import record
from benchmarks.ops_tables import argv_of
from testbed import Testbed, load_topology_dict
from testbed.runs.experiment import RunRequest, run
from testbed.runs.traffic import CrossTraffic
from testbed.model.flows import parse_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import dumbbell  # noqa: E402

WIRE_PER_PAYLOAD = 1514 / 1448


def greedy_pair(rate: str, limit: int, seconds: float) -> list[dict]:
    load = os.getloadavg()[0]
    kw = {"limit": limit} if limit else {}
    with Testbed.up(load_topology_dict(dumbbell("bct", rate=rate, **kw))) as tb:
        ct = CrossTraffic(tb, [parse_spec("w0->w1"), parse_spec("w0->w1")], Path(tempfile.mkdtemp()))
        t0 = time.time()
        ct.start()
        try:
            time.sleep(seconds)
        finally:
            ct.stop()
        t1 = time.time()
        rows = []
        for label, a in (("last 9 s", t1 - 9), (f"{seconds - 2:g} s", t0 + 2)):
            r = [f["mean_bits_per_second"] or 0 for f in ct.summary(a, t1)]
            print(f"{limit or 1000:>6} {label:>10} {r[0] / 1e6:>8.2f} {r[1] / 1e6:>8.2f} {r[0] / sum(r):>8.2f}")
            rows.append({"kind": "pair", "limit": limit or 1000, "window": "last" if a > t0 + 2 else "all",
                         "window_s": t1 - a, "flows_bps": r,
                         "load_start": load, "load_end": os.getloadavg()[0]})
    return rows


def run_share(rate: str, width: str, iters: int) -> dict:
    load = os.getloadavg()[0]
    out = Path(tempfile.mkdtemp())
    topo = out / "bcr.yaml"
    import yaml

    topo.write_text(yaml.safe_dump(dumbbell("bcr", rate=rate)))
    s = run(RunRequest("allreduce", ["--width", width, "--max-iters", str(iters)], topology=topo, out=out,
                       exporter=False, cross_traffic=[parse_spec("w0->w1")]))
    links = s["bottleneck"]["links"]
    fwd, rev = links["s0-s1 forward"]["bytes"], links["s0-s1 reverse"]["bytes"]
    flow = s["cross_traffic"][0]
    cross = flow["mean_bits_per_second"] / 8 * s["run_s"] * WIRE_PER_PAYLOAD
    print(f"run share of forward (tc: reverse / forward): {rev / fwd:.2f}; flow by iperf3: {cross / fwd:.2f} "
          f"of forward; mean iteration {s['mean_iter_s']:.2f} s for {s['mean_payload_bytes'] / 1e6:.2f} MB of "
          f"gradients")
    return {"kind": "run", "width": width, "iters": iters, "forward_bytes": fwd, "reverse_bytes": rev,
            "flow_bytes": cross, "mean_iter_s": s["mean_iter_s"], "payload_bytes": s["mean_payload_bytes"],
            "load_start": load, "load_end": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="20mbit")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--limits", default="0,100,30")
    ap.add_argument("--width", default="1")
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--record", type=Path, metavar="DIR", help="write every measurement to DIR/result.json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    try:
        limits = [int(x) for x in args.limits.split(",")]
    except ValueError:
        sys.exit(f"--limits {args.limits!r}: a comma-separated list of queue limits in packets (0: tc's default)")
    if args.seconds < 12 or args.iters < 1:
        sys.exit("--seconds: at least 12 (a 2 s warm-up and a 9 s window); --iters: at least 1")
    os.environ.setdefault("TESTBED_STATE_DIR", tempfile.mkdtemp(prefix="testbed-bench-"))
    print(f"two greedy flows on {args.rate}: Mbit/s received per flow, and the first flow's share")
    print(f"{'queue':>6} {'window':>10} {'flow 1':>8} {'flow 2':>8} {'share 1':>8}")
    rows = [row for limit in limits for row in greedy_pair(args.rate, limit, args.seconds)]
    rows.append(run_share(args.rate, args.width, args.iters))
    if args.record:
        where = record(args.record, "cross_traffic", rows, rate=args.rate, seconds=args.seconds,
                       argv=argv_of(sys.argv[1:]))
        print(f"recorded: {where}")


if __name__ == "__main__":
    main()
