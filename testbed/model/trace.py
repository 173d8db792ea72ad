"""Bandwidth traces and schedules: a link's shape as a function of time.

Three sources give one :class:`Trace` (steps in time order, each setting the rate and,
where given, delay and loss from its time on):

* **CSV** (``time_s,rate[,delay[,loss]]``): one step per line, times in seconds
  (strictly increasing), values in the topology's units (``100mbit``, ``20ms``,
  ``0.1%``); an optional header line starting with ``time``; ``#`` comments and blank
  lines are skipped.
* **Mahimahi** packet-delivery traces: one line per 1500-byte delivery opportunity,
  the integer millisecond at which it occurs (several lines may share a millisecond);
  the trace wraps at its last timestamp. It becomes one step per ``window`` (the rate
  that window's opportunities carry), and it loops. A window with no opportunity gets
  the lowest rate HTB handles (8 kbit/s), since a rate of zero cannot be shaped.
* **An inline schedule** (the topology's ``schedule:``): a list of
  ``{at: 30s, rate: 100mbit[, delay: ..., loss: ...]}``.

A trace that loops ends where it starts: its last step has the first step's values and
marks the period (one pass lasts until that step's time), so a schedule such as
``0s 1gbit, 30s 100mbit, 60s 1gbit`` with ``loop: true`` alternates every 30 s. Before
a trace's first step the link keeps the shape it had.

Every value is checked by the same parsers as the topology file, and a trace file is
untrusted input: its size, its number of steps and its length in time are bounded, and
an error names the file, the line and the value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import InputError, read_bounded
from testbed.model.units import MIN_RATE_BPS, Duration, Loss, Rate, UnitError

MAX_STEPS = 100_000
MAX_SPAN_S = 7 * 24 * 3600.0
MAHIMAHI_PACKET_BYTES = 1500


class TraceError(TestbedError):
    """A trace file or schedule is invalid; the message names where."""


@dataclass(frozen=True)
class Step:
    at_s: float
    rate: Rate
    delay: Duration | None = None
    loss: Loss | None = None

    def values(self) -> tuple:
        return self.rate, self.delay, self.loss

    def to_dict(self) -> dict:
        d: dict = {"at_s": self.at_s, "rate": str(self.rate)}
        if self.delay is not None:
            d["delay"] = str(self.delay)
        if self.loss is not None:
            d["loss"] = str(self.loss)
        return d


@dataclass(frozen=True)
class Trace:
    steps: tuple[Step, ...]
    period_s: float | None = None
    """One pass's length for a looping trace (steps then repeat from the first); None: no loop."""
    source: str = field(default="", compare=False)

    @property
    def loop(self) -> bool:
        return self.period_s is not None

    @property
    def needs_netem(self) -> bool:
        return any((s.delay is not None and s.delay) or (s.loss is not None and s.loss) for s in self.steps)

    def at(self, t: float) -> Step | None:
        """The step in force ``t`` seconds after the start (None before the first)."""
        if self.period_s is not None:  # self.loop
            t = t % self.period_s
        current = None
        for s in self.steps:
            if s.at_s > t:
                break
            current = s
        return current

    def events(self, until_s: float) -> Iterator[tuple[float, Step]]:
        """(time since start, step) for every change up to ``until_s``, loops unrolled."""
        base = 0.0
        while True:
            for s in self.steps:
                t = base + s.at_s
                if t > until_s:
                    return
                yield t, s
            if self.period_s is None:  # not self.loop
                return
            base += self.period_s


def _err(where: str, message: str, hint: str | None = None) -> TraceError:
    return TraceError(f"{where}: {message}", hint)


def _finish(steps: list[Step], loop: bool, where: str) -> Trace:
    if not steps:
        raise _err(where, "the trace has no steps", "give at least one line: time_s,rate")
    if len(steps) > MAX_STEPS:
        raise _err(where, f"more than {MAX_STEPS} steps", "use a coarser window or a shorter trace")
    if steps[-1].at_s > MAX_SPAN_S:
        raise _err(where, f"the trace lasts {steps[-1].at_s:g} s, more than 7 days", "check the time column's unit")
    if not loop:
        return Trace(tuple(steps), None, where)
    if len(steps) < 2:
        raise _err(where, "a looping trace needs a last step that marks its period",
                   "end it with the first step's values at the period's time, e.g. 0,1gbit ... 60,1gbit")
    first, last = steps[0], steps[-1]
    if first.at_s != 0:
        raise _err(where, f"a looping trace starts at 0 s, this one at {first.at_s:g} s")
    if last.values() != first.values():
        raise _err(where, f"a looping trace ends where it starts: its last step (at {last.at_s:g} s) must have "
                          f"the first step's values, marking the period",
                   f"add a last line '{last.at_s:g},{first.rate}' or drop loop")
    return Trace(tuple(steps[:-1]), last.at_s, where)


def _time(value: str, where: str) -> float:
    try:
        t = float(value)
    except ValueError:
        raise _err(where, f"time {value!r} is not a number of seconds") from None
    if not math.isfinite(t) or t < 0:
        raise _err(where, f"time {value!r} must be a finite number of seconds >= 0")
    return t


_AT_UNITS = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}


def _at(value: object, where: str) -> float:
    """A schedule time: ``30s``, ``500ms``, ``2min``, ``1h`` (0 may stand alone)."""
    if value == 0 and not isinstance(value, bool):
        return 0.0
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|min|h)", value.strip().lower()) if isinstance(value, str) else None
    if not m:
        raise _err(where, f"{value!r} is not a time; write e.g. '30s', '500ms', '2min'")
    t = float(m.group(1)) * _AT_UNITS[m.group(2)]
    if t > MAX_SPAN_S:
        raise _err(where, f"{value!r} is more than 7 days")
    return t


def _step(at: float, rate: object, delay: object, loss: object, where: str) -> Step:
    try:
        return Step(at, Rate.parse(rate), None if delay in (None, "") else Duration.parse(delay),
                    None if loss in (None, "") else Loss.parse(loss))
    except UnitError as e:
        raise _err(where, str(e)) from None


def _ordered(steps: list[Step], at: float, where: str) -> None:
    if steps and at <= steps[-1].at_s:
        raise _err(where, f"time {at:g} s does not come after the previous step's {steps[-1].at_s:g} s",
                   "times must be strictly increasing")


def _read(path: Path) -> list[str]:
    try:
        raw = read_bounded(path, "trace", "trace")
    except InputError as e:
        raise TraceError(e.message, "use a coarser trace" if "more than" in e.message else e.hint) from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read the trace ({e.strerror or e})") from None
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text") from None


def parse_csv(lines: Iterable[str], source: str = "<csv>", loop: bool = False) -> Trace:
    steps: list[Step] = []
    for n, line in enumerate(lines, 1):
        where = f"{source}:{n}"
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        cols = [c.strip() for c in text.split(",")]
        if cols[0].lower().startswith("time") and not steps:
            continue  # header
        if not 2 <= len(cols) <= 4:
            raise _err(where, f"{len(cols)} columns; expected time_s,rate[,delay[,loss]]")
        at = _time(cols[0], where)
        _ordered(steps, at, where)
        delay, loss = (cols[2:] + ["", ""])[:2]
        steps.append(_step(at, cols[1], delay, loss, where))
        if len(steps) > MAX_STEPS:
            break
    return _finish(steps, loop, source)


def parse_mahimahi(lines: Iterable[str], window_s: float, source: str = "<mahimahi>") -> Trace:
    """Rates over consecutive windows of ``window_s`` seconds; the trace loops."""
    if not (math.isfinite(window_s) and 0.001 <= window_s <= 3600):
        raise TraceError(f"window {window_s!r} must be between 1 ms and 1 h")
    stamps: list[int] = []
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if not (text.isascii() and text.isdigit()):
            raise _err(f"{source}:{n}", f"{text[:40]!r} is not a millisecond timestamp",
                       "a Mahimahi trace has one integer per line")
        if len(text) > 12:  # beyond 7 days, and past what int() reads past 4300 digits
            raise _err(f"{source}:{n}", f"timestamp {text[:20]}... ms is more than 7 days")
        ms = int(text)
        if stamps and ms < stamps[-1]:
            raise _err(f"{source}:{n}", f"timestamp {ms} goes back in time (previous {stamps[-1]})")
        if ms > MAX_SPAN_S * 1000:
            raise _err(f"{source}:{n}", f"timestamp {ms} ms is more than 7 days")
        stamps.append(ms)
    if not stamps or stamps[-1] == 0:
        raise TraceError(f"{source}: a Mahimahi trace needs timestamps after 0 ms (it wraps at the last one)")
    period = stamps[-1] / 1000
    windows = math.ceil(period / window_s - 1e-9)
    if windows > MAX_STEPS:
        raise TraceError(f"{source}: {windows} windows of {window_s:g} s, more than {MAX_STEPS}",
                         "use a longer window")
    counts = [0] * windows
    for ms in stamps:
        # a delivery at the period's end is the wrap point: it belongs to the first window
        i = 0 if ms == stamps[-1] else min(int(ms / 1000 / window_s), windows - 1)
        counts[i] += 1
    steps = []
    for i, c in enumerate(counts):
        start = i * window_s
        length = min(window_s, period - start)
        bps = max(MIN_RATE_BPS, round(c * MAHIMAHI_PACKET_BYTES * 8 / length))
        steps.append(Step(round(start, 9), Rate(bps)))
    return Trace(tuple(steps), period, source)


def parse_schedule(items: object, loop: object = False, path: str = "schedule") -> Trace:
    """The topology's inline ``schedule:`` (``path`` names it in errors)."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise _err(path, "must be a list of steps such as {at: 30s, rate: 100mbit}")
    if not isinstance(loop, bool):
        raise _err(f"{path}.loop" if path != "schedule" else "loop", f"{loop!r} must be true or false")
    steps: list[Step] = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        if not isinstance(item, dict):
            raise _err(where, "must be a mapping such as {at: 30s, rate: 100mbit}")
        unknown = set(item) - {"at", "rate", "delay", "loss"}
        if unknown:
            raise _err(where, f"unknown key '{sorted(map(str, unknown))[0]}'", "keys: at, rate, delay, loss")
        if "at" not in item or "rate" not in item:
            raise _err(where, "needs 'at' and 'rate'")
        at = _at(item["at"], f"{where}.at")
        _ordered(steps, at, where)
        steps.append(_step(at, item["rate"], item.get("delay"), item.get("loss"), where))
        if len(steps) > MAX_STEPS:
            break
    return _finish(steps, loop, path)


TRACE_FORMATS = ("auto", "csv", "mahimahi")
"""The formats :func:`load_trace` reads (``auto``: mahimahi when every line is an integer,
else csv); ``testbed link replay --format`` and ``testbed run --trace-format`` offer these."""


def load_trace(path: Path, fmt: str = "auto", window_s: float = 1.0, loop: bool = False) -> Trace:
    """A trace file: ``fmt`` csv, mahimahi, or auto (mahimahi when every line is an integer)."""
    lines = _read(path)
    if fmt == "auto":
        fmt = "mahimahi" if lines and all(l.strip().isdigit() for l in lines if l.strip()) else "csv"
    if fmt == "csv":
        return parse_csv(lines, str(path), loop)
    if fmt == "mahimahi":
        return parse_mahimahi(lines, window_s, str(path))
    raise TraceError(f"unknown trace format {fmt!r}", f"choose one of: {', '.join(TRACE_FORMATS)}")
