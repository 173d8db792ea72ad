"""Cost of an ordinary user's exporter asking for the user's token (testbed.monitor.auth).

Serves one registry of SERIES gauges twice on loopback, once open (root's exporters) and
once behind the bearer-token check (an ordinary user's), and times HTTP GETs of /metrics
alternating between the two, so both see the same machine load. Prints the median of
each and their ratio. Needs no root.

    python -m benchmarks.metrics_auth [--series 1000] [--scrapes 200]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
import urllib.request

from prometheus_client import CollectorRegistry, Gauge

from collectors.serve import serve


def _registry(series: int) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    g = Gauge("testbed_bench_value", "a value", ["link", "direction"], registry=reg)
    for i in range(series):
        g.labels(f"l{i // 2}", "forward" if i % 2 else "reverse").set(i)
    return reg


def _get(url: str, headers: dict) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        r.read()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=1000)
    p.add_argument("--scrapes", type=int, default=200)
    args = p.parse_args()
    reg, token = _registry(args.series), secrets.token_urlsafe(32)
    open_srv, _ = serve(reg, "127.0.0.1", 0)
    guarded_srv, _ = serve(reg, "127.0.0.1", 0, token)
    urls = {"open": (f"http://127.0.0.1:{open_srv.server_port}/metrics", {}),
            "token": (f"http://127.0.0.1:{guarded_srv.server_port}/metrics", {"Authorization": f"Bearer {token}"})}
    times: dict[str, list[float]] = {k: [] for k in urls}
    for url, h in urls.values():
        _get(url, h)  # warm-up
    for _ in range(args.scrapes):
        for k, (url, h) in urls.items():
            times[k].append(_get(url, h))
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        q = statistics.quantiles(v, n=10)
        print(f"{k:>6}: median {med[k] * 1000:.3f} ms  p10-p90 {q[0] * 1000:.3f}-{q[-1] * 1000:.3f} ms "
              f"({args.scrapes} scrapes of {args.series} series)")
    print(f"token / open: {med['token'] / med['open']:.3f}")


if __name__ == "__main__":
    main()
