"""Cross-traffic flows as data: ``w0->w7,flows=2`` on the command line or ``traffic:`` in
a topology (from, to, flows, rate, on, off), parsed and checked here; started by
:mod:`testbed.runs.traffic`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.common.digits import ascii_int
from testbed.common.errors import TestbedError, shown
from testbed.model.units import Rate, UnitError

MAX_FLOWS = 32
"""Parallel streams in one flow (iperf3 -P)."""
_KEYS = ("from", "to", "flows", "rate", "on", "off")


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    flows: int = 1
    rate: Rate | None = None
    on_s: float | None = None
    off_s: float | None = None

    @property
    def onoff(self) -> bool:
        return self.on_s is not None

    def label(self) -> str:
        s = f"{self.src}->{self.dst}"
        if self.flows != 1:
            s += f" x{self.flows}"
        if self.rate is not None:
            s += f" {self.rate}"
        if self.onoff:
            s += f" on {self.on_s:g}s off {self.off_s:g}s"
        return s

    def to_dict(self) -> dict:
        d: dict = {"from": self.src, "to": self.dst, "flows": self.flows}
        if self.rate is not None:
            d["rate"] = str(self.rate)
        if self.onoff:
            d.update(on=f"{self.on_s:g}s", off=f"{self.off_s:g}s")
        return d


MAX_PERIOD_S = 86_400.0
"""An on or off period of a flow: at most a day (a 400-digit one became infinity, and the
flow's thread died dividing by it)."""


def _seconds(value: object, where: str) -> float:
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|min)", value.strip().lower()) \
        if isinstance(value, str) else None
    s = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "min": 60.0}[m.group(2)] if m else 0.0
    if not 0 < s <= MAX_PERIOD_S:
        raise TestbedError(f"{where}: {shown(value)} is not a time in (0 s, 1 day]", "write e.g. '2s', '500ms', '1min'")
    return s


def flow_from_dict(d: object, where: str) -> Flow:
    """One flow from its mapping (the topology's ``traffic:`` entries)."""
    if not isinstance(d, dict):
        raise TestbedError(f"{where}: a flow is a mapping such as {{from: w0, to: w1}}")
    # YAML 1.1 (PyYAML) reads a bare `on:` / `off:` key as true / false: take them back
    d = {("on" if k is True else "off" if k is False else k): v for k, v in d.items()}
    unknown = sorted(set(d) - set(_KEYS), key=str)
    if unknown:
        raise TestbedError(f"{where}: unknown key {unknown[0]!r}", f"keys: {', '.join(_KEYS)}")
    src, dst = d.get("from"), d.get("to")
    for k, v in (("from", src), ("to", dst)):
        if not isinstance(v, str) or not v:
            raise TestbedError(f"{where}.{k}: name a worker node", "e.g. from: w0, to: w7")
    assert isinstance(src, str) and isinstance(dst, str)  # checked just above (for the type checker)
    if src == dst:
        raise TestbedError(f"{where}: from and to are both {src!r}", "a flow goes between two nodes")
    flows = d.get("flows", 1)
    if isinstance(flows, bool) or not isinstance(flows, int) or not 1 <= flows <= MAX_FLOWS:
        raise TestbedError(f"{where}.flows: {flows!r} is not a number of flows in 1..{MAX_FLOWS}")
    rate = None
    if d.get("rate") is not None:
        try:
            rate = Rate.parse(d["rate"])
        except UnitError as e:
            raise TestbedError(f"{where}.rate: {e}") from None
    on, off = d.get("on"), d.get("off")
    if (on is None) != (off is None):
        raise TestbedError(f"{where}: an on/off flow needs both on and off", "e.g. on: 2s, off: 3s")
    on_s = _seconds(on, f"{where}.on") if on is not None else None
    off_s = _seconds(off, f"{where}.off") if off is not None else None
    return Flow(src, dst, flows, rate, on_s, off_s)


def parse_spec(spec: str, where: str = "--cross-traffic") -> Flow:
    """``SRC->DST[,flows=N][,rate=R][,on=T,off=T]``."""
    head, *opts = [p.strip() for p in spec.split(",")]
    m = re.fullmatch(r"([^\s>-][^\s>]*?)\s*->\s*(\S+)", head)
    if not m:
        raise TestbedError(f"{where} {spec!r}: start with SRC->DST", "e.g. --cross-traffic 'w0->w7,flows=2'")
    d: dict = {"from": m.group(1), "to": m.group(2)}
    for o in opts:
        k, eq, v = o.partition("=")
        if not eq or k not in _KEYS[2:]:
            raise TestbedError(f"{where} {spec!r}: {o!r} is not one of flows=N, rate=R, on=T, off=T")
        if k in d:
            raise TestbedError(f"{where} {spec!r}: {k}= is given twice", "give each of flows, rate, on, off once")
        n = ascii_int(v) if k == "flows" else None
        d[k] = v if n is None else n  # flows=²: text, which flow_from_dict refuses by name
    return flow_from_dict(d, f"{where} {spec!r}")


def check_flows(flows: Sequence[Flow], workers: Sequence[str]) -> None:
    for f in flows:
        for n in (f.src, f.dst):
            if n not in workers:
                raise TestbedError(f"cross-traffic {f.label()}: {n!r} is not a worker of this testbed",
                                   f"workers: {', '.join(workers)}")


# ---------------------------------------------------------------------- running
