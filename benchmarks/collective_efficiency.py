"""Payload goodput of a dense all-reduce across a shaped bottleneck, through `testbed run`.

Two workers on a dumbbell whose switch-to-switch link is capped at --bw; each rank runs
``python -m workloads.collective`` (a float32 all-reduce of --bytes, timed per call),
launched, pinned and accounted for by the same machinery as ``testbed run``. With two
ranks, a ring all-reduce moves each rank's whole buffer across the bottleneck once per
direction, so payload bits / seconds / link rate is the fraction of the link the
collective turned into goodput. The TCP ceiling is 0.956 for one direction (header
overhead at MTU 1500; docs/results/network.md, "Link fidelity"); raw gloo between two
namespaces capped at 100 Mbit reached 0.94 once (a 10 MB ring all-reduce in 0.852 s). An all-reduce sends both ways at once, and each direction's ACKs then
queue behind the other direction's data, so the benchmark also measures that ceiling in
the same run: iperf3 --bidir across the same link. Needs root.

    sudo python -m benchmarks.collective_efficiency [--bw 100mbit] [--bytes 10000000] [--iters 5]
                                                    [--repeats N] [--record DIR]

``--repeats N`` measures every congestion control N times, taking turns; ``--record DIR``
writes every measurement to DIR/result.json for ``benchmarks.archive`` (the table in
docs/results/network.md: ``benchmarks.network_tables``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks.archive import record
from testbed import Testbed, load_topology
from testbed.runs.experiment import RunRequest, run
from testbed.model.units import Rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import dumbbell, iperf3  # noqa: E402


def measure(rate: Rate, cc: str | None, nbytes: int, iters: int, tmp: Path) -> dict:
    spec = dumbbell("collbench", rate=str(rate))
    if cc:
        spec["defaults"] = {"sysctls": {"net.ipv4.tcp_congestion_control": cc}}
    topo = tmp / "ce.yaml"
    topo.write_text(yaml.safe_dump(spec))
    with Testbed.up(load_topology(topo)) as tb:
        used = tb.exec("w0", ["sysctl", "-n", "net.ipv4.tcp_congestion_control"],
                       capture_output=True, text=True).stdout.strip()
        bidir = iperf3(tb, 8, "--bidir")["end"]
        tcp = [bidir["sum_received"]["bits_per_second"] / rate.bps,
               bidir["sum_received_bidir_reverse"]["bits_per_second"] / rate.bps]
        s = run(RunRequest(scheme="allreduce-only", module="workloads.collective", testbed=tb.name,
                           out=tmp / f"runs-{used}",
                           workload_args=["--bytes", str(nbytes), "--iters", str(iters)]))
    payload = s["mean_payload_bytes"]
    return dict(cc=used, payload=payload, mean=s["mean_iter_s"], best=s["min_iter_s"], tcp=tcp,
                wire=s["bottleneck"]["bytes_per_iteration"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bw", default="100mbit")
    p.add_argument("--bytes", type=int, default=10_000_000)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--cc", default="host,reno",
                   help="TCP congestion controls to compare, set on the workers through the topology's "
                        "sysctls (host = leave the host's default)")
    p.add_argument("--repeats", type=int, default=1, help="measure every congestion control this many times")
    p.add_argument("--record", type=Path, metavar="DIR", help="write every measurement to DIR/result.json")
    args = p.parse_args()
    if args.repeats < 1:
        sys.exit("--repeats: at least 1")
    rate = Rate.parse(args.bw)
    print(f"dense all-reduce of {args.bytes / 1e6:.1f} MB between 2 ranks across a {rate} bottleneck "
          f"({args.iters} calls after a warm-up)")
    rows = []
    for k in range(args.repeats):
        for cc in args.cc.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                m = measure(rate, None if cc == "host" else cc, args.bytes, args.iters, Path(tmp))
            rows.append(dict(m, asked=cc, repeat=k, rate_bps=rate.bps))
            _print(m, cc, rate)
    if args.record:
        print(f"recorded: {record(args.record, 'collective_efficiency', rows, bytes=args.bytes, iters=args.iters)}")


def _print(m: dict, cc: str, rate: Rate) -> None:
    payload, mean, best, tcp = m["payload"], m["mean"], m["best"], m["tcp"]
    print(f"TCP congestion control {m['cc']}" + (" (the host's default)" if cc == "host" else ""))
    print(f"  mean {mean:.3f} s, best {best:.3f} s per all-reduce")
    print(f"  payload goodput / link rate: mean {payload * 8 / mean / rate.bps:.3f}, "
          f"best {payload * 8 / best / rate.bps:.3f}   (target >= 0.92; one-way TCP ceiling 0.956)")
    print(f"  iperf3 --bidir on the same link, goodput / rate: {tcp[0]:.3f} and {tcp[1]:.3f}; "
          f"all-reduce mean / bidirectional TCP mean: {payload * 8 / mean / rate.bps / (sum(tcp) / 2):.3f}")
    print(f"  bottleneck bytes per all-reduce (both directions, incl. the warm-up): {m['wire'] / 1e6:.2f} MB "
          f"= {m['wire'] / payload:.2f} x payload")


if __name__ == "__main__":
    main()
