"""docs/results/claims.md's tables, from the records of ``benchmarks.claims`` (issue 41).

Each generator (registered in ``benchmarks.regenerate``) reads one records folder, picks
the sweep of its section by what the sweep ran (``section``), and writes markdown. Every
comparison is paired by repeat (``testbed.runs.reports.stats``): the median of the per-repeat
ratios (or differences) with its interval (the distribution-free 95 % one from 6 pairs, else
the min-max, marked so: it holds the median only with probability 1 - 2/2^n), the number of
pairs, and, for a paper's claim, a verdict by the rule of ``verdict``:

    not judged          fewer than 6 pairs: no interval reaches 95 %, so no verdict (the
                        row says the pairs' direction all the same)
    beyond the paper's  the whole interval lies past the paper's figure, further from "no
    figure              effect" (a larger speed-up than claimed): not "reproduced", which
                        would hide that the paper's own figure lies outside our interval
    reproduced          the interval reaches the paper's figure (holds it, or for an "up
                        to X" claim, reaches X)
    same direction      the interval lies on the paper's side of "no effect", short of its figure
    not reproduced      the interval holds "no effect" (no difference shown) or lies on the
                        other side
    one run             fewer than two pairs: no interval, no verdict

An interval that reaches infinity or 0 (a run that never held the target, ranked last)
shows a direction, not a size: its verdict is at most "same direction".

A claim of no accuracy loss (``no_loss``) is reproduced when the interval of the paired
difference lies above -``LOSS_TOLERANCE`` points (3.6 of digits' 359 test images), and not
reproduced otherwise: "no difference shown" over a few repeats is not "no loss".

Time to accuracy is the sustained one (``stats.K_SUSTAINED`` evaluations in a row at or
above the target). A run that never held it ranks after every run that did: its pair's
speed-up is 0 (or unbounded, "inf", when only the baseline never held it); a pair where
neither did is left out, and the tables say how many runs held it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.archive import runs_of
from testbed.common.errors import TestbedError
from testbed.runs.reports.rundata import RunData
from testbed.runs.reports.stats import K_SUSTAINED, MIN_PAIRS_95, compare, pair, pair_key
from testbed.runs.reports.tables import tta_or_never

RATES = ("100mbit", "500mbit", "1gbit")
RATE_NAMES = {"100mbit": "100 Mbit", "500mbit": "500 Mbit", "1gbit": "1 Gbit", "10gbit": "10 Gbit"}


# ---------------------------------------------------------------- picking runs

def section(r: RunData) -> str:
    """Which ``benchmarks.claims`` section a run's sweep belongs to, from what ran in it."""
    params = r.summary.get("params") or {}
    if "lr" in params:
        return "lr"
    scheme = r.summary.get("scheme")
    if scheme in ("prunex", "hier-allreduce") or "prunex-rho" in params:
        return "prunex"
    return {"spardl": "spardl", "fp16": "tta"}.get(str(scheme), "")


def sweeps(folder: Path, name: str) -> list[RunData]:
    """The ok runs of the sweeps in ``folder`` that hold a run of section ``name``."""
    runs = runs_of(folder)
    dirs = {r.path.parent for r in runs if section(r) == name.removeprefix("tta_")}
    if name in ("lr", "tta_lr"):  # the lr grid of three schemes, or pactrain alone at its own rate
        schemes: dict[Path, set] = {}
        for r in runs:
            schemes.setdefault(r.path.parent, set()).add(r.summary.get("scheme"))
        dirs = {d for d in dirs if (schemes[d] == {"pactrain"}) == (name == "tta_lr")}
    if name == "prune":  # the sweep whose pactrain runs span several pruning ratios
        ratios: dict[Path, set] = {}
        for r in runs:
            if r.summary.get("scheme") == "pactrain":
                ratios.setdefault(r.path.parent, set()).add(r.summary.get("prune_ratio"))
        dirs = {d for d, rs in ratios.items() if len(rs) > 2}
    ok = [r for r in runs if r.path.parent in dirs and r.status == "ok"]
    if not ok:
        raise TestbedError(f"{folder}: no {name} runs", f"python -m benchmarks.claims --sections {name}")
    return ok


def pick(runs: Sequence[RunData], label: str, bw: str | None = None, **hyper) -> list[RunData]:
    return [r for r in runs if r.label == label and (bw is None or r.bw == bw)
            and all((r.summary.get("hyper") or {}).get(k) == v for k, v in hyper.items())]


# ---------------------------------------------------------------- statistics

def paired(xs: Sequence[RunData], bs: Sequence[RunData], value: Callable, diff: bool = False) -> dict:
    """x against b over paired repeats (``stats.pair``, ``stats.compare``): value(x) /
    value(b) (or, with ``diff``, value(x) - value(b)); median, its interval, pairs."""
    c = compare(pair(xs, bs, lambda r: pair_key(r.summary), value, diff=diff))
    return {"mid": c["median_ratio"], "lo": c["ci_low"], "hi": c["ci_high"], "n": c["pairs"]}


def cell(c: dict, fmt: str = ".2f", scale: float = 1.0, unit: str = "x") -> str:
    """'1.52x [1.31, 1.70] (8 pairs)', or '... (5 pairs, min-max)' below 6 pairs."""
    if c["mid"] is None:
        return "no pairs"

    def num(x: float) -> str:  # inf: a ratio over a baseline run that never held the target
        return "inf" if math.isinf(x) else f"{x * scale:{fmt}}"

    text = f"{num(c['mid'])}{unit}"
    if c["lo"] is None:
        return text + " (one run)"
    kind = "" if c["n"] >= MIN_PAIRS_95 else ", min-max"
    return text + f" [{num(c['lo'])}, {num(c['hi'])}] ({c['n']} pairs{kind})"


def unjudged(c: dict) -> str | None:
    """The verdict of a comparison too thin to judge (the module's rule), else None."""
    if c["mid"] is None:
        return "not measured"
    if c["lo"] is None:
        return "one run"
    if c["n"] < MIN_PAIRS_95:
        return f"not judged: {c['n']} pairs (a verdict needs {MIN_PAIRS_95})"
    return None


def verdict(c: dict, paper: float | tuple[float, float], null: float = 1.0, up_to: bool = False) -> str:
    """A claim's verdict (the module's rule). ``paper`` is the paper's figure (or its range)
    on the same scale as ``c``, ``null`` the value of no effect, ``up_to`` for "up to X"
    claims."""
    early = unjudged(c)
    if early:
        return early
    lo, hi = c["lo"], c["hi"]
    a, b = paper if isinstance(paper, tuple) else (paper, paper)
    side = 1 if b > null else -1
    if lo <= null <= hi or (side > 0 and hi < null) or (side < 0 and lo > null):
        return "not reproduced"
    if (side > 0 and lo > b) or (side < 0 and hi < a):
        return "beyond the paper's figure"
    if math.isinf(hi) or lo == 0:  # a run that never held the target: the direction, not the size
        return "same direction"
    reaches = (hi >= b if side > 0 else lo <= a) if up_to else lo <= b and a <= hi
    return "reproduced" if reaches else "same direction"


LOSS_TOLERANCE = 1.0
"""Points of accuracy a "without accuracy loss" claim may lose at the interval's low end."""


def no_loss(c: dict) -> str:
    """The verdict of a no-loss claim from a paired difference in points (the module's rule)."""
    early = unjudged(c)
    if early:
        return early
    return "reproduced" if c["lo"] >= -LOSS_TOLERANCE else "not reproduced"


def spread(values: Sequence, fmt: str = ".3f") -> str:
    vs = [v for v in values if v is not None]
    if not vs:
        return "-"
    mid = f"{statistics.median(vs):{fmt}}"
    return mid if len(vs) == 1 else f"{mid} [{min(vs):{fmt}}-{max(vs):{fmt}}]"


def _acc(r: RunData) -> float | None:
    return r.summary.get("final_accuracy")


def _iter(r: RunData) -> float | None:
    return r.summary.get("mean_iter_s")


def _uplink(r: RunData) -> float | None:
    return (r.summary.get("bottleneck") or {}).get("bytes_per_iteration")


def _wire(r: RunData) -> float | None:
    return r.summary.get("mean_wire_tx_bytes_per_iteration")


def _tta(target: float) -> Callable[[RunData], float | None]:
    """A run's sustained time to ``target``, infinite when it never held it (``testbed report``'s
    rule, ``tables.tta_or_never``: a ratio of 0 or infinity; a pair where neither held it is
    left out)."""
    return lambda r: tta_or_never(r, target)


def _target(runs: Sequence[RunData]) -> float:
    ts = {r.summary.get("target_accuracy") for r in runs}
    if len(ts) != 1 or not isinstance(t := ts.pop(), (int, float)):
        raise TestbedError("the runs do not share one target accuracy", "archive one section's sweep at a time")
    return t


def _reached(runs: Sequence[RunData], target: float) -> str:
    return f"{sum(r.tta_sustained(target) is not None for r in runs)}/{len(runs)}"


def _resolution(runs: Sequence[RunData]) -> str:
    n = {r.summary.get("test_samples") for r in runs}
    return f"one test image is {100 / n.pop():.2f} points" if len(n) == 1 else "test sets differ"


def _points(c: dict) -> dict:
    """A difference of accuracies (fractions) as points."""
    return {k: (v * 100 if isinstance(v, float) and k != "n" else v) for k, v in c.items()}


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _head(*cells: str) -> list[str]:
    return [_row(*cells), _row(*("---" for _ in cells))]


# ---------------------------------------------------------------- PacTrain

PACTRAIN = "pactrain 0.5 ternary"
TTA_SCHEMES = ("allreduce", "fp16", "topk 0.01", "topk 0.1", "pactrain 0.5 exact", PACTRAIN)


def pactrain_claims(folder: Path) -> str:
    """The PacTrain paper's claims, one row each (one row per baseline where a claim names two)."""
    runs = sweeps(folder, "tta")
    target = _target(runs)
    tta = _tta(target)
    out = _head("paper's claim", "metric", "ours: PacTrain (ternary, the default) over the baseline, "
                "median of paired ratios [interval: 95 % from 6 pairs, else min-max]", "verdict")
    def row(claim: str, base: str, mine: Sequence[RunData], paper: float | tuple[float, float], up_to: bool) -> str:
        """The claim's row: PacTrain's speed-up over ``base`` at every rate, judged at every
        rate measured (issue 58: a rate where it loses is said, not left out)."""
        c = {bw: paired(pick(runs, base, bw), pick(mine, PACTRAIN, bw), tta) for bw in RATES}
        return _row(claim, f"TTA ({target:g})", "; ".join(f"{RATE_NAMES[bw]} {cell(x)}" for bw, x in c.items()),
                    "; ".join(f"{RATE_NAMES[bw]}: {verdict(x, paper, up_to=up_to)}" for bw, x in c.items()
                              if x["mid"] is not None))

    out.append(row("up to **8.72x** faster to accuracy than all-reduce (Fig. 3)", "allreduce", runs, 8.72, True))
    own = _own_lr(folder)
    if own:
        lr = (own[0].summary.get("hyper") or {}).get("lr")
        out.append(row(f"(the same, PacTrain at its own best learning rate, {lr:g}; all-reduce at 0.05, its best)",
                       "allreduce", own, 8.72, True))
    for base, name in (("fp16", "fp16"), ("topk 0.01", "top-k 0.01"), ("topk 0.1", "top-k 0.1")):
        out.append(row(f"**1.25-7.05x** faster to accuracy than {name} (Fig. 3)", base, runs, (1.25, 7.05), False))
    out += ["", "Command: `sudo python -m benchmarks.claims --sections tta,tta_lr`.", "", prune_claim(folder),
            "Command: `sudo python -m benchmarks.claims --sections prune`."]
    return "\n".join(out) + "\n"


def _own_lr(folder: Path) -> list[RunData]:
    """The tta_lr section's runs (PacTrain at its own learning rate), or none."""
    try:
        return sweeps(folder, "tta_lr")
    except TestbedError:
        return []


def tta_table(folder: Path) -> str:
    """Every scheme of the TTA sweep at every rate, against allreduce over paired repeats."""
    runs = sweeps(folder, "tta")
    target = _target(runs)
    out = _head("rate", "scheme", f"sustained {target:g} reached", "sustained TTA s, median [min-max]",
                "TTA speed-up over allreduce", "iteration speed-up over allreduce", "final accuracy")
    for bw in RATES:
        base = pick(runs, "allreduce", bw)
        for label in TTA_SCHEMES:
            rs = pick(runs, label, bw)
            if not rs:
                continue
            rel = label != "allreduce"
            out.append(_row(RATE_NAMES[bw], label, _reached(rs, target), spread([r.tta_sustained(target) for r in rs], ".1f"),
                            cell(paired(base, rs, _tta(target))) if rel else "",
                            cell(paired(base, rs, _iter)) if rel else "", spread([_acc(r) for r in rs])))
    out += ["", f"Final accuracy on digits' test set: {_resolution(runs)}. Speed-ups are allreduce / scheme per "
                f"repeat; the time to accuracy is the first of {K_SUSTAINED} evaluations in a row at or above "
                f"{target:g}. A run that never held it ranks after every run that did (its pair's speed-up is 0, "
                f"or unbounded when only the baseline never held it); a pair where neither held it is left out."]
    return "\n".join(out) + "\n"


def _prune_rows(folder: Path) -> tuple[list[RunData], list[tuple[float, list[RunData], dict]]]:
    runs = sweeps(folder, "prune")
    base = pick(runs, "allreduce")
    ratios = sorted({r.summary["prune_ratio"] for r in runs if r.summary.get("scheme") == "pactrain"})
    rows = []
    for x in ratios:
        rs = [r for r in runs if r.summary.get("scheme") == "pactrain" and r.summary.get("prune_ratio") == x]
        rows.append((x, rs, _points(paired(rs, base, _acc, diff=True))))
    return base, rows


def prune_claim(folder: Path) -> str:
    """Fig. 6's claim, one row: the largest drop up to a ratio of 0.8."""
    _, rows = _prune_rows(folder)
    upto = [(x, c) for x, _, c in rows if x <= 0.8 + 1e-9]
    def low(xc: tuple) -> float:
        c = xc[1]
        return c["lo"] if c["lo"] is not None else c["mid"] if c["mid"] is not None else 0.0

    worst = min(upto, key=low)
    every_lo = all(c["lo"] is not None and c["lo"] > -2 for _, c in upto)
    any_hi = any(c["hi"] is not None and c["hi"] < -2 for _, c in upto)
    thin = next((w for w in (unjudged(c) for _, c in upto) if w), None)
    word = thin or ("reproduced" if every_lo else "not reproduced" if any_hi else "same direction")
    medians = ", ".join(f"{x:g}: {c['mid']:+.1f}" for x, c in upto if c["mid"] is not None)
    ours = (f"final accuracy minus all-reduce's, paired, in points: medians {medians}; the lowest interval "
            f"{cell(worst[1], '+.1f', unit='')} at {worst[0]:g}")
    return "\n".join([*_head("paper's claim", "metric", "ours: default PacTrain at 1 Gbit", "verdict"),
                      _row("accuracy drops **< 2 %** up to 80 % pruning (Fig. 6)", "final accuracy", ours,
                           word + ("" if thin else " (every ratio's interval above -2 points)" if every_lo else
                                   "" if any_hi else " (every median above -2 points, not every interval)"))]) + "\n"


def prune_table(folder: Path) -> str:
    """Fig. 6's curve: the default PacTrain's final accuracy per pruning ratio."""
    base, rows = _prune_rows(folder)
    out = _head("pruning ratio", "runs", "final accuracy, median [min-max]", "minus all-reduce's (points, paired)",
                "payload / all-reduce's")
    pay = statistics.median(r.summary["mean_payload_bytes"] for r in base)
    out.append(_row("dense (all-reduce)", str(len(base)), spread([_acc(r) for r in base]), "", "1.000"))
    for x, rs, c in rows:
        out.append(_row(f"{x:g}", str(len(rs)), spread([_acc(r) for r in rs]), cell(c, "+.1f", unit=""),
                        f"{statistics.median(r.summary['mean_payload_bytes'] for r in rs) / pay:.3f}"))
    return "\n".join(out) + f"\n\nFinal accuracy after {base[0].summary.get('epochs'):g} epochs; " \
                            f"{_resolution(base)}.\n"
