"""Cost of one scrape of the link exporter for 8, 64 and 256 links (target: well under 1 s at 256).

Brings up a star of N workers (N links, 2N shaped directions in N + 1 namespaces), serves
its link collector on a loopback port as the exporter `testbed up` starts does (netlink
handles kept open between scrapes), and times HTTP GETs of /metrics (the median of
--scrapes, after one warm-up; the warm-up opens the handles). Needs root.

    sudo python -m benchmarks.exporter [--sizes 8,64,256] [--scrapes 5] [--record DIR]

``--record DIR`` writes one row per size (links, series, bytes, every timed scrape's
seconds, and the host's 1-minute load average at its start and end) to DIR/result.json,
for ``python -m benchmarks.archive DIR --name NAME``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from collectors.links import LinkCollector
from testbed import Testbed, load_topology_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.archive import record  # noqa: E402
from benchmarks.ops_tables import argv_of  # noqa: E402
from tests.helpers import star, star_of_stars  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="8,64,256")
    p.add_argument("--scrapes", type=int, default=5)
    p.add_argument("--record", type=Path, metavar="DIR", help="write every size's scrapes to DIR/result.json")
    args = p.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        sys.exit(f"--sizes {args.sizes!r}: a comma-separated list of link counts, e.g. 8,64,256")
    if args.scrapes < 1 or min(sizes) < 1:
        sys.exit("--scrapes and every size: at least 1")
    print(f"{'links':>6} {'series':>7} {'bytes':>8} {'scrape median s':>16} {'max s':>7}")
    rows = []
    for n in sizes:
        load = os.getloadavg()[0]
        spec = star(n, name=f"exp{n}") if n <= 512 else star_of_stars(n, name=f"exp{n}")
        with Testbed.up(load_topology_dict(spec)) as tb:
            reg = CollectorRegistry(auto_describe=False)
            collector = LinkCollector([tb.name])
            reg.register(collector)
            server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
            url = f"http://127.0.0.1:{server.server_port}/metrics"
            times = []
            body = b""
            for i in range(args.scrapes + 1):
                t0 = time.perf_counter()
                with urllib.request.urlopen(url, timeout=60) as r:
                    body = r.read()
                if i:
                    times.append(time.perf_counter() - t0)
            server.shutdown()
            collector.close()  # before `down`: open handles would keep the namespaces alive
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
            print(f"{len(tb.topology.links):6d} {series:7d} {len(body):8d} {statistics.median(times):16.3f} "
                  f"{max(times):7.3f}", flush=True)
            rows.append({"links": len(tb.topology.links), "series": series, "bytes": len(body), "seconds": times,
                         "load_start": load, "load_end": os.getloadavg()[0]})
    if args.record:
        where = record(args.record, "exporter", rows, argv=argv_of(sys.argv[1:]))
        print(f"recorded: {where}")


if __name__ == "__main__":
    main()
