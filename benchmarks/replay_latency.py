"""How late trace steps are in force, for 1 and 64 links changed at once (`link replay`).

A trace alternating between two rates every ``--every`` seconds is replayed on the
bottleneck links: one link (a dumbbell) and 64 links (64 workers on one switch, every
worker link a bottleneck). For each step, "late" is the time from its scheduled instant
to the return of the last tc call that puts it in force (both directions of every
link); the benchmark prints its median, 95th and 99th percentiles and maximum, and the median time
the changes themselves took (so a step that takes longer than ``--every`` shows as
growing lateness, not hidden). "state" is the time from the scheduled instant to the
state file's write (right after the kernel's, under the same lock; what ``link show``
and the exporter read): its median and maximum. Target: 20 ms.

    sudo python -m benchmarks.replay_latency [--steps 50] [--every 0.5] [--links 1,64] [--log FILE]
                                             [--record DIR]

``--record DIR`` writes one row per replay (the figures above in seconds, the five latest
steps' breakdown, and the host's 1-minute load average at its start and end) to
DIR/result.json, for ``python -m benchmarks.archive DIR --name NAME``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.archive import record
from benchmarks.ops_tables import argv_of
from testbed import Testbed, load_topology_dict
from testbed.model.topology import DIRECTIONS
from testbed.net.tcbatch import LinkChanger
from testbed.engine.replay import replay
from testbed.model.trace import parse_csv
from testbed.model.units import Rate

TARGET_S = 0.020


def topology(n: int) -> dict:
    if n == 1:
        return {"name": "lat1", "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch"},
                                          "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
                "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s1"]},
                          {"endpoints": ["s0", "s1"], "rate": "1gbit", "bottleneck": True}]}
    nodes = {"s0": {"kind": "switch"}, **{f"w{i}": {"kind": "worker"} for i in range(n)}}
    return {"name": f"lat{n}", "nodes": nodes,
            "links": [{"endpoints": [f"w{i}", "s0"], "rate": "1gbit", "bottleneck": True} for i in range(n)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--every", type=float, default=0.5, help="seconds between steps")
    ap.add_argument("--links", default="1,64")
    ap.add_argument("--log", help="append every step's record to this file (JSON lines, as `link replay --log`)")
    ap.add_argument("--record", type=Path, metavar="DIR", help="write every replay's figures to DIR/result.json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    if args.steps < 2 or args.every <= 0:
        sys.exit("--steps: at least 2; --every: more than 0 seconds")
    try:
        sizes = [int(x) for x in args.links.split(",")]
    except ValueError:
        sys.exit(f"--links {args.links!r}: a comma-separated list of link counts, e.g. 1,64")
    os.environ.setdefault("TESTBED_STATE_DIR", tempfile.mkdtemp(prefix="testbed-bench-"))
    lines = [f"{i * args.every:.6f},{'100mbit' if i % 2 else '200mbit'}" for i in range(args.steps)]
    trace = parse_csv(lines, "alternating")
    print(f"{args.steps} steps, one every {args.every * 1000:.0f} ms; late = scheduled -> in force in the kernel; "
          f"state = scheduled -> the state file written; tc alone = the step's netlink datagrams and acknowledgements")
    print(f"{'links':>6} {'directions':>10} {'late: median ms':>16} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'within 20 ms':>12} "
          f"{'applying: median ms':>20} {'tc alone: median ms':>20} {'state: median ms':>17} {'state: max ms':>14}")
    rows = []
    for n in sizes:
        load_start = os.getloadavg()[0]
        with Testbed.up(load_topology_dict(topology(n))) as tb:
            links = tb.find_links(bottleneck=True)
            with open(args.log, "a") if args.log else contextlib.nullcontext() as log:
                res = replay(tb, links, trace, log=log)
            row = measured(res.steps, tc_alone(tb, links))
        row.update(links=len(links), every_s=args.every, load_start=load_start, load_end=os.getloadavg()[0])
        rows.append(row)
        print(f"{len(links):>6} {2 * len(links):>10} {row['late_median_s'] * 1000:>16.1f} "
              f"{row['late_p95_s'] * 1000:>8.1f} {row['late_p99_s'] * 1000:>8.1f} {row['late_max_s'] * 1000:>8.1f} "
              f"{row['within_target']:>12.0%} {row['apply_median_s'] * 1000:>20.1f} {row['tc_alone_s'] * 1000:>20.1f} "
              f"{row['state_median_s'] * 1000:>17.1f} {row['state_max_s'] * 1000:>14.1f}")
        slowest(res.steps)
    if args.record:
        where = record(args.record, "replay_latency", rows, target_s=TARGET_S, argv=argv_of(sys.argv[1:]))
        print(f"recorded: {where}")


def measured(steps: list[dict], tc: float, n: int = 5) -> dict:
    """One replay's figures (seconds): lateness, applying, state write, tc alone, and the
    ``n`` latest steps' breakdown (how late each woke, applying, of which send and acks)."""
    late = sorted(s["late_s"] for s in steps)
    state = sorted(s["state_s"] for s in steps)
    latest = sorted(steps, key=lambda s: s["late_s"], reverse=True)[:n]
    return {"steps": len(late), "late_median_s": statistics.median(late), "late_p95_s": _pct(late, 0.95),
            "late_p99_s": _pct(late, 0.99), "late_max_s": late[-1],
            "within_target": sum(x <= TARGET_S for x in late) / len(late),
            "apply_median_s": statistics.median(s["apply_s"] for s in steps), "tc_alone_s": tc,
            "state_median_s": statistics.median(state), "state_max_s": state[-1],
            "latest": [{"at_s": s["at_s"], "late_s": s["late_s"], "woke_s": s["late_s"] - s["apply_s"],
                        "apply_s": s["apply_s"], "send_s": s.get("send_s"), "ack_s": s.get("ack_s")}
                       for s in latest]}


def _pct(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values, as the replay's own ``lateness()`` takes it."""
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def slowest(steps: list[dict], n: int = 5) -> None:
    """Where the ``n`` latest steps' time went: waking up after the step's time, then inside
    set_links (of which sending the datagrams, then the kernel's acknowledgements)."""
    print(f"  the {n} latest steps, ms: late = woke (after its time) + applying (of which send + acks)")
    for s in sorted(steps, key=lambda s: s["late_s"], reverse=True)[:n]:
        woke = s["late_s"] - s["apply_s"]
        print(f"  at {s['at_s']:8.2f} s: late {s['late_s'] * 1000:6.1f} = woke {woke * 1000:5.1f} + applying "
              f"{s['apply_s'] * 1000:6.1f} (send {s.get('send_s', 0) * 1000:5.1f} + acks {s.get('ack_s', 0) * 1000:6.1f})")


def tc_alone(tb, links, times: int = 20) -> float:
    """Median seconds of one step's tc changes alone (the same batch set_links sends),
    without the lock and the state file."""
    changer = LinkChanger()
    try:
        eps = [tb.egress[(l.index, d)] for l in links for d in DIRECTIONS]
        shapes = [{ep: replace(l.shape(d), rate=Rate.parse(r)) for ep, (l, d) in
                   zip(eps, [(l, d) for l in links for d in DIRECTIONS])} for r in ("100mbit", "200mbit")]
        took = []
        for i in range(times):
            t = time.perf_counter()
            changer.apply([(ep, shape, "bench") for ep, shape in shapes[i % 2].items()])
            took.append(time.perf_counter() - t)
        return statistics.median(took[2:])  # the first two encode; a replay encodes before it starts
    finally:
        changer.close()


if __name__ == "__main__":
    main()
