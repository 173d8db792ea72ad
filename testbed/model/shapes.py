"""Link shapes: what one direction of a link does to traffic (rate, delay, jitter, loss,
queue limit), parsed and checked by one set of rules wherever a shape comes from: the
topology file, ``link set``'s flags, a state or ledger file."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from testbed.common.errors import TopologyError
from testbed.model.fields import mapping, unknown_keys
from testbed.model.units import Duration, Loss, Rate, UnitError

DEFAULT_RATE = Rate(10 * 10**9)
MAX_LIMIT = 10**7  # packets; also bounds the queue netem derives from rate x delay
MTU_BYTES = 1514  # an Ethernet frame at MTU 1500: what netem queues

SHAPE_KEYS = ("rate", "delay", "jitter", "loss", "limit")
"""The keys of a shape, wherever one is written (a link, a direction, ``defaults.link``)."""

DIRECTIONS = ("forward", "reverse")
"""The two directions of a link, each shaped on its own (``link set --direction``)."""


@dataclass(frozen=True)
class Shape:
    """How one direction of a link treats traffic."""

    rate: Rate = DEFAULT_RATE
    """Layer-2 rate cap (HTB rate = ceil). TCP goodput is about 0.956 of it at MTU 1500."""
    delay: Duration = Duration(0)
    """One-way added delay (netem)."""
    jitter: Duration = Duration(0)
    """Delay variation (netem; needs a delay)."""
    loss: Loss = Loss(0.0)
    """Random packet loss (netem)."""
    limit: int | None = None
    """Queue limit in packets; default: 1000, or 2x the bandwidth-delay product with netem."""

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay or self.jitter or self.loss)

    @property
    def queue_packets(self) -> int:
        """Packets the leaf queue holds: ``limit``, else >= 2x the bandwidth-delay product."""
        if self.limit is not None:
            return self.limit
        bdp = self.rate.bytes_per_second * (self.delay.seconds + self.jitter.seconds) / MTU_BYTES
        return max(1000, math.ceil(2 * bdp))

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"rate": str(self.rate)}
        if self.delay:
            d["delay"] = str(self.delay)
        if self.jitter:
            d["jitter"] = str(self.jitter)
        if self.loss:
            d["loss"] = str(self.loss)
        if self.limit is not None:
            d["limit"] = self.limit
        return d

    def describe(self) -> str:
        parts = [str(self.rate)]
        if self.delay:
            parts.append(f"delay {self.delay}" + (f"±{self.jitter}" if self.jitter else ""))
        if self.loss:
            parts.append(f"loss {self.loss}")
        if self.limit is not None:
            parts.append(f"limit {self.limit}p")
        return " ".join(parts)


_PARSERS = {"rate": Rate.parse, "delay": Duration.parse, "jitter": Duration.parse, "loss": Loss.parse}


def shape_fields(d: dict, path: str) -> dict:
    """Parse the shape keys present in ``d`` into Shape constructor kwargs (other keys are
    left alone: a link's mapping holds its endpoints too)."""
    out: dict[str, Any] = {}
    for key in SHAPE_KEYS:
        if key not in d:
            continue
        v = d[key]
        if key == "limit":
            out["limit"] = _limit(v, path)
            continue
        try:
            out[key] = _PARSERS[key](v)
        except UnitError as e:
            raise TopologyError(f"{path}.{key}", str(e)) from None
    return out


def _limit(v: Any, path: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_LIMIT:
        raise TopologyError(f"{path}.limit", f"limit must be a number of packets (1..{MAX_LIMIT}), got {v!r}")
    return v


def shape_mapping(value: Any, path: str) -> dict:
    """A mapping that holds shape keys only (a direction, ``defaults.link``, a saved shape)."""
    d = mapping(value, path, "a link shape")
    unknown_keys(d, SHAPE_KEYS, path)
    return d


def check_shape(shape: Shape, path: str) -> Shape:
    """Rules on a whole shape (each value is already valid on its own)."""
    if shape.jitter and not shape.delay:
        raise TopologyError(f"{path}.jitter", f"jitter {shape.jitter} needs a delay",
                            "set delay too, e.g. delay: 10ms, jitter: 1ms")
    if shape.queue_packets > MAX_LIMIT:
        raise TopologyError(path, f"{shape.describe()} needs a queue of {shape.queue_packets} packets "
                            f"(2x rate x delay), more than {MAX_LIMIT}",
                            "lower the rate or the delay, or set limit: explicitly")
    return shape


def shape_from_dict(d: Any, path: str = "shape") -> Shape:
    """A Shape from its ``to_dict`` form (state and ledger files), validated like YAML."""
    d = shape_mapping(d, path)
    return check_shape(Shape(**shape_fields(d, path)), path)


def parse_shape_values(values: dict[str, Any], flags: dict[str, str]) -> dict[str, Any]:
    """Shape fields given on the command line (``{"rate": "100mbit", ...}``), checked by
    exactly the rules of the topology loader; errors name the flag (``flags[key]``)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        try:
            out.update(shape_fields({key: value}, "x"))
        except TopologyError as e:
            raise TopologyError(flags[key], e.message.split(": ", 1)[-1], e.hint) from None
    return out
