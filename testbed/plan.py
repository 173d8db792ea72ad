"""Plan: a Topology becomes an ordered list of small actions (pure; no I/O).

``testbed up --dry-run`` prints the plan. :mod:`testbed.net.apply` executes it, writing
each action to the ledger before performing it. Actions are ordered so that each worker's
namespace is created, wired and shaped in one stretch (the executor keeps few netlink
sockets open, even at 1024 workers).
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field
from typing import Iterable, Union

from . import naming
from .errors import TopologyError
from .topology import Shape, Topology

PINNED_INDEX_BASE = 1 << 20
DEFAULT_SUBNETS = tuple(ipaddress.ip_network(f"10.{b}.0.0/16") for b in range(200, 255)) + tuple(
    ipaddress.ip_network(f"172.{b}.0.0/16") for b in range(24, 32)
)


@dataclass(frozen=True)
class CreateNetns:
    ns: str
    tag: str

    def describe(self) -> str:
        return f"netns add {self.ns}  (lo up, alias {self.tag})"


@dataclass(frozen=True)
class CreateBridge:
    ns: str
    ifname: str
    switch: str
    stp: bool = False
    index: int | None = None

    def describe(self) -> str:
        return f"[{self.ns}] bridge {self.ifname} for switch {self.switch}" + (" stp on" if self.stp else "")


@dataclass(frozen=True)
class CreateVeth:
    ns: str
    ifname: str
    peer_ns: str
    peer_ifname: str
    master: str | None = None
    peer_master: str | None = None
    link: int = -1
    index: int | None = None

    def describe(self) -> str:
        m = f" master {self.master}" if self.master else ""
        pm = f" master {self.peer_master}" if self.peer_master else ""
        return f"[{self.ns}] veth {self.ifname}{m} <-> [{self.peer_ns}] {self.peer_ifname}{pm}  (links[{self.link}])"


@dataclass(frozen=True)
class AddAddress:
    ns: str
    ifname: str
    address: str
    prefixlen: int

    def describe(self) -> str:
        return f"[{self.ns}] addr {self.address}/{self.prefixlen} dev {self.ifname} up"


@dataclass(frozen=True)
class SetSysctl:
    ns: str
    key: str
    value: str

    def describe(self) -> str:
        return f"[{self.ns}] sysctl {self.key}={self.value}"


@dataclass(frozen=True)
class ShapeEgress:
    ns: str
    ifname: str
    shape: Shape
    link: int
    direction: str

    def describe(self) -> str:
        return f"[{self.ns}] tc htb on {self.ifname}: {self.shape.describe()}  (links[{self.link}] {self.direction})"


Action = Union[CreateNetns, SetSysctl, CreateBridge, CreateVeth, AddAddress, ShapeEgress]
ACTION_TYPES = {c.__name__: c for c in (CreateNetns, SetSysctl, CreateBridge, CreateVeth, AddAddress, ShapeEgress)}


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


@dataclass(frozen=True)
class Endpoint:
    """Where one direction of a link is shaped: the egress interface of its source end."""

    ns: str
    ifname: str


@dataclass
class Plan:
    topology: Topology
    subnet: ipaddress.IPv4Network
    actions: list[Action] = field(default_factory=list)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    egress: dict[tuple[int, str], Endpoint] = field(default_factory=dict)
    """(link index, 'forward'|'reverse') -> the interface whose egress carries that direction."""

    @property
    def namespaces(self) -> list[str]:
        return [a.ns for a in self.actions if isinstance(a, CreateNetns)]


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


def make_plan(topology: Topology, subnet: ipaddress.IPv4Network) -> Plan:
    name = topology.name
    fabric = naming.fabric_netns(name)
    plan = Plan(topology, subnet)
    acts = plan.actions
    hosts = subnet.hosts()
    switch_index = {s.name: i for i, s in enumerate(topology.switches)}
    for rank, w in enumerate(topology.workers):
        plan.nodes[w.name] = NodeInfo(w.name, "worker", w.backend, naming.node_netns(name, w.name),
                                      naming.WORKER_IFACE, str(next(hosts)), rank, w.gpu)
    for s in topology.switches:
        plan.nodes[s.name] = NodeInfo(s.name, "switch", None, fabric, naming.bridge_ifname(switch_index[s.name]), None)

    # Interfaces created locally get their index from the plan, so applying it needs no
    # lookup by name. The range starts far above what the kernel hands out by itself
    # (veth peers, fallback tunnel devices some modules add to every new namespace), so
    # pinned and automatic indexes never collide. pyroute2 cannot pin a veth peer's index.
    next_index: dict[str, int] = {}

    def alloc(ns: str) -> int:
        next_index[ns] = next_index.get(ns, PINNED_INDEX_BASE - 1) + 1
        return next_index[ns]

    if topology.switches:
        acts.append(CreateNetns(fabric, naming.tag(name)))
        for s in topology.switches:
            acts.append(CreateBridge(fabric, naming.bridge_ifname(switch_index[s.name]), s.name, s.stp, alloc(fabric)))

    created: set[str] = set()
    for link in topology.links:
        ends = {}
        for end, node_name in (("a", link.a), ("b", link.b)):
            info = plan.nodes[node_name]
            if info.kind == "worker":
                if info.netns not in created:
                    acts.append(CreateNetns(info.netns, naming.tag(name)))
                    created.add(info.netns)
                    acts.extend(SetSysctl(info.netns, k, v) for k, v in topology.node(node_name).sysctls)
                ends[end] = (info.netns, naming.WORKER_IFACE, None)
            else:
                ends[end] = (fabric, naming.link_end_ifname(link.index, end), info.iface)
        (na, ia, ma), (nb, ib, mb) = ends["a"], ends["b"]
        # Create from the switch side when there is one: the bridge lives there.
        if ma is None and mb is not None:
            acts.append(CreateVeth(nb, ib, na, ia, master=mb, link=link.index, index=alloc(nb)))
        else:
            acts.append(CreateVeth(na, ia, nb, ib, master=ma, peer_master=mb, link=link.index, index=alloc(na)))
        for end, node_name in (("a", link.a), ("b", link.b)):
            info = plan.nodes[node_name]
            if info.kind == "worker":
                acts.append(AddAddress(info.netns, naming.WORKER_IFACE, info.address, subnet.prefixlen))
        plan.egress[(link.index, "forward")] = Endpoint(na, ia)
        plan.egress[(link.index, "reverse")] = Endpoint(nb, ib)
        acts.append(ShapeEgress(na, ia, link.forward, link.index, "forward"))
        acts.append(ShapeEgress(nb, ib, link.reverse, link.index, "reverse"))
    return plan


def action_to_dict(action: Action) -> dict:
    d = asdict(action)
    d["action"] = type(action).__name__
    if isinstance(action, ShapeEgress):
        d["shape"] = action.shape.to_dict()
    return d
