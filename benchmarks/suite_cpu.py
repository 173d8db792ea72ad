"""Where the test suite's CPU goes: wall and machine CPU time of every test, summed per file.

    flock /tmp/kernel.lock python -m pytest -q -p benchmarks.suite_cpu tests/kernel    # as a plugin
    python -m benchmarks.suite_cpu [FILE] [--top 20] [--json]                          # the summary

As a pytest plugin (``-p benchmarks.suite_cpu``) it appends one JSON line per test to
``$SUITE_CPU_OUT`` (default ``suite-cpu.jsonl`` in the current directory; a new session
removes it first): the test's id,
its wall time and the CPU time the whole machine spent meanwhile (user, nice, system, irq,
softirq and steal from ``/proc/stat``), setup and teardown included. Machine-wide on
purpose: a kernel test's work is mostly in processes it does not wait for (dockerd, QEMU,
the ranks forked from a zygote, sshd), which ``getrusage`` cannot see. So the figures hold
only for tests run one at a time with nothing else on the machine: one pytest process, not
``-n``, the kernel lock held.

The summary prints the tests and the files that took the most CPU, with CPU / wall (how
many CPUs a test kept busy: about 1 or more is work; well under 1 is waiting), and the
totals: what the suite's length is made of on a machine of N CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

OUT_ENV = "SUITE_CPU_OUT"
_started: dict[str, tuple[float, float]] = {}


def busy_s() -> float:
    """CPU seconds the machine has spent busy since boot (every CPU summed)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _out() -> str:
    return os.environ.get(OUT_ENV, "suite-cpu.jsonl")


def pytest_sessionstart(session):
    """A new session starts the file afresh: rows of an earlier run would be summed in."""
    if not hasattr(session.config, "workerinput"):  # the controller, or a plain run
        Path(_out()).unlink(missing_ok=True)


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = (time.monotonic(), busy_s())


def pytest_runtest_logfinish(nodeid, location):
    if nodeid not in _started:
        return
    t0, c0 = _started.pop(nodeid)
    row = {"test": nodeid, "wall_s": round(time.monotonic() - t0, 3), "cpu_s": round(busy_s() - c0, 2),
           "cpus": os.cpu_count()}  # the measuring machine's, which the summary names (not the reader's)
    with open(_out(), "a") as f:
        f.write(json.dumps(row) + "\n")


def summary(rows: list[dict], top: int) -> dict:
    files: dict[str, dict] = defaultdict(lambda: {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0})
    for r in rows:
        f = files[r["test"].split("::")[0]]
        f["tests"] += 1
        f["wall_s"] += r["wall_s"]
        f["cpu_s"] += r["cpu_s"]
    by_cpu = sorted(files.items(), key=lambda kv: -kv[1]["cpu_s"])
    counts = {r.get("cpus") for r in rows} - {None}  # none: rows from before the count was kept
    cpus = "/".join(str(n) for n in sorted(counts)) or "an unrecorded number of"
    return {"tests": len(rows), "wall_s": sum(r["wall_s"] for r in rows), "cpu_s": sum(r["cpu_s"] for r in rows),
            "cpus": cpus, "top_tests": sorted(rows, key=lambda r: -r["cpu_s"])[:top],
            "files": [{"file": k, **v} for k, v in by_cpu[:top]]}


def _line(cpu: float, wall: float, name: str) -> str:
    return f"{cpu:8.1f} {wall:8.1f} {cpu / wall if wall > 0 else 0.0:8.2f}  {name}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", nargs="?", default=_out())
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    try:
        rows = [json.loads(line) for line in Path(a.file).read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {a.file}: {e}") from None
    s = summary(rows, a.top)
    if a.json:
        print(json.dumps(s, indent=1))
        return
    print(f"{s['tests']} tests: {s['wall_s'] / 60:.1f} min wall, {s['cpu_s'] / 60:.1f} min of CPU "
          f"({s['cpu_s'] / s['wall_s'] if s['wall_s'] else 0:.2f} of {s['cpus']} CPUs busy on average)")
    print(f"\n{'CPU s':>8} {'wall s':>8} {'CPU/wall':>8}  file")
    for f in s["files"]:
        print(_line(f["cpu_s"], f["wall_s"], f"{f['file']} ({f['tests']} tests)"))
    print(f"\n{'CPU s':>8} {'wall s':>8} {'CPU/wall':>8}  test")
    for r in s["top_tests"]:
        print(_line(r["cpu_s"], r["wall_s"], r["test"]))


if __name__ == "__main__":
    main()
