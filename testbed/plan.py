"""Plan: a Topology becomes an ordered list of small actions (pure; no I/O).

``testbed up --dry-run`` prints the plan. :mod:`testbed.apply` executes it, writing each
action to the ledger before performing it; the actions themselves (:mod:`testbed.actions`)
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

from . import naming
from .actions import Action, AddAddress, CreateBridge, CreateNetns, CreateVeth, SetSysctl, ShapeEgress
from .errors import TopologyError
from .hosts import LOCAL
from .topology import Topology

PINNED_INDEX_BASE = 1 << 20
DEFAULT_SUBNETS = tuple(ipaddress.ip_network(f"10.{b}.0.0/16") for b in range(200, 255)) + tuple(
    ipaddress.ip_network(f"172.{b}.0.0/16") for b in range(24, 32)
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

    @property
    def namespaces(self) -> list[str]:
        return [a.ns for a in self.actions if a.creates_namespace]


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
    from .backends import get as backend

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
                node = topology.node(node_name)
                b = backend(node.backend)
                if info.netns not in created:
                    if b.host_address:
                        acts.extend(b.plan_node(name, node, info.netns, naming.tag(name)))
                        acts.extend(SetSysctl(info.netns, k, v) for k, v in node.sysctls)
                    else:  # a VM: the guest's eth0 carries the address, its kernel the sysctls
                        acts.extend(b.plan_node(name, node, info.netns, naming.tag(name),
                                                address=f"{info.address}/{subnet.prefixlen}", sysctls=node.sysctls))
                    created.add(info.netns)
                ends[end] = (info.netns, naming.WORKER_IFACE, b.node_master)
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
            if info.kind == "worker" and backend(info.backend).host_address:
                acts.append(AddAddress(info.netns, naming.WORKER_IFACE, info.address, subnet.prefixlen))
        plan.egress[(link.index, "forward")] = Endpoint(na, ia)
        plan.egress[(link.index, "reverse")] = Endpoint(nb, ib)
        acts.append(ShapeEgress(na, ia, link.forward, link.index, "forward"))
        acts.append(ShapeEgress(nb, ib, link.reverse, link.index, "reverse"))
    for bname in dict.fromkeys(w.backend for w in topology.workers):  # e.g. wait for VMs that boot meanwhile
        acts.extend(backend(bname).plan_ready([plan.nodes[w.name] for w in topology.workers if w.backend == bname]))
    return plan
