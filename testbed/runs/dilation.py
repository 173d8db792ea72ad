"""Time dilation (``testbed run --dilation K``): a cluster faster than this machine, emulated
K times slower (time-warped emulation, NSDI'06; DieCast; VT-Mininet).

Every shaped rate is divided by K, every delay and jitter multiplied by K, the stated compute
time (``--compute-time``) multiplied by K, a trace's step times multiplied by K and its rates
divided by K, the run's timeout multiplied by K; every duration the run records (records,
summary, report, Prometheus) is the measured one divided by K. The network and the stated
compute look the same in emulated time; what shrinks K-fold is everything else this machine
spends: the collectives' copying and summing, the hooks' compression, Python, scheduling.
Dilation thus models hosts K times faster than this one at everything not stated.

    parse        "K", "auto" or "auto:FIRST-LAST" from a command line
    check        where dilation would be wrong, refused before anything is built
    dilated      a shape K times slower (rate / K, delay and jitter x K; loss and queue kept)
    emulated     a link as the emulation sees it (the inverse, for the summary)
    dilate_trace a trace K times slower, written as CSV for the replay
    slow_down    every link of a testbed K times slower

``--dilation auto`` (:mod:`testbed.runs.dilation_auto`) raises K until two successive K agree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.model.links import Link
from testbed.model.shapes import DIRECTIONS, Shape
from testbed.model.trace import Trace
from testbed.model.units import MAX_RATE_BPS, MIN_RATE_BPS, Duration, Rate

MAX_DILATION = 1000.0
"""K at most (as workloads.arguments bounds it): 1000 x a 10 Gbit link is 10 Mbit."""

AUTO = "auto"
MAX_AUTO = 64.0
"""The largest K plain ``auto`` tries (each doubling is one more run)."""


@dataclass(frozen=True)
class Auto:
    """``--dilation auto[:FIRST-LAST]``: runs at K = FIRST, 2 FIRST, 4 FIRST, ... up to LAST
    (plain ``auto``: 1 to 64) until two successive K agree."""

    first: float = 1.0
    last: float = MAX_AUTO

    def ladder(self) -> list[float]:
        ks, k = [], self.first
        while k <= self.last:
            ks.append(k)
            k *= 2
        return ks


def parse(text: str) -> float | Auto:
    """``--dilation``'s value: a factor K in [1, 1000], ``auto``, or ``auto:FIRST-LAST``
    (a ladder that starts above 1 saves the runs a large emulation needs no proof for)."""
    t = text.strip().lower()
    if t == AUTO:
        return Auto()
    if t.startswith(AUTO + ":"):
        return _auto_range(text, t[len(AUTO) + 1:])
    return _factor(text, text)


def _factor(text: str, value: str) -> float:
    try:
        k = float(value)
    except ValueError:
        k = math.nan
    if not (math.isfinite(k) and 1 <= k <= MAX_DILATION):
        raise TestbedError(f"--dilation {text}: give a factor K in [1, {MAX_DILATION:g}] (e.g. 4), 'auto' or "
                           "'auto:FIRST-LAST' (e.g. auto:8-256)",
                           "K slows every shaped link and the stated --compute-time K-fold; see docs/dilation.md")
    return k


def _auto_range(text: str, spec: str) -> Auto:
    m = re.fullmatch(r"([^-]+)-([^-]+)", spec)
    if not m:
        raise TestbedError(f"--dilation {text}: write auto:FIRST-LAST, e.g. auto:8-256",
                           "auto doubles K from FIRST up to LAST until two successive K agree")
    first, last = _factor(text, m[1]), _factor(text, m[2])
    if 2 * first > last:
        raise TestbedError(f"--dilation {text}: LAST must be at least twice FIRST (two K to compare)",
                           "e.g. auto:8-256")
    return Auto(first, last)


def check(req, given: str | None = None) -> None:
    """Refuse a dilated run whose emulation dilation would distort (one line each).

    * without ``--compute-time`` or ``--gpu-time``: real compute runs at this machine's
      speed; it cannot be made K times slower, only held to K x a stated time (``--gpu-time``,
      workloads.pacing), so the emulated time of a step would be wrong;
    * the user's own code or another module: its compute is real and its records' times
      are its own (testbed cannot divide them);
    * cross-traffic: TCP's own clocks (the minimum retransmission timeout, delayed ACKs,
      pacing) are not dilated, so a flow's share of a K-fold slower link is not its share
      of the emulated one.

    ``given``: how the command line spelled K (``auto``)."""
    k = req.dilation
    if k == 1:
        return
    name = given or f"{k:g}"
    if req.code is not None or req.workload is None:
        raise TestbedError(f"--dilation {name} applies to the built-in trainer with --compute-time or --gpu-time "
                           f"only: {req.scheme}'s compute is real and its times are its own",
                           "run your code without --dilation")
    options = req.workload.options
    if options.compute_time is None and getattr(options, "gpu_time", None) is None:
        raise TestbedError(f"--dilation {name} needs --compute-time or --gpu-time: real compute cannot be made K "
                           "times slower, only held to K x a stated time",
                           "state the GPU's compute per iteration with --gpu-time SECONDS (real training) or "
                           "--compute-time SECONDS (traffic only)")
    if req.cross_traffic:
        raise TestbedError(f"--dilation {name} with --cross-traffic: TCP's own timers (RTO, delayed ACKs) are not "
                           f"dilated, so a flow's share of a slowed link is not its share of the emulated one",
                           "run cross-traffic without --dilation")


def check_flows(flows: list, k: float) -> None:
    """The topology's own ``traffic:`` is cross-traffic too (see :func:`check`)."""
    if k != 1 and flows:
        raise TestbedError(f"--dilation {k:g}: the testbed's topology starts cross-traffic (traffic:), whose TCP "
                           f"timers are not dilated", "give --cross-traffic none, or run without --dilation")


def dilated(shape: Shape, k: float, where: str = "link") -> Shape:
    """``shape`` K times slower: rate / K, delay and jitter x K (loss and queue limit kept)."""
    bps = round(shape.rate.bps / k)
    if bps < MIN_RATE_BPS:
        raise TestbedError(f"--dilation {k:g}: {where}'s {shape.rate} / {k:g} is below the lowest rate HTB shapes "
                           f"({MIN_RATE_BPS} bit/s)", "choose a smaller K")
    delay, jitter = Duration(round(shape.delay.us * k)), Duration(round(shape.jitter.us * k))
    if max(delay.us, jitter.us) > 60_000_000:
        raise TestbedError(f"--dilation {k:g}: {where}'s delay x {k:g} exceeds 60 s", "choose a smaller K")
    return replace(shape, rate=Rate(bps), delay=delay, jitter=jitter)


def emulated(link: Link, k: float) -> Link:
    """``link`` as the emulation sees it when its shapes are the dilated ones (rates x K,
    delays / K): what the summary reports."""
    if k == 1:
        return link

    def back(s: Shape) -> Shape:
        return replace(s, rate=Rate(min(MAX_RATE_BPS, round(s.rate.bps * k))), delay=Duration(round(s.delay.us / k)),
                       jitter=Duration(round(s.jitter.us / k)))
    return replace(link, forward=back(link.forward), reverse=back(link.reverse))


def dilate_trace(trace: Trace, k: float, out: Path) -> Path:
    """``trace`` K times slower as a CSV file at ``out`` (times x K, rates / K, delays x K;
    a looping trace keeps its period marker), for the run's replay to follow."""
    lines = ["time_s,rate,delay,loss"]
    steps = list(trace.steps)
    if trace.period_s is not None:  # the marker line the parser wants back
        steps.append(replace(steps[0], at_s=trace.period_s))
    for s in steps:
        shape = dilated(Shape(rate=s.rate, delay=s.delay or Duration(0)), k, f"--bw-trace step at {s.at_s:g} s")
        delay = str(shape.delay) if s.delay is not None else ""
        loss = str(s.loss) if s.loss is not None else ""
        lines.append(f"{s.at_s * k!r},{shape.rate},{delay},{loss}")
    out.write_text("\n".join(lines) + "\n")
    return out


def slow_down(tb, k: float) -> None:
    """Every link of ``tb`` K times slower, both directions (the caller keeps the shapes to
    put back: those from before its own --bw). Links sharing a shape change in one call."""
    groups: dict[tuple[Shape, str], list[Link]] = {}
    for l in tb.topology.links:
        for d in DIRECTIONS:
            groups.setdefault((dilated(l.shape(d), k, f"link {l.name}"), d), []).append(l)
    for (shape, d), links in groups.items():
        tb.set_links(links, rate=shape.rate, delay=shape.delay if shape.delay else None,
                     jitter=shape.jitter if shape.jitter else None, direction=d)
