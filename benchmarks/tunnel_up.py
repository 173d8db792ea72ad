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

With tunnels (an ordinary user's links) it also prints the CPU the forwarders used over the
iperf3 run (utime + stime from /proc/PID/stat, :func:`benchmarks.tunnel.cpu_seconds`) per
Gbit/s of goodput, both ends together: those visible here, and inside a Slurm job those on
each node of the job (one ``srun --overlap`` step per node reads them there, ``--cpu-here``);
a forwarder seen from two places (the lab's nodes share one machine) counts once. Over SSH
hosts only this machine's are seen, and the column says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.tunnel import cpu_seconds
from testbed.common import procs

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
FORWARDER = "testbed.net.tunnel"
ROOT = Path(__file__).resolve().parents[1]


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


def forwarders_here() -> dict[str, float]:
    """CPU seconds (utime + stime) of each of this user's tunnel forwarders seen here, keyed
    ``PID:STARTTIME`` (two machines' pids may be equal; with its start time, not both)."""
    out = {}
    for pid in procs.with_arg(FORWARDER):
        try:
            start = procs.start_time(pid)
            if start is None or os.stat(f"/proc/{pid}").st_uid != os.getuid():
                continue
            out[f"{pid}:{start}"] = cpu_seconds(pid)
        except (OSError, ValueError):  # it ended meanwhile
            continue
    return out


def forwarders() -> tuple[dict[str, float], bool]:
    """The forwarders' CPU seconds as :func:`forwarders_here` keys them, here and (inside a
    Slurm job) on each node of the job; and whether the nodes were asked."""
    got = forwarders_here()
    job, nodes = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_JOB_NUM_NODES", "")
    if not (job.isdigit() and nodes.isdigit()):
        return got, False
    r = subprocess.run(["srun", f"--jobid={job}", "--overlap", f"--nodes={nodes}", "--ntasks-per-node=1", "--quiet",
                        f"--chdir={ROOT}", sys.executable, "-m", "benchmarks.tunnel_up", "--cpu-here"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise SystemExit(f"reading the forwarders' CPU on the nodes failed: {r.stderr.strip()[-500:]}")
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            got.update(json.loads(line))
    return got, True


def cpu_used(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU seconds the forwarders seen at both samples used between them."""
    return sum(after[k] - before[k] for k in after.keys() & before.keys())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="slurm", help="testbed up --hosts (default: slurm, the job's nodes)")
    p.add_argument("--type", choices=("tunnel", "vxlan"), help="the link's type (default: by who runs it)")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--name", default="tbtun")
    p.add_argument("--cpu-here", action="store_true", help=argparse.SUPPRESS)  # a node's step: its forwarders
    args = p.parse_args()
    if args.cpu_here:
        print(json.dumps(forwarders_here()))
        return 0
    d = Path(tempfile.mkdtemp(prefix="tunnel-up-"))
    topo = d / "topo.yaml"
    topo.write_text(TOPOLOGY.format(name=args.name, type=f", type: {args.type}" if args.type else ""))
    _tb("up", str(topo), "--hosts", args.hosts)
    try:
        print(f"| rate | goodput | goodput / rate | TCP retransmits | forwarders' CPU-s per Gbit/s |  "
              f"(hosts: {args.hosts})")
        print("|---|---|---|---|---|")
        for rate, bps in RATES.items():
            _tb("link", "set", "-t", args.name, "s1-s2", "--bw", rate)
            before, _ = forwarders()
            got, retr = goodput(args.name, args.seconds)
            after, on_nodes = forwarders()
            # CPU over the whole iperf3 run (warm-up included) against goodput over the same span
            gbit = got * (args.seconds + 1) / 1e9
            cpu = (f"{cpu_used(before, after) / gbit:.3f}" + ("" if on_nodes else " (this machine's only)")
                   if after and gbit else "- (no forwarder)")
            print(f"| {rate} | {got / 1e6:.1f} Mbit/s | **{got / bps:.3f}** | {retr} | {cpu} |", flush=True)
    finally:
        _tb("down", args.name, check=False)
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
