"""The bottleneck rate over a run that followed a trace (--bw-trace), and what it did.

    RateTimeline     the rate in force at any time, from the replay's trace.jsonl
    annotate_rates   each iteration's record gets link_rate_bps, the rate while it ran
    trace_summary    summary.json's bw_trace: steps applied, their lateness, the mean
                     capacity (utilisation is measured against it), iteration time per rate
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

from testbed.common.files import atomic_write, read_jsonl


class RateTimeline:
    """The bottleneck rate over a run, from the replay's trace.jsonl: ``initial`` (the
    shape from before) until the first applied step, then each step's rate. Lookups are
    bisections, so annotating every record of a long run against a long trace stays cheap."""

    def __init__(self, steps: list[tuple[float, float]], initial: float | None):
        steps = sorted(steps)
        self.times = [t for t, _ in steps]
        self.rates = [r for _, r in steps]
        self.initial = initial
        self.k = 1.0
        """The run's dilation: records' iter_s span K times as many wall-clock seconds."""

    @classmethod
    def from_run(cls, run_dir: Path, shapes: dict, dilation: float = 1.0) -> tuple["RateTimeline", list[float]]:
        """The timeline, and each applied step's lateness (s), read from the run's trace.jsonl;
        ``shapes``: the emulated ones. A dilated run's steps set rates K times lower: the
        timeline holds the emulated rates (x K) and its ``k`` (a record's iter_s is K times
        shorter than the wall-clock time it spanned)."""
        from testbed.model.units import Rate, UnitError

        steps, late = [], []
        for r in read_jsonl(run_dir / "trace.jsonl"):
            if r.get("event") != "step" or not isinstance(r.get("time"), (int, float)):
                continue
            try:
                steps.append((float(r["time"]), float(Rate.parse(str(r["rate"])).bps) * dilation))
            except UnitError:
                continue
            if isinstance(r.get("late_s"), (int, float)):
                late.append(r["late_s"])
        rates = {Rate.parse(s["rate"]).bps for dirs in shapes.values() for s in dirs.values()}
        timeline = cls(steps, float(min(rates)) if rates else None)
        timeline.k = dilation
        return timeline, sorted(late)

    def at(self, t: float) -> float | None:
        i = bisect.bisect_right(self.times, t)
        return self.rates[i - 1] if i else self.initial

    def changes_within(self, t0: float, t1: float) -> bool:
        """A step came strictly between ``t0`` and ``t1``."""
        return bisect.bisect_left(self.times, t1) > bisect.bisect_right(self.times, t0)

    def over(self, t0: float, t1: float) -> float | None:
        """The time-weighted mean rate in force over [t0, t1]."""
        if t1 <= t0:
            t0 = t1 - 1e-9
        cuts = [t0, *self.times[bisect.bisect_right(self.times, t0):bisect.bisect_left(self.times, t1)], t1]
        total, covered = 0.0, 0.0
        for a, b in zip(cuts, cuts[1:]):
            rate = self.at(a)
            if rate is not None:
                total += rate * (b - a)
                covered += b - a
        return total / covered if covered > 0 else None


def annotate_rates(run_dir: Path, world: int, rates: RateTimeline) -> None:
    """Each iteration's record gets ``link_rate_bps``: the bottleneck rate in force while it
    ran (time-weighted over [time - iter_s, time]). The files are replaced whole."""
    for r in range(world):
        path = run_dir / f"rank{r}.jsonl"
        recs = read_jsonl(path)
        if not recs:
            continue
        for x in recs:
            t, dt = x.get("time"), x.get("iter_s")
            if isinstance(t, (int, float)) and isinstance(dt, (int, float)):
                x["link_rate_bps"] = rates.over(t - dt * rates.k, t)
        atomic_write(path, "".join(json.dumps(x) + "\n" for x in recs))  # a full disk keeps the records as they were


def trace_summary(summary: dict, run_dir: Path, trace_file: Path, rates: RateTimeline, late: list[float],
                   t_start: float, duration: float) -> None:
    """What the trace did during the run: steps applied, their lateness, the mean capacity
    (utilisation is measured against it), and the mean iteration time at each rate (only
    iterations that ran wholly at one rate)."""
    import statistics

    by_rate: dict[float, list[float]] = {}
    for x in read_jsonl(run_dir / "rank0.jsonl"):
        t, dt = x.get("time"), x.get("iter_s")
        if isinstance(t, (int, float)) and isinstance(dt, (int, float)):
            if rates.changes_within(t - dt * rates.k, t):
                continue  # a step came while it ran
            rate = rates.over(t - dt * rates.k, t)
            if rate is not None:
                by_rate.setdefault(round(rate), []).append(dt)
    summary["bw"] = f"trace {trace_file.name}"
    capacity = rates.over(t_start, t_start + duration)
    b = summary["bottleneck"]
    if capacity and duration > 0:
        for v in b["links"].values():  # emulated rate over emulated seconds
            v["rate_bps"], v["utilisation"] = capacity, v["bytes"] * 8 / (duration / rates.k) / capacity
        util = [v["utilisation"] for v in b["links"].values()]
        b["max_utilisation"], b["mean_utilisation"] = max(util), sum(util) / len(util)
    summary["bw_trace"] = {
        "file": str(trace_file), "steps_applied": len(late), "mean_rate_bps": capacity,
        "late_s": {"median": statistics.median(late), "max": late[-1]} if late else None,
        "iterations_by_rate": [{"rate_bps": r, "iterations": len(v), "mean_iter_s": statistics.fmean(v)}
                               for r, v in sorted(by_rate.items())]}
