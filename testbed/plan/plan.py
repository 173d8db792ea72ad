"""Plan: the ordered list of small actions that realises a Topology, as data.

:func:`testbed.engine.planner.make_plan` makes it (pure; no I/O); ``testbed up --dry-run`` prints it. :mod:`testbed.engine.apply` executes it, writing each
action to the ledger before performing it; the actions themselves (:mod:`testbed.plan.actions`)
know how to apply and undo themselves. What a worker node is made of is its backend's
business (:meth:`Backend.plan_node`); every later action reaches the node's interfaces
through the namespace that the backend's actions named. Actions are ordered so that each
worker's namespace is created, wired and shaped in one stretch (the executor keeps few
netlink sockets open, even at 1024 workers).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Iterable

from testbed.plan.actions import Action
from testbed.common.errors import TopologyError
from testbed.model.topology import LOCAL_HOST as LOCAL
from testbed.model.topology import Topology

PINNED_INDEX_BASE = 1 << 20
DEFAULT_SUBNETS = tuple(ipaddress.IPv4Network(f"10.{b}.0.0/16") for b in range(200, 255)) + tuple(
    ipaddress.IPv4Network(f"172.{b}.0.0/16") for b in range(24, 32)
)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    kind: str
    backend: str | None
    netns: str
    iface: str | None
    address: str | None
    rank: int | None = None
    gpu: int | None = None
    host: str = LOCAL
    own_gpu: bool = False
    """The node has a GPU of its own that only it sees (a VM's passed-through one): inside, it
    is GPU 0 whatever ``gpu`` says (Backend.own_gpu decides, when planned)."""


@dataclass(frozen=True)
class Endpoint:
    """Where one direction of a link is shaped: the egress interface of its source end,
    addressed as (host, namespace handle, interface name)."""

    ns: str
    ifname: str
    host: str = LOCAL


@dataclass
class Plan:
    topology: Topology
    subnet: ipaddress.IPv4Network
    actions: list[Action] = field(default_factory=list)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    egress: dict[tuple[int, str], Endpoint] = field(default_factory=dict)
    """(link index, 'forward'|'reverse') -> the interface whose egress carries that direction."""
    placement: list[str] = field(default_factory=list)
    """The host each action runs on (parallel to ``actions``)."""

    def add(self, host: str, *actions: Action) -> None:
        self.actions.extend(actions)
        self.placement.extend(host for _ in actions)

    def share(self, host: str) -> list[Action]:
        """The actions host ``host`` performs (in plan order)."""
        if not self.placement:
            return list(self.actions) if host == LOCAL else []
        return [a for a, h in zip(self.actions, self.placement) if h == host]

    @property
    def hosts(self) -> list[str]:
        """The hosts with a share, the local one first when it has one."""
        return list(dict.fromkeys(sorted(self.placement or [LOCAL], key=lambda h: h != LOCAL)))

    @property
    def namespaces(self) -> list[str]:
        """The namespaces the local host creates."""
        return [a.ns for a in self.share(LOCAL) if a.creates_namespace]  # type: ignore[attr-defined]  # such has ns

    def namespaces_on(self, host: str) -> list[str]:
        return [a.ns for a in self.share(host) if a.creates_namespace]  # type: ignore[attr-defined]  # such has ns


def vni_base(testbed: str) -> int:
    """The first VXLAN network identifier of a testbed's links: a slot of 4096 per testbed
    name (link i gets base + i), so that two testbeds between the same hosts rarely clash."""
    import zlib

    return (zlib.crc32(testbed.encode()) % 4000 + 1) * 4096


def choose_subnet(topology: Topology, host_routes: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The topology's subnet if clear of the host's routes, else the first clear default."""
    routes = [r for r in host_routes if r.prefixlen > 0]
    if topology.subnet is not None:
        for r in routes:
            if topology.subnet.overlaps(r):
                raise TopologyError("subnet", f"{topology.subnet} overlaps the host route {r}",
                                    "choose a range the host does not use (see `ip route`), e.g. 10.77.0.0/16")
        return topology.subnet
    for cand in DEFAULT_SUBNETS:
        if not any(cand.overlaps(r) for r in routes):
            return cand
    raise TopologyError("subnet", "every default data-plane range overlaps a host route",
                        "set subnet: explicitly in the topology")
