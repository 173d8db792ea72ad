"""Each scheme's iteration time against its own two physical bounds.

An iteration needs its compute C (everything but link time) and its bytes W on the
busiest bottleneck direction at rate R (W / R seconds of link time). Two bounds follow:

* the **perfect-overlap bound** max(C, W / R): every byte on the wire while the compute
  runs (as DDP's all-reduce overlaps backward, at best); no scheme iterates faster;
* the **no-overlap time** C + W / R: compute, then all the bytes; a scheme whose
  communication hides nothing behind compute takes this long.

``overlap`` = max(C, W / R) / T: 1 is perfect overlap, 0.9 the target. ``serial`` =
(C + W / R) / T: 1 means nothing overlapped, above 1 part of the link time was hidden,
below 1 the iteration costs more than compute and bytes (extra CPU work, latency).
``hidden`` = (C + W / R - T) / min(C, W / R): the share of what could be hidden that was
(0: none, 1: all of it; outside [0, 1] when T is outside the two bounds; not given when
min(C, W / R) is under 5 % of C + W / R).

Used by ``benchmarks.paper_sweep`` (C: the scheme's own median iteration time with the
bottleneck at 10 Gbit) and ``benchmarks.paper_scale`` (C: the stated compute time).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Efficiency:
    t: float
    """Measured seconds per iteration."""
    c: float
    """Compute seconds per iteration."""
    link: float
    """W / R: seconds the bytes need on the bottleneck."""

    @property
    def overlap_bound(self) -> float:
        return max(self.c, self.link)

    @property
    def serial_time(self) -> float:
        return self.c + self.link

    @property
    def overlap(self) -> float:
        return self.overlap_bound / self.t if self.t > 0 else math.nan

    @property
    def serial(self) -> float:
        return self.serial_time / self.t if self.t > 0 else math.nan

    @property
    def hidden(self) -> float:
        """NaN where there is little to hide (under 5 % of C + W / R): the ratio would be noise."""
        hideable = min(self.c, self.link)
        return (self.serial_time - self.t) / hideable if hideable >= 0.05 * self.serial_time else math.nan


def efficiency(t: float, c: float, wire_bytes: float, rate_bytes_per_s: float) -> Efficiency:
    """``t`` measured seconds per iteration, ``c`` compute seconds, ``wire_bytes`` per
    iteration on the busiest bottleneck direction, ``rate_bytes_per_s`` its rate."""
    return Efficiency(t, c, wire_bytes / rate_bytes_per_s)


HEADER = (f"{'runs':>4} {'iter s':>8} {'C s':>7} {'W MB':>8} {'W/R s':>7} {'max(C,W/R)':>10} {'C+W/R':>7} "
          f"{'overlap eff':>17} {'no-overlap eff':>17} {'hidden':>6}")
"""The columns ``row`` prints (after the caller's own, e.g. rate and scheme)."""


def _measured(times: list[float], c: float, wire_bytes: float, rate_bytes_per_s: float):
    """A cell's median iteration time, its Efficiency, and each run's."""
    t = statistics.median(times)
    per_run = [efficiency(x, c, wire_bytes, rate_bytes_per_s) for x in times]
    return t, efficiency(t, c, wire_bytes, rate_bytes_per_s), per_run


def row(times: list[float], c: float | None, wire_bytes: float, rate_bytes_per_s: float) -> str:
    """One table row over a cell's runs: the median iteration time; both efficiencies as
    median [min-max] over the runs (one value for one run); '-' where C is unknown."""
    times = [t for t in times if t is not None and t > 0]
    if not times:
        return f"{0:>4} (no timed run)"
    link = wire_bytes / rate_bytes_per_s
    if c is None:
        return f"{len(times):>4} {statistics.median(times):8.3f} {'-':>7} {wire_bytes / 1e6:8.2f} {link:7.3f}   (no C: no bound)"
    t, mid, per_run = _measured(times, c, wire_bytes, rate_bytes_per_s)
    return (f"{len(times):>4} {t:8.3f} {c:7.3f} {wire_bytes / 1e6:8.2f} {link:7.3f} {mid.overlap_bound:10.3f} "
            f"{mid.serial_time:7.3f} {_spread(mid.overlap, [e.overlap for e in per_run]):>17} "
            f"{_spread(mid.serial, [e.serial for e in per_run]):>17} "
            + (f"{mid.hidden:6.2f}" if math.isfinite(mid.hidden) else f"{'-':>6}"))


def cells(times: list[float], c: float | None, wire_bytes: float, rate_bytes_per_s: float) -> list[str]:
    """``row``'s values as markdown cells: runs, T, C, W MB, W/R, max(C, W/R), C + W/R, overlap
    eff and no-overlap eff (median [min-max] over the runs); '-' where C is unknown."""
    times = [t for t in times if t is not None and t > 0]
    if not times:
        return ["0", *["-"] * 8]
    link = wire_bytes / rate_bytes_per_s
    head = [str(len(times)), f"{statistics.median(times):.3f}"]
    if c is None:
        return [*head, "-", f"{wire_bytes / 1e6:.2f}", f"{link:.3f}", "-", "-", "-", "-"]
    _, mid, per_run = _measured(times, c, wire_bytes, rate_bytes_per_s)
    return [*head, f"{c:.3f}", f"{wire_bytes / 1e6:.2f}", f"{link:.3f}", f"{mid.overlap_bound:.3f}",
            f"{mid.serial_time:.3f}", _spread(mid.overlap, [e.overlap for e in per_run]),
            _spread(mid.serial, [e.serial for e in per_run])]


def _spread(mid: float, values: list[float]) -> str:
    if len(values) < 2:
        return f"{mid:.2f}"
    return f"{mid:.2f} [{min(values):.2f}-{max(values):.2f}]"


LEGEND = ("overlap eff = max(C, W/R) / T (1: perfect overlap; target >= 0.9); no-overlap eff = (C + W/R) / T "
          "(1: nothing hidden, above 1: part of the link time hidden behind compute); hidden = "
          "(C + W/R - T) / min(C, W/R); median [min-max] over runs, C and W as medians")
