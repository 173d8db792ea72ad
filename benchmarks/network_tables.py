"""docs/results/network.md's tables, from benchmark results archived in
``docs/results/records/`` (``--record DIR`` of the benchmark, then ``benchmarks.archive``).

``link_fidelity``: per path and rate, the goodput of one TCP stream (iperf3) across the
shaped link and its ratio to the configured rate, median [min-max] over the repeats, beside
the path's capacity with the shaping out of the way (CPU-bound)."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.archive import results_of
from testbed.common.errors import TestbedError
from testbed.model.units import Rate


def _spread(values: list[float], fmt: str) -> str:
    mid = f"{statistics.median(values):{fmt}}"
    return mid if len(values) == 1 else f"{mid} [{min(values):{fmt}}-{max(values):{fmt}}]"


def link_fidelity(folder: Path) -> str:
    out = ["| path | rate | runs | goodput Mbit/s, median [min-max] | achieved / configured |",
           "| --- | ---: | ---: | ---: | ---: |"]
    notes = []
    for result in results_of(folder, "link_fidelity"):
        paths = dict.fromkeys(str(m.get("path")) for m in result["rows"])
        for path in paths:
            rows = [m for m in result["rows"] if str(m.get("path")) == path]
            for bps in sorted({m["rate_bps"] for m in rows}):
                got = [m["goodput_bps"] for m in rows if m["rate_bps"] == bps]
                out.append(f"| {path} | {Rate(bps)} | {len(got)} | {_spread([g / 1e6 for g in got], '.1f')} | "
                           f"{_spread([g / bps for g in got], '.3f')} |")
            cap = (result.get("capacity_bps") or {}).get(path)
            if cap:
                notes.append(f"{path}: {cap / 1e6:.0f} Mbit/s")
        seconds = result.get("seconds")
    out += ["", f"One TCP stream for {seconds:g} s after a 1 s warm-up per measurement, the rates taking turns. "
                "The path's capacity with the shaping at 400 Gbit/s (CPU-bound, one measurement): "
                + "; ".join(notes) + "."]
    return "\n".join(out) + "\n"


CC_NAMES = {"reno": "Reno (shipped topologies)", "bbr": "BBR", "cubic": "Cubic"}


def collective_efficiency(folder: Path) -> str:
    """Per congestion control: the dense all-reduce's payload goodput over the link rate
    (mean and best call of each run; median [min-max] over runs) beside iperf3 --bidir's two
    directions on the same link."""
    out = ["| workers' TCP | runs | payload goodput / rate, mean call | best call | iperf3 `--bidir` on the same "
           "link, each direction |", "| --- | ---: | ---: | ---: | --- |"]
    for result in results_of(folder, "collective_efficiency"):
        rows = result["rows"]
        for cc in dict.fromkeys(str(m.get("cc")) for m in rows):
            ms = [m for m in rows if str(m.get("cc")) == cc]
            mean = [m["payload"] * 8 / m["mean"] / m["rate_bps"] for m in ms]
            best = [m["payload"] * 8 / m["best"] / m["rate_bps"] for m in ms]
            tcp = "; ".join(f"{a:.3f} / {b:.3f}" for a, b in (m["tcp"] for m in ms))
            host = " (this host's default)" if any(m.get("asked") == "host" for m in ms) else ""
            out.append(f"| {CC_NAMES.get(cc, cc)}{host} | {len(ms)} | {_spread(mean, '.3f')} | "
                       f"{_spread(best, '.3f')} | {tcp} |")
        rate = Rate(int(rows[0]["rate_bps"])) if rows else "?"
        out += ["", f"A {result.get('bytes', 0) / 1e6:g} MB float32 all-reduce between 2 ranks across a dumbbell "
                    f"capped at {rate}, {result.get('iters')} calls a run after a warm-up, launched by "
                    "`testbed run`'s machinery; the one-way TCP ceiling is 0.956."]
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
        out.append(f"| {n} | {len(ms)} | " + " | ".join(_spread([m[k] for m in ms], ".3f") for k in (a, b))
                   + f" | {up:.2f} | " + " | ".join(_spread([m[k] for m in ms], ".3f") for k in (c, d))
                   + f" | {dn:.2f} |")
    if not rows:
        raise TestbedError(f"{folder}: no {kind} rows of benchmarks.up_down", "run it with that row's sizes")
    return "\n".join(out) + "\n"
