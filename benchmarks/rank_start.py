"""Rank start-up with and without the run's zygote (testbed.nodes.zygote.launcher): wall and CPU time
of short ``testbed run`` commands whose cost is mostly their ranks' start.

    sudo python -m benchmarks.rank_start [--ranks 8,16] [--repeats 2] [--iters 3]
                                         [--compute-time 0.05] [--json] [--record DIR]

For each rank count N, a testbed of N workers on two leaf switches (the leaves' uplinks are
the bottleneck the proof needs) is brought up once; then ``testbed run allreduce -t NAME
--compute-time C --max-iters I --no-exporter --json`` runs ``--repeats`` times with the
zygote and as many without (``TESTBED_ZYGOTE=0``), taking turns so that both see the same
load. Each run's wall time, and its CPU time (user + system of the command and of every
process it waited for: the ranks, their clients, the zygote, from wait4), are printed as
medians with the ratio with / without, and the summaries' peak memory fields
(``max_rss_bytes_per_rank``; ``pss_bytes_all_ranks``: with the zygote, the pages it
imported are shared by the ranks, so the sum of proportional sizes drops). ``--record DIR``
writes every run (ranks, zygote or not, repeat, wall, CPU and the two memory fields) to
DIR/result.json for ``benchmarks.archive`` (docs/results/cli.md's tables:
``benchmarks.cli_tables``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.archive import record


FIELDS = ("wall_s", "cpu_s", "max_rss", "pss_all")
RECORDED = {"wall_s": "wall_s", "cpu_s": "cpu_s", "max_rss": "max_rss_bytes_per_rank",
            "pss_all": "pss_bytes_all_ranks", "status": "status"}
"""A run's fields as a record names them (the memory fields as the run's summary does)."""


def records(results: list[dict]) -> list[dict]:
    """One record row per run: ranks, zygote or not, repeat and the RECORDED fields."""
    return [{"ranks": r["ranks"], "zygote": kind == "zygote", "repeat": k,
             **{RECORDED[f]: v for f, v in run.items() if f in RECORDED}}
            for r in results for kind, runs in r["runs"].items() for k, run in enumerate(runs)]


def topology(n: int, name: str) -> dict:
    half = n // 2
    nodes = {"core": {"kind": "switch"}, "leaf0": {"kind": "switch"}, "leaf1": {"kind": "switch"}}
    nodes.update({f"w{i}": {"kind": "worker"} for i in range(n)})
    links: list[dict] = [{"endpoints": [f"w{i}", f"leaf{int(i >= half)}"]} for i in range(n)]
    links += [{"endpoints": [f"leaf{j}", "core"], "bottleneck": True} for j in (0, 1)]
    return {"name": name, "defaults": {"link": {"rate": "1gbit"}}, "nodes": nodes, "links": links}


def testbed(*args: str) -> list[str]:
    return [sys.executable, "-m", "testbed.cli", *args]


def timed(cmd: list[str], env: dict) -> tuple[float, float, dict]:
    """(wall s, CPU s of the command and what it waited for, its JSON summary)."""
    with tempfile.TemporaryFile() as out:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {p.returncode}): {text[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, json.loads(text)


def measure(n: int, repeats: int, iters: int, compute: float, out: Path) -> dict:
    name = f"rstart{n}"
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topology(n, name)))
    subprocess.run(testbed("up", str(path), "--no-exporter", "--json"), check=True, stdout=subprocess.DEVNULL)
    rows: dict[str, list] = {"zygote": [], "plain": []}
    try:
        for _ in range(repeats):
            for kind in ("zygote", "plain"):
                env = {**os.environ, "TESTBED_ZYGOTE": "1" if kind == "zygote" else "0"}
                wall, cpu, s = timed(testbed("run", "allreduce", "-t", name, "--compute-time", str(compute),
                                             "--max-iters", str(iters), "--out", str(out / "runs"),
                                             "--no-exporter", "--json"), env)
                used = (Path(s["run_dir"]) / "zygote.log").exists()
                assert used == (kind == "zygote"), f"{kind} run {s['run_dir']}: zygote used: {used}"
                rows[kind].append({"wall_s": wall, "cpu_s": cpu, "max_rss": s.get("max_rss_bytes_per_rank"),
                                   "pss_all": s.get("pss_bytes_all_ranks"), "status": s.get("status")})
                print(f"  {n} ranks, {kind}: wall {wall:.1f} s, CPU {cpu:.1f} s", flush=True)
    finally:
        subprocess.run(testbed("down", name), stdout=subprocess.DEVNULL)
    med = {k: {f: statistics.median(r[f] for r in v if r[f] is not None) for f in FIELDS} for k, v in rows.items()}
    return {"ranks": n, "runs": rows, "median": med,
            "wall_ratio": med["zygote"]["wall_s"] / med["plain"]["wall_s"],
            "cpu_ratio": med["zygote"]["cpu_s"] / med["plain"]["cpu_s"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="8,16")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--compute-time", type=float, default=0.05)
    p.add_argument("--json", action="store_true")
    p.add_argument("--record", type=Path, metavar="DIR", help="write every run to DIR/result.json")
    a = p.parse_args(argv)
    counts = [int(x) for x in a.ranks.split(",") if x.strip()]
    if any(c < 2 or c % 2 for c in counts):
        raise SystemExit("--ranks: even counts of at least 2")
    if a.repeats < 1:
        raise SystemExit("--repeats: at least 1")
    with tempfile.TemporaryDirectory(prefix="rank_start-") as d:
        results = [measure(n, a.repeats, a.iters, a.compute_time, Path(d)) for n in counts]
    if a.record:
        print("recorded:", record(a.record, "rank_start", records(results), scheme="allreduce", iters=a.iters,
                                  compute_time=a.compute_time, repeats=a.repeats, cpus=os.cpu_count()),
              file=sys.stderr if a.json else sys.stdout)
    if a.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"\n{a.repeats} run(s) each, medians; allreduce, --compute-time {a.compute_time}, --max-iters {a.iters}")
    print(f"{'ranks':>5} {'wall s zygote':>14} {'plain':>7} {'ratio':>6} {'CPU s zygote':>13} {'plain':>7} "
          f"{'ratio':>6} {'RSS/rank MB z/p':>16} {'PSS all MB z/p':>15}")
    for r in results:
        z, q = r["median"]["zygote"], r["median"]["plain"]
        print(f"{r['ranks']:>5} {z['wall_s']:>14.1f} {q['wall_s']:>7.1f} {r['wall_ratio']:>6.2f} {z['cpu_s']:>13.1f} "
              f"{q['cpu_s']:>7.1f} {r['cpu_ratio']:>6.2f} {z['max_rss'] / 1e6:>8.0f}/{q['max_rss'] / 1e6:<7.0f} "
              f"{z['pss_all'] / 1e6:>7.0f}/{q['pss_all'] / 1e6:<7.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
