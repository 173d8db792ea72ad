"""docs/results/cli.md's tables (the command's start, a run refused before any work,
ranks forked from a zygote), from benchmark results archived in
``docs/results/records/`` (``--record DIR`` of the benchmark, then ``benchmarks.archive``).

``cli_start`` and ``run_checks`` compare trees timed taking turns in one run: tree 0 is the
checkout the benchmark ran from (after), the others older commits unpacked beside it
(before); each cell is the median [min-max] over the repeats and the ratio is of medians.
``rank_start`` and ``rank_start_memory`` compare runs with the zygote and without."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from benchmarks.archive import results_of
from benchmarks.claims_tables import spread
from testbed.common.errors import TestbedError

CLI_ROWS = {
    "--version": "`testbed --version`",
    "--help": "`testbed --help`",
    "status": "`testbed status`",
    "up": "`testbed up {topology}`",
    "down": "`testbed down {topology}`",
    "rank start": "a rank's start (`nodes.nsexec` to exec)",
    "library up": "library `Testbed.up`",
    "library down": "library `down`",
}
"""cli_start's row names, as the table shows them (in this order; others after them)."""


def _one(folder: Path, benchmark: str) -> dict:
    """The one result of ``benchmark`` in ``folder``: a before/after table compares the trees
    of one run, which taking turns made comparable (two runs' trees were not)."""
    results = results_of(folder, benchmark)
    if len(results) != 1:
        raise TestbedError(f"{folder}: {len(results)} {benchmark} results, not one",
                           "archive one run's --record per records folder")
    return results[0]


def _tree_name(tree: dict) -> str:
    """A tree's heading: its commit, and for the checkout with changes beside it how many."""
    changed = tree.get("uncommitted") or []
    return f"{tree['commit']}" + (f" + {len(changed)} uncommitted files" if changed else "")


def _trees(res: dict, folder: Path) -> tuple[dict, list[dict]]:
    """(the checkout the benchmark ran from, the trees compared with it)."""
    trees = {t["tree"]: t for t in res["trees"]}
    if 0 not in trees or len(trees) < 2:
        raise TestbedError(f"{folder}: a before/after table needs this tree and another",
                           f"python -m benchmarks.{res['benchmark']} --tree DIR --tree-commit COMMIT --record DIR")
    return trees[0], [t for i, t in sorted(trees.items()) if i]


def _uncommitted(after: dict) -> str:
    """What the checkout's uncommitted files were, in one sentence."""
    changed = after.get("uncommitted") or []
    if not changed:
        return f"{after['commit']} had no uncommitted changes."
    code = [f for f in changed if f.split("/")[0] in ("testbed", "workloads", "collectors")]
    return (f"{after['commit']}'s working tree had {len(changed)} uncommitted files, "
            + (f"{len(code)} of them the package's code ({', '.join(code)})." if code else
               "none of them under `testbed/`, `workloads/` or `collectors/` (other benchmarks' and pages' work).")
            )


def _ms(values: list[float]) -> str:
    return spread([v * 1e3 for v in values], ".0f")


def cli_start(folder: Path) -> str:
    """Per command: each tree's ms, after / before, issue 44's target and whether the after
    median meets it (median <= target)."""
    res = _one(folder, "cli_start")
    after, before = _trees(res, folder)
    times: dict[tuple[int, str], list[float]] = {}
    for m in res["rows"]:
        times.setdefault((m["tree"], m["row"]), []).append(m["s"])
    rows = [r for r in CLI_ROWS if (0, r) in times] + sorted({r for t, r in times if t == 0} - set(CLI_ROWS))
    targets = res.get("targets_s") or {}
    topology = res.get("topology", "")
    out = ["| ms, median [min-max] | " + " | ".join(f"before ({_tree_name(t)})" for t in before)
           + f" | after ({_tree_name(after)}) | after / before | target (issue 44) | met |",
           "| --- |" + " ---: |" * (len(before) + 3) + " --- |"]
    for row in rows:
        mine = times[(0, row)]
        old = [times.get((t["tree"], row), []) for t in before]
        ratio = f"{statistics.median(mine) / statistics.median(old[0]):.2f}" if old[0] else "-"
        target = targets.get(row)
        met = "-" if target is None else ("met" if statistics.median(mine) <= target else "not met")
        out.append(f"| {CLI_ROWS.get(row, row).format(topology=topology)} | " + " | ".join(_ms(o) for o in old)
                   + f" | {_ms(mine)} | {ratio} | {'-' if target is None else f'{target * 1e3:.0f}'} | {met} |")
    out += ["", f"{res.get('runs')} runs, the trees taking turns in each; {res.get('cpus')} CPUs, "
            f"{'as root' if res.get('root') else 'not root'}. A target is met when the after median is at or "
            f"under it. {_uncommitted(after)} {_imports(res, after, before)}"]
    return "\n".join(out) + "\n"


def _imports(res: dict, after: dict, before: list[dict]) -> str:
    """What each tree's ``import MODULE`` imported of the heavy packages."""
    heavy = ", ".join(res.get("heavy") or [])
    out = []
    for module, per_tree in (res.get("imports") or {}).items():
        got = {t["tree"]: per_tree[t["tree"]] for t in (after, *before) if t["tree"] < len(per_tree)}
        out.append(f"`import {module}` imports {', '.join(got[0]) or 'none of them'} after"
                   + "".join(f" and {', '.join(got[t['tree']]) or 'none of them'} before ({t['commit']})"
                             for t in before if t["tree"] in got))
    return f"Of {heavy}: " + "; ".join(out) + "." if out else ""


def run_checks(folder: Path) -> str:
    """Per case: the seconds each tree took to refuse ``--testbed nosuch``, after / before."""
    res = _one(folder, "run_checks")
    after, before = _trees(res, folder)
    times: dict[tuple[int, str], list[float]] = {}
    for m in res["rows"]:
        times.setdefault((m["tree"], m["case"]), []).append(m["s"])
    cases = list(dict.fromkeys(m["case"] for m in res["rows"]))
    out = ["| refusal of `--testbed nosuch`, s, median [min-max] | "
           + " | ".join(f"before ({_tree_name(t)})" for t in before) + f" | after ({_tree_name(after)}) | "
           "after / before |", "| --- |" + " ---: |" * (len(before) + 2)]
    for case in cases:
        mine = times.get((0, case), [])
        old = [times.get((t["tree"], case), []) for t in before]
        ratio = f"{statistics.median(mine) / statistics.median(old[0]):.2f}" if mine and old[0] else "-"
        out.append(f"| {case} | " + " | ".join(spread(o, ".2f") for o in old) + f" | {spread(mine, '.2f')} | "
                   f"{ratio} |")
    out += ["", f"{res.get('runs')} runs, the trees taking turns in each; {res.get('cpus')} CPUs. "
            f"{_uncommitted(after)}"]
    return "\n".join(out) + "\n"


def _rank_runs(folder: Path) -> tuple[dict, dict[tuple[int, bool], list[dict]]]:
    res = _one(folder, "rank_start")
    runs: dict[tuple[int, bool], list[dict]] = {}
    for m in res["rows"]:
        runs.setdefault((m["ranks"], bool(m["zygote"])), []).append(m)
    if not runs:
        raise TestbedError(f"{folder}: no runs in rank_start's result", "python -m benchmarks.rank_start --record DIR")
    return res, runs


def _med(runs: list[dict], key: str) -> float | None:
    vs = [m[key] for m in runs if m.get(key) is not None]
    return statistics.median(vs) if vs else None


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def rank_start(folder: Path) -> str:
    """Per rank count: wall and CPU seconds of the run with the zygote and without, median
    [min-max] over the repeats, and the ratio of the medians (zygote / without)."""
    res, runs = _rank_runs(folder)
    out = ["| ranks | runs each | wall s, zygote | wall s, without | ratio | CPU s, zygote | CPU s, without | ratio |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted({n for n, _ in runs}):
        z, p = runs.get((n, True), []), runs.get((n, False), [])
        cells = []
        for key in ("wall_s", "cpu_s"):
            cells += [spread([m[key] for m in z], ".1f"), spread([m[key] for m in p], ".1f"),
                      _ratio(_med(z, key), _med(p, key))]
        out.append(f"| {n} | {min(len(z), len(p))} | " + " | ".join(cells) + " |")
    statuses = sorted({str(m.get("status")) for rs in runs.values() for m in rs})
    out += ["", f"`testbed run {res.get('scheme')} --compute-time {res.get('compute_time')} --max-iters "
            f"{res.get('iters')} --no-exporter` on a testbed already up; {res.get('cpus')} CPUs; runs' status: "
            f"{', '.join(statuses)}."]
    return "\n".join(out) + "\n"


def rank_start_memory(folder: Path) -> str:
    """Per rank count: the runs' peak RSS of a rank and the sum of the ranks' proportional set
    sizes, MB, with the zygote and without (median [min-max]), and the ratio of the medians."""
    _, runs = _rank_runs(folder)
    out = ["| ranks | RSS per rank MB, zygote | without | ratio | PSS all ranks MB, zygote | without | ratio |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted({n for n, _ in runs}):
        z, p = runs.get((n, True), []), runs.get((n, False), [])
        cells = []
        for key in ("max_rss_bytes_per_rank", "pss_bytes_all_ranks"):
            cells += [spread([m.get(key) and m[key] / 1e6 for m in z], ".0f"),
                      spread([m.get(key) and m[key] / 1e6 for m in p], ".0f"), _ratio(_med(z, key), _med(p, key))]
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


GENERATORS: dict[str, Callable[[Path], str]] = {
    "cli_start": cli_start,
    "run_checks": run_checks,
    "rank_start": rank_start,
    "rank_start_memory": rank_start_memory,
}
"""This module's tables for ``benchmarks.regenerate``: name -> function(records folder) -> markdown."""
