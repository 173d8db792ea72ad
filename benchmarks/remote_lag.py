"""What a request to another host costs: one `testbed _host` exec per request (a new SSH
session and a Python start there) against one line on the agent's channel kept open
(`testbed _host serve`, what the run's 1 Hz counter reads, `link show` and a trace step on a
cross-host link use).

Builds the multi-host tests' lab (one real sshd host in its own namespaces on an underlay
bridge, tests/kernel/sshhosts.py) and a dumbbell whose second switch and worker are on that
host, then times ``--n`` counter reads and ``--n`` shape changes of the cross-host link's
far end each way, and prints median and 90th percentile per request and the ratio.

    sudo python -m benchmarks.remote_lag [--n 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from testbed import Testbed, load_topology_dict
from testbed.model.units import Rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import dumbbell  # noqa: E402


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def row(what: str, exec_s: list[float], agent_s: list[float]) -> None:
    med_e, med_a = statistics.median(exec_s), statistics.median(agent_s)
    p90 = lambda xs: sorted(xs)[int(0.9 * (len(xs) - 1))]  # noqa: E731
    print(f"{what:<16} {1e3 * med_e:10.1f} {1e3 * p90(exec_s):10.1f} {1e3 * med_a:10.1f} {1e3 * p90(agent_s):10.1f}"
          f" {med_e / med_a:8.1f}x")


def measure(tb: Testbed, n: int) -> None:
    site = tb.site("h1")
    link = tb.find_links(bottleneck=True)[0]
    far = [(i, d) for (i, d), ep in tb.egress.items() if i == link.index and ep.host == "h1"]
    rates = [Rate.parse("200mbit"), Rate.parse("300mbit")]

    def payload(k: int) -> dict:
        shape = link.shape(far[0][1])
        new = shape.__class__(**{**shape.__dict__, "rate": rates[k % 2]})
        return {"changes": [{"link": i, "direction": d, "shape": new.to_dict(), "old": shape.to_dict()}
                            for i, d in far], "copies": {}}

    k = iter(range(10 ** 6))
    site.agent.ask("counters")  # the agent started (as a run's first read does)
    print(f"{'ms per request':<16} {'exec med':>10} {'exec p90':>10} {'agent med':>10} {'agent p90':>10} {'ratio':>9}")
    row("counters", timed(lambda: site.remote.call("counters", tb.name, timeout=60), n),
        timed(lambda: site.agent.ask("counters"), n))
    row("shape step", timed(lambda: site.remote.call("shape", tb.name, payload=payload(next(k)), timeout=60), n),
        timed(lambda: site.agent.ask("shape", payload(next(k))), n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    os.environ.setdefault("TESTBED_STATE_DIR", tempfile.mkdtemp(prefix="testbed-bench-"))
    from tests.kernel import sshhosts

    lab = sshhosts.build(Path(tempfile.mkdtemp(prefix="testbed-lab-")), 1)
    try:
        topo = dumbbell(name="lag", rate="100mbit")
        topo["hosts"] = lab.host_specs()
        topo["nodes"] = dict(topo["nodes"], s1={"kind": "switch", "host": "h1"})
        with Testbed.up(load_topology_dict(topo)) as tb:
            try:
                measure(tb, args.n)
            finally:
                tb.close()
    finally:
        sshhosts.destroy(lab)


if __name__ == "__main__":
    main()
