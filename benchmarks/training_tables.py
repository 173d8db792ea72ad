"""docs/results/training.md's benchmark tables (where a ternary exchange's time goes,
scheme costs), from benchmark results archived in
``docs/results/records/`` (``--record DIR`` of the benchmark, then ``benchmarks.archive``).

``scale_exchange``: per uplink rate, each op's median call (``benchmarks.scale_exchange``),
median [min-max] over the runs, and the ratios and the remainder of each run.
``scheme_costs``: the one-process table of ``benchmarks.schemes`` (payload and hook time per
scheme, PacTrain's pack/scatter under it); ``scheme_costs_grouped``: its table of the
schemes run in a group of ranks in two domains."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from benchmarks.archive import results_of
from benchmarks.claims_tables import RATE_NAMES, spread
from testbed.common.errors import TestbedError
from testbed.model.units import Rate

SE_COLUMNS = (("max", "scales, ring all-reduce ms"), ("max-dissemination", "scales, dissemination ms"),
              ("sum", "fp32 all-reduce ms"), ("sum-int8", "int8 all-reduce ms"), ("ternary", "ternary whole ms"))
"""benchmarks.scale_exchange's ops, in the table's order, with their headings."""


def _rate(bps: float) -> str:
    r = str(Rate(int(bps)))
    return RATE_NAMES.get(r, r)


def _one(results: list[dict], key: str) -> str:
    """An extra field of the results ("/" between differing values)."""
    return "/".join(dict.fromkeys(str(res.get(key)) for res in results))


def _load(results: list[dict]) -> str:
    """The machine's load average over the minute before the benchmark began and ended
    (``os.getloadavg``, taken once it held the machine: other work than measurements)."""
    return "".join(f" The machine's load average (1 min): {res['load_before']:.2f} when the benchmark began, "
                   f"{res['load_after']:.2f} when it ended." for res in results if {"load_before", "load_after"} <= set(res))


def scale_exchange(folder: Path) -> str:
    """One row per rate (in the order measured): per op the median call of each run in ms,
    median [min-max] over the runs; the runs' ratios of medians and ternary's remainder
    (ternary - int8 sum - dissemination)."""
    results = results_of(folder, "scale_exchange")
    rows = [m for res in results for m in res["rows"]]
    ops = [op for op, _ in SE_COLUMNS if any(m["op"] == op for m in rows)]
    derived = [("ring / dissemination", "max", "max-dissemination")] * ("max" in ops) + \
        [("int8 / fp32", "sum-int8", "sum"), ("ternary / fp32", "ternary", "sum")] * ("ternary" in ops)
    heads = [h for op, h in SE_COLUMNS if op in ops] + [h for h, _, _ in derived] + \
        ["ternary - int8 - scales ms"] * ("ternary" in ops)
    out = ["| uplinks | runs | " + " | ".join(heads) + " |", "| --- | ---: |" + " ---: |" * len(heads)]
    for bps in dict.fromkeys(m["rate_bps"] for m in rows):
        runs: dict[tuple, dict[str, float]] = {}  # (result, repeat) -> op -> median s
        for i, res in enumerate(results):
            for m in res["rows"]:
                if m["rate_bps"] == bps:
                    runs.setdefault((i, m["repeat"]), {})[m["op"]] = m["median_s"]
        cells = [spread([r[op] * 1e3 for r in runs.values() if op in r], ".2f") for op in ops]
        cells += [spread([r[a] / r[b] for r in runs.values() if a in r and b in r], ".2f") for _, a, b in derived]
        if "ternary" in ops:
            cells.append(spread([(r["ternary"] - r["sum-int8"] - r["max-dissemination"]) * 1e3
                                 for r in runs.values() if {"ternary", "sum-int8", "max-dissemination"} <= set(r)],
                                ".2f"))
        out.append(f"| {_rate(bps)} | {len(runs)} | " + " | ".join(cells) + " |")
    world = "/".join(dict.fromkeys(str(m.get("world_size")) for m in rows))
    out += ["", f"Each cell is a run's median call (ratios: of a run's medians), median [min-max] over the runs. "
                f"{world} ranks on {_one(results, 'topology')}; per op and run {_one(results, 'iters')} calls timed "
                f"after {_one(results, 'warmup')} warm-up calls; the scales are {_one(results, 'layers')} floats, the "
                f"values {_one(results, 'elements')}; at each rate the ops ran one after another, and the rates took "
                f"turns (run k of every rate before run k + 1).{_load(results)}"]
    return "\n".join(out) + "\n"


def _rows(folder: Path, part: str) -> tuple[list[dict], list[dict]]:
    """``benchmarks.schemes``' results with rows of ``part``, and those rows."""
    results = [res for res in results_of(folder, "schemes") if any(m.get("part") == part for m in res["rows"])]
    return results, [m for res in results for m in res["rows"] if m.get("part") == part]


def _part(folder: Path, part: str) -> tuple[list[dict], list[dict], dict]:
    """``benchmarks.schemes``' results with rows of ``part``, those rows, and allreduce's row."""
    results, rows = _rows(folder, part)
    base = next((m for m in rows if m["scheme"] == "allreduce"), None)
    if base is None:
        raise TestbedError(f"{folder}: no {part} allreduce row of benchmarks.schemes",
                           "python -m benchmarks.schemes --record DIR measures it")
    return results, rows, base


def scheme_costs(folder: Path) -> str:
    """Per scheme, in one process: its payload relative to allreduce's and its hook's time
    over one iteration's buckets, alone and relative to the median backward pass; then
    PacTrain's pack/scatter alone and its payload against (1 - prune ratio) x dense."""
    results, rows, base = _part(folder, "one process")
    if len(results) != 1:
        raise TestbedError(f"{folder}: {len(results)} one-process results of benchmarks.schemes",
                           "archive one --record DIR per table")
    res = results[0]
    backward = statistics.median(res["backward_s"])
    out = ["| scheme | payload / allreduce | hook ms | hook / backward |", "| --- | ---: | ---: | ---: |"]
    for m in rows:
        out.append(f"| {m['scheme']} | {m['payload_bytes'] / base['payload_bytes']:.4f} | "
                   f"{spread([h * 1e3 for h in m['hook_s']], '.1f')} | {spread([h / backward for h in m['hook_s']])} |")
    pactrain = next(m for m in rows if m["scheme"] == "pactrain 0.5 exact")
    keep = 1 - res["prune_ratio"]
    above = pactrain["payload_bytes"] / base["payload_bytes"] / keep - 1
    reps = len(rows[0]["hook_s"])
    out += ["", f"{res['model']}, batch {res['batch_size']}, one process ({res['device']}, torch {res['torch']}); "
                f"each hook timed {reps} times after {res['warmup']} warm-up iterations of every scheme, median "
                f"[min-max]; hook / backward against the median backward pass, {backward * 1e3:.0f} ms "
                f"[{min(res['backward_s']) * 1e3:.0f}-{max(res['backward_s']) * 1e3:.0f}] "
                f"({len(res['backward_s'])} passes, the last two of each scheme's warm-up).{_load(results)}",
            "",
            f"PacTrain's pack/scatter alone: {spread([t * 1e3 for t in res['pack_s']], '.1f')} ms per iteration over "
            f"its {res['buckets']} buckets, {statistics.median(res['pack_s']) / backward:.3f} of backward (target "
            f"<= 0.05). Its payload is {above:.2%} {'above' if above >= 0 else 'below'} (1 - {res['prune_ratio']:g}) "
            f"x dense (target <= 1 %): biases and batch-norm parameters are not pruned, so {res['kept_fraction']:.4f} "
            f"of the parameters are kept."]
    return "\n".join(out) + "\n"


def scheme_costs_grouped(folder: Path) -> str:
    """Per scheme, in a group of ranks in two domains: payload per rank and what crosses
    domains relative to allreduce's payload, the iteration (each the slowest rank's), median
    [min-max] over the timed ones, relative to allreduce's median, and SparDL's messages."""
    results, rows, base = _part(folder, "grouped")
    ranks = "/".join(dict.fromkeys(str(m["ranks"]) for m in rows))
    base_t = statistics.median(base["iter_s"])
    out = [f"| scheme ({ranks} ranks) | payload per rank / allreduce | between domains / allreduce | iteration ms | "
           "iteration / allreduce | messages per rank |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for m in rows:
        between = "-" if m.get("between_bytes") is None else f"{m['between_bytes'] / base['payload_bytes']:.4f}"
        messages = "-" if m.get("messages") is None else f"{m['messages']:.0f}"
        out.append(f"| {m['scheme']} | {m['payload_bytes'] / base['payload_bytes']:.4f} | {between} | "
                   f"{spread([t * 1e3 for t in m['iter_s']], '.0f')} | {statistics.median(m['iter_s']) / base_t:.3f} | "
                   f"{messages} |")
    reps = "/".join(dict.fromkeys(str(len(m["iter_s"])) for m in rows))
    out += ["", f"{_one(results, 'model')}, batch {_one(results, 'batch_size')} per rank, {ranks} gloo processes on "
                f"this machine, 1 thread each, in two domains; {reps} iterations per scheme timed after "
                f"{_one(results, 'warmup')} warm-up ones, each lasting until its slowest rank is done; median "
                "[min-max]. Between domains: what the leaders hand to the leaders' all-reduce (SparDL: what all "
                "ranks send to other domains), summed over ranks; \"-\" where a flat collective's share is gloo's "
                "choice, measured on the wire by `testbed run` instead. Messages: rank 0's per iteration."
                + _load(results)]
    return "\n".join(out) + "\n"


def spardl_buckets(folder: Path) -> str:
    """SparDL per DDP bucket against once over the whole model, on the same gradients
    (``benchmarks.schemes --spardl-buckets``, :mod:`benchmarks.spardl_buckets`)."""
    results, rows = _rows(folder, "spardl buckets")
    if len(results) != 1:
        raise TestbedError(f"{folder}: {len(results)} results of benchmarks.schemes with SparDL's per-bucket rows",
                           "python -m benchmarks.schemes --grouped-only --spardl-buckets --record DIR measures one")
    out = ["| | buckets | k per block | <result, dense> / \\|dense\\|^2 | \\|result - dense\\| / \\|dense\\| | "
           "messages per rank |", "|---|---|---|---|---|---|"]
    for m in rows:
        out.append(f"| {m['scheme']} | {m['buckets']} | {', '.join(map(str, m['k']))} | {m['kept']:.3f} | "
                   f"{m['error']:.3f} | {m['messages']} |")
    m = rows[0]
    out += ["", f"{_one(results, 'model')} ({m['entries']} entries), density {m['density']:g}, {m['ranks']} ranks in "
                f"d = {m['teams']} teams, one run; messages: rank 0's. The {m['oracle_k']} largest entries of the "
                f"dense average hold {m['oracle_kept']:.3f} of its squared norm." + _load(results)]
    return "\n".join(out) + "\n"


GENERATORS: dict[str, Callable[[Path], str]] = {
    "scale_exchange": scale_exchange,
    "scheme_costs": scheme_costs,
    "scheme_costs_grouped": scheme_costs_grouped,
    "spardl_buckets": spardl_buckets,
}
"""This module's tables for ``benchmarks.regenerate``: name -> function(records folder) -> markdown."""
