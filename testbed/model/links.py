"""``links:``: point-to-point connections between two nodes, each direction shaped on its
own (``forward`` a->b, ``reverse`` b->a), optionally following a schedule, each of a type
(``type:``, :mod:`testbed.model.link_types`: veth, vxlan, or one registered) that may take
keys of its own."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from testbed.common.errors import TopologyError, shown
from testbed.model.fields import MAX_NODE_NAME, mapping, unknown_keys
from testbed.model.link_types import LINK_TYPES, check_own_keys, check_type, choose_type, own_keys
from testbed.model.nodes import Node
from testbed.model.schedules import parse_link_schedule, schedule_to_list
from testbed.model.shapes import DIRECTIONS, SHAPE_KEYS, Shape, check_shape, shape_fields, shape_mapping
from testbed.model.trace import Trace

LINK_KEYS = ("endpoints", "name", "type", "bottleneck", "forward", "reverse", "schedule", "loop", *SHAPE_KEYS)
"""Keys every link takes, whatever its type; a type may take keys of its own."""


@dataclass(frozen=True)
class Link:
    """A point-to-point connection; ``forward`` shapes a->b, ``reverse`` b->a."""

    index: int
    a: str
    b: str
    forward: Shape
    reverse: Shape
    bottleneck: bool = False
    name: str = ""
    schedule: Trace | None = None
    """Steps both directions follow from ``up`` on (a background replay), ``loop``-ed or not."""
    type: str = ""
    """Its link type (:data:`~testbed.model.link_types.LINK_TYPES`); "" only while loading,
    before the nodes are placed, when ``type:`` was left out."""
    options: tuple[tuple[str, Any], ...] = ()
    """Its type's own keys, validated by that type."""

    @property
    def path(self) -> str:
        return f"links[{self.index}]"

    @property
    def endpoints(self) -> tuple[str, str]:
        return (self.a, self.b)

    def shape(self, direction: str) -> Shape:
        return self.forward if direction == "forward" else self.reverse

    def to_dict(self) -> dict:
        """The link's item under ``links:``, each direction's shape written out in full."""
        d: dict[str, Any] = {"endpoints": [self.a, self.b], "name": self.name}
        if self.type:
            d["type"] = self.type
            d.update(LINK_TYPES[self.type].export(self.options))
        if self.bottleneck:
            d["bottleneck"] = True
        d["forward"] = self.forward.to_dict()
        d["reverse"] = self.reverse.to_dict()
        if self.schedule is not None:
            d["schedule"] = schedule_to_list(self.schedule)
            if self.schedule.loop:
                d["loop"] = True
        return d


class _Seen:
    """What earlier links took: node pairs and link names (each to its link's index)."""

    def __init__(self) -> None:
        self.pairs: dict[frozenset, int] = {}
        self.names: dict[str, int] = {}


def parse_links(value: Any, by_name: dict[str, Node], default_shape: Shape) -> list[Link]:
    """``links:`` in file order; each between two defined nodes, no pair or name twice."""
    if not isinstance(value, list):
        raise TopologyError("links", f"expected a list of links, got {type(value).__name__}",
                            "write links as '- endpoints: [a, b]' items")
    seen = _Seen()
    return [_link(i, spec, by_name, default_shape, seen) for i, spec in enumerate(value)]


def _link(i: int, spec: Any, by_name: dict[str, Node], default_shape: Shape, seen: _Seen) -> Link:
    path = f"links[{i}]"
    spec = mapping(spec, path, "endpoints and shape")
    unknown_keys(spec, LINK_KEYS + own_keys(), path)
    given = check_type(spec["type"], path).name if "type" in spec else None
    options = check_own_keys(spec, given, path)
    a, b = _endpoints(spec.get("endpoints"), path, by_name)
    _check_new_pair(a, b, i, path, seen)
    bottleneck = spec.get("bottleneck", False)
    if not isinstance(bottleneck, bool):
        raise TopologyError(f"{path}.bottleneck", f"must be true or false, got {bottleneck!r}")
    name = _new_link_name(spec.get("name", f"{a}-{b}"), i, path, seen)
    shapes = _direction_shapes(spec, path, default_shape)
    schedule = parse_link_schedule(spec, path, shapes)
    return Link(i, a, b, shapes["forward"], shapes["reverse"], bottleneck, name, schedule, given or "", options)


def type_links(links: list[Link], host_of: dict[str, str]) -> list[Link]:
    """Each link with its type: the one written, if it joins its ends' hosts, else the
    automatic one for them (``host_of``: node name -> host, once nodes are placed)."""
    return [replace(l, type=choose_type(l.type or None, host_of[l.a], host_of[l.b], l.name, l.path)) for l in links]


def _endpoints(eps: Any, path: str, by_name: dict[str, Node]) -> tuple[str, str]:
    """Two names of defined nodes, not the same one."""
    if not isinstance(eps, list) or len(eps) != 2 or not all(isinstance(e, str) for e in eps):
        raise TopologyError(f"{path}.endpoints", f"expected two node names, got {eps!r}", "write endpoints: [w0, s1]")
    for j, e in enumerate(eps):
        if e not in by_name:
            raise TopologyError(f"{path}.endpoints[{j}]", f"node '{e}' is not defined",
                                f"define it under nodes:, or use one of: {', '.join(list(by_name)[:12])}")
    a, b = eps
    if a == b:
        raise TopologyError(f"{path}.endpoints", f"link from '{a}' to itself")
    return a, b


def _check_new_pair(a: str, b: str, i: int, path: str, seen: _Seen) -> None:
    pair = frozenset((a, b))
    if pair in seen.pairs:
        raise TopologyError(f"{path}.endpoints", f"duplicate link {a}-{b} (same as links[{seen.pairs[pair]}])",
                            "remove one; to change its shape, edit the first")
    seen.pairs[pair] = i


def _new_link_name(name: Any, i: int, path: str, seen: _Seen) -> str:
    if not isinstance(name, str) or not name or len(name) > 2 * MAX_NODE_NAME + 1 or not name.isprintable():
        raise TopologyError(f"{path}.name", f"invalid link name {shown(name)}",
                            f"printable characters, at most {2 * MAX_NODE_NAME + 1} of them")
    if name in seen.names:
        raise TopologyError(f"{path}.name", f"link name '{name}' is used by links[{seen.names[name]}] too",
                            "give one of them a distinct name:")
    seen.names[name] = i
    return name


def _direction_shapes(spec: dict, path: str, default_shape: Shape) -> dict[str, Shape]:
    """Each direction's shape: the defaults, overridden by the link's own shape keys, then
    by the direction's block. An error of a direction block's shape names that block."""
    both = shape_fields(spec, path)
    shapes = {}
    for d in DIRECTIONS:
        dspec = shape_mapping({} if spec.get(d) is None else spec[d], f"{path}.{d}")
        fields = {**default_shape.__dict__, **both, **shape_fields(dspec, f"{path}.{d}")}
        shapes[d] = check_shape(Shape(**fields), f"{path}.{d}" if dspec else path)
    return shapes
