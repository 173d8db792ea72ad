"""docs/results/proof.md's tables (what the proof's counting costs, per iteration and
per call), from benchmark results archived in
``docs/results/records/`` (``--record DIR`` of the benchmark, then ``benchmarks.archive``).

``benchmarks.proof_overhead --record DIR`` writes one row per training run (``kind``
"train": scheme, pair, counting on or off, rank 0's median ``iter_s``, and for the on-runs
the calls an iteration makes) and one row per round of the per-call benchmark (``kind``
"call": op, clock, round, and the on, off and default figures in µs). The tables are
computed here, once, for the benchmark's own printout and for the page.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from benchmarks.archive import results_of
from benchmarks.claims_tables import spread
from testbed.common.errors import TestbedError

BENCHMARK = "proof_overhead"
CALLS = (("all_reduce", "all_reduce of 1 float"), ("isend", "isend+irecv message"))
CLOCKS = ("wall", "thread")
SETTINGS = ("off", "default", "on")


def per_call(rows: list[dict]) -> list[dict]:
    """Per call and clock: the settings' medians over the rounds, on - off within a round
    (median, min, max over the rounds) and on - default's median, in µs."""
    out = []
    for op, what in CALLS:
        for clock in CLOCKS:
            rounds = [r for r in rows if r.get("kind") == "call" and r["op"] == op and r["clock"] == clock]
            if not rounds:
                continue
            added = [r["on"] - r["off"] for r in rounds]
            out.append({"op": op, "call": what, "clock": clock, "rounds": len(rounds),
                        **{s: statistics.median(r[s] for r in rounds) for s in SETTINGS},
                        "added": statistics.median(added), "added_min": min(added), "added_max": max(added),
                        "vs_default": statistics.median(r["on"] - r["default"] for r in rounds)})
    return out


def per_iteration(rows: list[dict]) -> list[dict]:
    """Per scheme: the on/off ratio of each pair (median, min, max), the runs' median iteration
    (off and on, with their min and max), the calls an on-run's iteration makes, and the
    counting's expected share of an iteration: the per-call benchmark's added thread CPU
    times those calls over the off median (None without per-call rows)."""
    added = {r["op"]: r["added"] for r in per_call(rows) if r["clock"] == "thread"}
    train = [r for r in rows if r.get("kind") == "train"]
    out = []
    for scheme in dict.fromkeys(r["scheme"] for r in train):
        mine = [r for r in train if r["scheme"] == scheme]
        on = {_pair(r): r for r in mine if r["on"]}
        off = {_pair(r): r for r in mine if not r["on"]}
        pairs = sorted(set(on) & set(off))
        if not pairs:
            raise TestbedError(f"{scheme}: no pair with both an on-run and an off-run",
                               "run benchmarks.proof_overhead with --pairs 1 or more")
        ratios = [on[p]["iter_s"] / off[p]["iter_s"] for p in pairs]
        t_off = statistics.median(r["iter_s"] for r in off.values())
        coll = statistics.median(r["recorded_per_iter"] for r in on.values())
        isends = statistics.median(r["isends_per_iter"] for r in on.values())
        expected = ((coll * added["all_reduce"] + isends * added["isend"]) * 1e-6 / t_off
                    if {"all_reduce", "isend"} <= set(added) else None)
        out.append({"scheme": scheme, "pairs": len(pairs), "ratio": statistics.median(ratios),
                    "ratio_min": min(ratios), "ratio_max": max(ratios), "off_s": [r["iter_s"] for r in off.values()],
                    "on_s": [r["iter_s"] for r in on.values()], "collectives_per_iter": coll,
                    "isends_per_iter": isends, "expected": expected,
                    "uncounted": sum(r.get("uncounted", 0) for r in on.values())})
    return out


def _pair(r: dict) -> tuple:
    return r.get("result", 0), r["pair"]


def _signed(mid: float, lo: float, hi: float) -> str:
    return f"{mid:+.1f} [{lo:+.1f} to {hi:+.1f}]"


def iteration_markdown(rows: list[dict]) -> str:
    table = per_iteration(rows)
    if not table:
        raise TestbedError("no training run in the records", "run benchmarks.proof_overhead with --pairs 1 or more")
    out = ["| scheme | pairs | off ms: median [min-max] | on ms: median [min-max] | on/off per pair: median "
           "[min-max] | recorded collectives / iteration | isends / iteration | expected |",
           "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for t in table:
        exp = f"{t['expected'] * 100:+.3f} %" if t["expected"] is not None else "-"
        out.append(f"| {t['scheme']} | {t['pairs']} | {spread([x * 1e3 for x in t['off_s']], '.1f')} | "
                   f"{spread([x * 1e3 for x in t['on_s']], '.1f')} | "
                   f"{t['ratio']:.3f} [{t['ratio_min']:.3f}-{t['ratio_max']:.3f}] | "
                   f"{t['collectives_per_iter']:g} | {t['isends_per_iter']:g} | {exp} |")
    return "\n".join(out) + "\n"


def call_markdown(rows: list[dict]) -> str:
    table = per_call(rows)
    if not table:
        raise TestbedError("no per-call round in the records",
                           "run benchmarks.proof_overhead with --micro-rounds 1 or more")
    out = ["| call | clock | off µs | default µs | on µs | added µs (on - off): median [min-max] | on - default µs |",
           "| --- | --- | ---: | ---: | ---: | --- | ---: |"]
    for t in table:
        out.append(f"| {t['call'] if t['clock'] == CLOCKS[0] else ''} | {t['clock']} | {t['off']:.1f} | "
                   f"{t['default']:.1f} | {t['on']:.1f} | {_signed(t['added'], t['added_min'], t['added_max'])} | "
                   f"{t['vs_default']:+.1f} |")
    return "\n".join(out) + "\n"


NEEDS = {"train": ("scheme", "pair", "on", "iter_s"), "call": ("op", "clock", *SETTINGS)}
NEEDS_ON = ("recorded_per_iter", "isends_per_iter")


def check(rows: list[dict]) -> list[dict]:
    """``rows``, or a one-line error naming the first row without a field its table needs."""
    for i, r in enumerate(rows):
        need = NEEDS.get(str(r.get("kind"))) if isinstance(r, dict) else None
        if need is None:
            raise TestbedError(f"row {i}: kind is not one of {', '.join(NEEDS)}",
                               "records of benchmarks.proof_overhead --record")
        need += NEEDS_ON if r["kind"] == "train" and r.get("on") else ()
        missing = [k for k in need if k not in r]
        if missing:
            raise TestbedError(f"row {i} ({r['kind']}): no {', '.join(missing)}",
                               "records of benchmarks.proof_overhead --record")
    return rows


def _rows(folder: Path) -> tuple[list[dict], list[dict]]:
    """The archived results of benchmarks.proof_overhead and their rows, each tagged with
    its result's index (pairs are numbered per result)."""
    results = results_of(folder, BENCHMARK)
    check([r for res in results for r in res["rows"]])
    return results, [{**r, "result": i} for i, res in enumerate(results) for r in res["rows"]]


def _each(results: list[dict], key: str) -> str:
    return "/".join(dict.fromkeys(str(res.get(key)) for res in results))


def iteration_table(folder: Path) -> str:
    """The page's "Per iteration" table and a line saying how its runs were made."""
    results, rows = _rows(folder)
    how = ("a pair's two runs at the same time" if all(res.get("together") for res in results) else
           "one run at a time, the order alternating")
    uncounted = sum(t["uncounted"] for t in per_iteration(rows))
    return (iteration_markdown(rows) + f"\n{_each(results, 'ranks')} ranks of `workloads.train` (CNN on digits, "
            f"{_each(results, 'max_iters')} iterations) per run, {how}; a run's figure is rank 0's median `iter_s` "
            f"without the first {_each(results, 'skip')} iterations. Entries the counting missed: {uncounted}.\n")


def call_table(folder: Path) -> str:
    """The page's "Per call" table and a line with what the recorders held at the end."""
    results, rows = _rows(folder)
    held = "; ".join(", ".join(f"{s} {n}" for s, n in (res.get("recorded") or {}).items()) for res in results)
    return (call_markdown(rows) + f"\n{_each(results, 'micro_rounds')} rounds of {_each(results, 'micro_calls')} "
            f"calls per setting; recorder entries at the end (rank 0): {held}; isends the wrapper counted (on): "
            f"{_each(results, 'isends_counted')}.\n")


GENERATORS: dict[str, Callable[[Path], str]] = {
    "proof_per_iteration": iteration_table,
    "proof_per_call": call_table,
}
"""This module's tables for ``benchmarks.regenerate``: name -> function(records folder) -> markdown."""
