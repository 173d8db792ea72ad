"""TCP goodput across a link between two hosts that ``testbed up`` made, against its rate.

Run it where a testbed across hosts can come up: as an ordinary user inside a Slurm job of
two nodes (the link is then a user-space tunnel, docs/tunnel.md), or as root (VXLAN, unless
``--type tunnel``)::

    salloc -N 2 python -m benchmarks.tunnel_up --hosts slurm

It brings up two workers, one behind a switch on each host, the link between the switches
at each rate in turn (``testbed link set``), and runs one iperf3 TCP stream w0 -> w1 for
``--seconds`` after a 1 s warm-up (``-O 1``); it prints goodput / rate for each rate, then
takes the testbed down. HTB counts Ethernet frames, so TCP at MTU 1450 cannot exceed about
0.95 of the rate.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOPOLOGY = """\
name: {name}
nodes:
  s1: {{kind: switch, host: h1}}
  s2: {{kind: switch, host: h2}}
  w0: {{kind: worker}}
  w1: {{kind: worker}}
links:
  - {{endpoints: [w0, s1]}}
  - {{endpoints: [w1, s2]}}
  - {{endpoints: [s1, s2], rate: 100mbit, bottleneck: true{type}}}
"""
RATES = {"100mbit": 100e6, "500mbit": 500e6, "1gbit": 1e9}


def _tb(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([_testbed(), *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise SystemExit(f"testbed {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def _testbed() -> str:
    return shutil.which("testbed") or str(Path(sys.executable).parent / "testbed")


def goodput(name: str, seconds: int) -> tuple[float, int]:
    """One TCP stream w0 -> w1: (bits/s received, retransmits). The server is a command of its
    own in w1 for one test (a daemon would end with its `exec`: on Slurm, with its step)."""
    server = subprocess.Popen([_testbed(), "exec", "-t", name, "w1", "--", "iperf3", "-s", "-1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(20):
            r = _tb("exec", "-t", name, "w0", "--", "iperf3", "-c", "10.200.0.2", "-t", str(seconds), "-O", "1",
                    "-J", check=False, timeout=seconds + 60)
            end = json.loads(r.stdout or "{}").get("end", {})
            if "sum_received" in end:
                return end["sum_received"]["bits_per_second"], end["sum_sent"].get("retransmits", 0)
            time.sleep(0.5)  # the server is not listening yet
        raise SystemExit(f"iperf3 across the link failed: {r.stdout[-500:]} {r.stderr[-500:]}")
    finally:
        server.wait(60)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="slurm", help="testbed up --hosts (default: slurm, the job's nodes)")
    p.add_argument("--type", choices=("tunnel", "vxlan"), help="the link's type (default: by who runs it)")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--name", default="tbtun")
    args = p.parse_args()
    d = Path(tempfile.mkdtemp(prefix="tunnel-up-"))
    topo = d / "topo.yaml"
    topo.write_text(TOPOLOGY.format(name=args.name, type=f", type: {args.type}" if args.type else ""))
    _tb("up", str(topo), "--hosts", args.hosts)
    try:
        print(f"| rate | goodput | goodput / rate | TCP retransmits |  (hosts: {args.hosts})")
        print("|---|---|---|---|")
        for rate, bps in RATES.items():
            _tb("link", "set", "-t", args.name, "s1-s2", "--bw", rate)
            got, retr = goodput(args.name, args.seconds)
            print(f"| {rate} | {got / 1e6:.1f} Mbit/s | **{got / bps:.3f}** | {retr} |", flush=True)
    finally:
        _tb("down", args.name, check=False)
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
