"""Soak: does anything grow over many up/down cycles, runs and scrapes? Needs root.

1. ``--cycles`` up/down cycles of three_switch (each with its link exporter);
2. ``--runs`` short `testbed run`s in a row on a dumbbell brought up once;
3. ``--scrapes`` GETs of /metrics from the link exporter of a 256-link star.

After each phase (and every so often within it) it prints what a leak would grow: the
host's namespaces, links and qdiscs (counted with iproute2), the processes whose command
line names this soak's state directory, this process's open file descriptors, and the
exporter's resident memory. Growth is printed as the difference between the first and the
last sample; nothing is asserted (the figures go to docs/results/network.md).

    sudo python -m benchmarks.soak [--cycles 200] [--runs 50] [--scrapes 10000] [--record DIR]

``--record DIR`` writes one row per phase (its name, count, seconds, every sample, and the
host's 1-minute load average at its start and end) to DIR/result.json, for
``python -m benchmarks.archive DIR --name NAME``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.archive import record  # noqa: E402
from benchmarks.ops_tables import argv_of  # noqa: E402
from tests.helpers import dumbbell, star  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _count(argv: list[str]) -> int:
    return len(subprocess.run(argv, capture_output=True, text=True).stdout.splitlines())


def snapshot(state: str, exporter_pid: int | None = None) -> dict:
    procs = 0
    for e in os.scandir("/proc"):
        if e.name.isdigit() and int(e.name) != os.getpid():
            try:
                with open(f"/proc/{e.name}/cmdline", "rb") as f:
                    procs += state.encode() in f.read()
            except OSError:
                pass
    snap = {"netns": _count(["ip", "netns", "list"]), "links": _count(["ip", "-o", "link", "show"]),
            "qdiscs": _count(["tc", "qdisc", "show"]), "procs": procs, "fds": len(os.listdir("/proc/self/fd"))}
    if exporter_pid:
        with open(f"/proc/{exporter_pid}/status") as f:
            snap["exporter_rss_kb"] = next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))
    return snap


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True)


def report(phase: str, samples: list[dict], seconds: float, rows: list[dict], count: int, load: float) -> None:
    """Print the phase's growth and keep its row for ``--record``."""
    first, last = samples[0], samples[-1]
    growth = {k: last[k] - first[k] for k in first}
    label = PHASES[phase].format(n=count)
    print(f"{label}: {seconds:.0f} s; first {json.dumps(first)}; last {json.dumps(last)}; growth {json.dumps(growth)}",
          flush=True)
    rows.append({"phase": phase, "count": count, "seconds": seconds, "load_start": load,
                 "load_end": os.getloadavg()[0], "samples": samples})


PHASES = {"cycles": "{n} up/down cycles of three_switch", "runs": "{n} short runs on one testbed",
          "scrapes": "{n} scrapes of a 256-link exporter"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--scrapes", type=int, default=10000)
    ap.add_argument("--record", type=Path, metavar="DIR", help="write every phase's samples to DIR/result.json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    if min(args.cycles, args.runs, args.scrapes) < 0:
        sys.exit("--cycles, --runs, --scrapes: 0 or more")
    rows: list[dict] = []
    state = tempfile.mkdtemp(prefix="testbed-soak-")
    os.environ["TESTBED_STATE_DIR"] = state
    work = Path(tempfile.mkdtemp(prefix="testbed-soak-work-"))
    three = str(ROOT / "topologies" / "three_switch.yaml")

    if args.cycles:
        load, samples, t0 = os.getloadavg()[0], [snapshot(state)], time.monotonic()
        for i in range(args.cycles):
            for argv in (("up", three), ("down", "three_switch")):
                r = cli(*argv)
                if r.returncode:
                    sys.exit(f"cycle {i}: {' '.join(argv)} failed: {r.stderr}")
            if (i + 1) % max(1, args.cycles // 4) == 0:
                samples.append(snapshot(state))
        report("cycles", samples, time.monotonic() - t0, rows, args.cycles, load)

    if args.runs:
        topo = work / "soak.yaml"
        topo.write_text(json.dumps(dumbbell("soak", rate="1gbit")))
        if cli("up", str(topo)).returncode:
            sys.exit("up of the run testbed failed")
        load, samples, t0 = os.getloadavg()[0], [snapshot(state)], time.monotonic()
        try:
            for i in range(args.runs):
                r = cli("run", "allreduce", "-t", "soak", "--out", str(work / "runs"), "--max-iters", "2",
                        "--eval-every", "2", "--no-exporter", "--json")
                if r.returncode:
                    sys.exit(f"run {i} failed: {r.stdout[-500:]} {r.stderr[-500:]}")
                if (i + 1) % max(1, args.runs // 5) == 0:
                    samples.append(snapshot(state))
        finally:
            cli("down", "soak")
        report("runs", samples, time.monotonic() - t0, rows, args.runs, load)

    if args.scrapes:
        topo = work / "scrape.yaml"
        topo.write_text(json.dumps(star(256, name="scrape")))
        r = cli("up", str(topo), "--json")
        if r.returncode:
            sys.exit(f"up of the 256-link star failed: {r.stderr}")
        url = json.loads(r.stdout)["exporter"]
        pid = next(int(e.name) for e in os.scandir("/proc") if e.name.isdigit()
                   and f"--sd-file={state}".encode() in open(f"/proc/{e.name}/cmdline", "rb").read())
        try:
            load, samples, t0 = os.getloadavg()[0], [], time.monotonic()
            for i in range(args.scrapes):
                with urllib.request.urlopen(url, timeout=30) as resp:
                    resp.read()
                if i in (9, 99) or (i + 1) % max(1, args.scrapes // 10) == 0:  # after warm-up, then every 10 %
                    samples.append({"scrapes": i + 1, **snapshot(state, pid)})
                    print(f"  after {i + 1} scrapes: exporter RSS {samples[-1]['exporter_rss_kb']} kB", flush=True)
        finally:
            cli("down", "scrape")
        report("scrapes", samples, time.monotonic() - t0, rows, args.scrapes, load)
    if args.record:
        where = record(args.record, "soak", rows, argv=argv_of(sys.argv[1:]))
        print(f"recorded: {where}")


if __name__ == "__main__":
    main()
