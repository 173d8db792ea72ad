"""`testbed up` / `down` wall time for stars of N workers, next to the batched-iproute2 floor.

The floor creates the same kernel objects (a switches namespace with one bridge, N worker
namespaces with lo up, an address and eth0 up, N veth pairs, HTB qdisc+class on both ends)
with the fewest processes iproute2 allows: one `ip -batch` for the namespaces, one
`ip -n SWITCHES -batch` for bridge and veths, and one `ip -n NS -batch` plus one
`tc -n NS -batch` per namespace (batch lines cannot switch namespace). Both are measured
in the same run, since these machines are noisy. Needs root.

    sudo python -m benchmarks.up_down [--sizes 8,64,256,1024]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed import Testbed, load_topology_dict
from testbed.core import down

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import star  # noqa: E402

RATE = "1Gbit"
HTB = "root handle 1: htb default 1"
CLS = "parent 1: classid 1:1 htb rate {r} ceil {r} burst 125000 cburst 125000 quantum 60000"


def _batch(tool: str, lines: list[str], ns: str | None = None) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".batch", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    argv = [tool] + (["-n", ns] if ns else []) + ["-batch", f.name]
    try:
        subprocess.run(argv, check=True, capture_output=True)
    finally:
        os.unlink(f.name)


def floor(n: int) -> tuple[float, float]:
    fab = "flr"
    workers = [f"flr.w{i}" for i in range(n)]
    t0 = time.perf_counter()
    _batch("ip", [f"netns add {fab}"] + [f"netns add {w}" for w in workers])
    _batch("ip", ["link set lo up", "link add sw0 type bridge", "link set sw0 up"]
           + [f"link add l{i}b master sw0 up type veth peer name eth0 netns {w}" for i, w in enumerate(workers)], ns=fab)
    for i, w in enumerate(workers):
        _batch("ip", ["link set lo up", f"addr add 10.9.{i // 250}.{i % 250 + 1}/16 dev eth0", "link set eth0 up"], ns=w)
        _batch("tc", [f"qdisc add dev eth0 {HTB}", f"class add dev eth0 {CLS.format(r=RATE)}"], ns=w)
    _batch("tc", [l for i in range(n) for l in (f"qdisc add dev l{i}b {HTB}", f"class add dev l{i}b {CLS.format(r=RATE)}")],
           ns=fab)
    t_up = time.perf_counter() - t0
    t0 = time.perf_counter()
    _batch("ip", [f"netns del {w}" for w in workers] + [f"netns del {fab}"])
    t_down = time.perf_counter() - t0
    return t_up, t_down


def testbed_times(n: int) -> tuple[float, float]:
    topo = load_topology_dict(star(n, name="bench", rate="1gbit"))
    t0 = time.perf_counter()
    tb = Testbed.up(topo)
    t_up = time.perf_counter() - t0
    assert tb.exec(f"w{n - 1}", ["ping", "-c1", "-W2", tb.address("w0")], stdout=subprocess.DEVNULL).returncode == 0
    t0 = time.perf_counter()
    down("bench")
    return t_up, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64,256,1024")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    os.environ.setdefault("TESTBED_STATE_DIR", tempfile.mkdtemp(prefix="testbed-bench-"))
    print(f"{'workers':>7} {'up (s)':>8} {'floor up':>9} {'up/floor':>9} {'down (s)':>9} {'floor down':>11} {'down/floor':>11}")
    for n in [int(x) for x in args.sizes.split(",")]:
        fu, fd = floor(n)
        tu, td = testbed_times(n)
        print(f"{n:7d} {tu:8.3f} {fu:9.3f} {tu / fu:9.2f} {td:9.3f} {fd:11.3f} {td / fd:11.2f}", flush=True)
        time.sleep(1.0)  # let the kernel finish freeing the namespaces (cleanup_net is asynchronous)


if __name__ == "__main__":
    main()
