"""docs/results/network.md's tables, from benchmark results archived in
``docs/results/records/`` (``--record DIR`` of the benchmark, then ``benchmarks.archive``).

``link_fidelity``: per path and rate, the goodput of one TCP stream (iperf3) across the
shaped link and its ratio to the configured rate, median [min-max] over the repeats, beside
the path's capacity with the shaping out of the way (CPU-bound)."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.archive import results_of, runs_of
from benchmarks.claims_tables import spread
from testbed.common.errors import TestbedError
from testbed.model.units import Rate


def link_fidelity(folder: Path) -> str:
    results = results_of(folder, "link_fidelity")
    rows = [m for res in results for m in res["rows"]]
    out = ["| path | rate | runs | goodput Mbit/s, median [min-max] | achieved / configured |",
           "| --- | ---: | ---: | ---: | ---: |"]
    for path in dict.fromkeys(str(m.get("path")) for m in rows):
        mine = [m for m in rows if str(m.get("path")) == path]
        for bps in sorted({m["rate_bps"] for m in mine}):
            got = [m["goodput_bps"] for m in mine if m["rate_bps"] == bps]
            out.append(f"| {path} | {Rate(bps)} | {len(got)} | {spread([g / 1e6 for g in got], '.1f')} | "
                       f"{spread([g / bps for g in got], '.3f')} |")
    caps = "; ".join(f"{path}: {cap / 1e6:.0f} Mbit/s" for res in results
                     for path, cap in (res.get("capacity_bps") or {}).items())
    seconds = "/".join(sorted({f"{res.get('seconds'):g}" for res in results}))
    least = "/".join(sorted({f"{res['min_bits'] / 1e6:g}" for res in results if res.get("min_bits")}))
    longer = f", and at least long enough to carry {least} Mbit at the rate" if least else ""
    out += ["", f"One TCP stream for {seconds} s{longer} after a 1 s warm-up per measurement, the rates taking turns. "
                f"The path's capacity with the shaping at 400 Gbit/s (CPU-bound, one measurement a run): {caps}."]
    return "\n".join(out) + "\n"


CC_NAMES = {"reno": "Reno (shipped topologies)", "bbr": "BBR", "cubic": "Cubic"}


def collective_efficiency(folder: Path) -> str:
    """Per congestion control: the dense all-reduce's payload goodput over the link rate
    (mean and best call of each run; median [min-max] over runs) beside iperf3 --bidir's two
    directions on the same link."""
    results = results_of(folder, "collective_efficiency")
    rows = [m for res in results for m in res["rows"]]
    out = ["| workers' TCP | runs | payload goodput / rate, mean call | best call | iperf3 `--bidir` on the same "
           "link, each direction |", "| --- | ---: | ---: | ---: | --- |"]
    for cc in dict.fromkeys(str(m.get("cc")) for m in rows):
        ms = [m for m in rows if str(m.get("cc")) == cc]
        mean = [m["payload"] * 8 / m["mean"] / m["rate_bps"] for m in ms]
        best = [m["payload"] * 8 / m["best"] / m["rate_bps"] for m in ms]
        tcp = "; ".join(f"{a:.3f} / {b:.3f}" for a, b in (m["tcp"] for m in ms))
        host = " (this host's default)" if any(m.get("asked") == "host" for m in ms) else ""
        out.append(f"| {CC_NAMES.get(cc, cc)}{host} | {len(ms)} | {spread(mean, '.3f')} | {spread(best, '.3f')} | "
                   f"{tcp} |")
    sizes = "/".join(sorted({f"{res.get('bytes', 0) / 1e6:g}" for res in results}))
    rates = "/".join(sorted({str(Rate(int(m["rate_bps"]))) for m in rows}))
    iters = "/".join(sorted({str(res.get("iters")) for res in results}))
    out += ["", f"A {sizes} MB float32 all-reduce between 2 ranks across a dumbbell capped at {rates}, {iters} calls "
                "a run after a warm-up, launched by `testbed run`'s machinery; the one-way TCP ceiling is 0.956."]
    return "\n".join(out) + "\n"


UP_DOWN = {
    "star": ("workers", ("up_s", "up (s)"), ("floor_up_s", "floor up (s)"), ("down_s", "down (s)"),
             ("floor_down_s", "floor down (s)")),
    "docker": ("containers", ("up_s", "up (s)"), ("floor_up_s", "SDK alone (s)"), ("down_s", "down (s)"),
               ("floor_down_s", "SDK remove (s)")),
    "rootless": ("workers", ("root_up_s", "root up (s)"), ("user_up_s", "user up (s)"),
                 ("root_down_s", "root down (s)"), ("user_down_s", "user down (s)")),
}
"""Per kind of ``benchmarks.up_down`` row: the size's name and (key, heading) of the two pairs
whose ratio the table gives: (ours, reference) for star and docker, (root, user) for rootless."""


def up_down(folder: Path, kind: str) -> str:
    """One row per size: each time median [min-max] over the repeats, and the ratio of the
    pair's medians (up / floor, user / root)."""
    size, (a, ah), (b, bh), (c, ch), (d, dh) = UP_DOWN[kind]
    flip = kind == "rootless"  # the ratio is user / root: second over first
    ref = {"star": "floor", "docker": "SDK"}.get(kind)
    out = [f"| {size} | runs | {ah} | {bh} | {f'up / {ref}' if ref else 'user / root'} | {ch} | {dh} | "
           f"{f'down / {ref}' if ref else 'user / root'} |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = [m for res in results_of(folder, "up_down") for m in res["rows"] if m.get("kind") == kind]
    for n in sorted({m["workers"] for m in rows}):
        ms = [m for m in rows if m["workers"] == n]
        med = {k: statistics.median(m[k] for m in ms) for k in (a, b, c, d)}
        up = med[b] / med[a] if flip else med[a] / med[b]
        dn = med[d] / med[c] if flip else med[c] / med[d]
        out.append(f"| {n} | {len(ms)} | " + " | ".join(spread([m[k] for m in ms], ".3f") for k in (a, b))
                   + f" | {up:.2f} | " + " | ".join(spread([m[k] for m in ms], ".3f") for k in (c, d))
                   + f" | {dn:.2f} |")
    if not rows:
        raise TestbedError(f"{folder}: no {kind} rows of benchmarks.up_down", "run it with that row's sizes")
    return "\n".join(out) + "\n"


def up_down_vm(folder: Path) -> str:
    """VM workers (``benchmarks.up_down --vm-sizes``): `up` of N VMs booting in parallel to a
    ready agent in each guest, beside one guest kernel alone booting to its initramfs, and
    `down`; median [min-max] over the repeats."""
    rows = [m for res in results_of(folder, "up_down") for m in res["rows"] if m.get("kind") == "vm"]
    if not rows:
        raise TestbedError(f"{folder}: no vm rows of benchmarks.up_down", "run it with --vm-sizes")
    out = ["| VMs | runs | accelerator | up (s) | per VM (s) | one guest kernel alone (s) | down (s) |",
           "| ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for n in sorted({m["workers"] for m in rows}):
        ms = [m for m in rows if m["workers"] == n]
        accel = "/".join(sorted({str(m.get("accel")) for m in ms}))
        out.append(f"| {n} | {len(ms)} | {accel} | {spread([m['up_s'] for m in ms], '.1f')} | "
                   f"{spread([m['up_s'] / n for m in ms], '.1f')} | {spread([m['floor_up_s'] for m in ms], '.1f')} | "
                   f"{spread([m['down_s'] for m in ms], '.2f')} |")
    return "\n".join(out) + "\n"


def trace_run(folder: Path) -> str:
    """Runs that followed a bandwidth trace (``testbed run --bw-trace``), from their summaries:
    per rate, the iterations that ran wholly at it and their mean time; the steps applied and
    how late they came into force; the run's status and proof."""
    runs = [r.summary for r in runs_of(folder) if isinstance(r.summary.get("bw_trace"), dict)]
    if not runs:
        raise TestbedError(f"{folder}: no run with a bandwidth trace", "archive a run of testbed run --bw-trace")
    out = ["| run | rate | iterations wholly at it | mean iteration (s) |", "| --- | ---: | ---: | ---: |"]
    notes = []
    for s in runs:
        t = s["bw_trace"]
        out += [f"| {s['run_id']} | {Rate(int(x['rate_bps']))} | {x['iterations']} | {x['mean_iter_s']:.3f} |"
                for x in t["iterations_by_rate"]]
        late = t.get("late_s") or {}
        notes.append(f"{s['run_id']}: {s.get('iterations')} iterations, status {s.get('status')}, proof "
                     f"{s.get('proof')}; {t['steps_applied']} trace steps applied, in force a median "
                     f"{late.get('median', float('nan')) * 1e3:.1f} ms (at most {late.get('max', float('nan')) * 1e3:.1f}"
                     " ms) after their time.")
    return "\n".join(out + [""] + notes) + "\n"


def _gone(seconds) -> str:
    return "not within 10 s" if seconds is None else str(seconds)


def quick_start(folder: Path) -> str:
    """The README's quick start by a new user (``benchmarks.quick_start``): the install's and
    the command's seconds beside what its run recorded, one row per archived result."""
    runs = {r.summary.get("run_id"): r.summary for r in runs_of(folder)}
    out = ["| tree | install s | venv GB | torch | command s | iterations | iteration ms, median | final accuracy "
           "| bottleneck MB / iteration | status | user's processes gone after (s) |",
           "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for m in (m for res in results_of(folder, "quick_start") for m in res["rows"]):
        s = runs[m["run_id"]]
        out.append(f"| {m['tree']} | {m['install_s']:.0f} | {m['venv_bytes'] / 1e9:.2f} | {m['torch']} | "
                   f"{m['run_s']:.0f} | {s['iterations']} | {s['median_iter_s'] * 1e3:.0f} | "
                   f"{s['final_accuracy']:.4f} | {s['bottleneck']['bytes_per_iteration'] / 1e6:.2f} | {s['status']} | "
                   f"{_gone(m.get('user_processes_gone_s', '-'))} |")
    return "\n".join(out) + "\n"


GENERATORS = {
    "quick_start": quick_start,
    "up_down_vm": up_down_vm,
    "trace_run": trace_run,
    "link_fidelity": link_fidelity,
    "collective_efficiency": collective_efficiency,
    **{f"up_down_{kind}": (lambda folder, kind=kind: up_down(folder, kind)) for kind in UP_DOWN},
}
"""This module's tables for ``benchmarks.regenerate``: name -> function(records folder) -> markdown."""
