"""Planning: a Topology becomes a :class:`~testbed.plan.plan.Plan` (pure; no I/O).

What a worker node is made of is its backend's business (:meth:`Backend.plan_node`); every
later action reaches the node's interfaces through the namespace that the backend's actions
named. Actions are ordered so that each worker's namespace is created, wired and shaped in
one stretch (the executor keeps few netlink sockets open, even at 1024 workers).
"""

from __future__ import annotations

import hashlib
import ipaddress

from testbed.common import rootless
from testbed.model.topology import Topology
from testbed.nodes import get as backend
from testbed.nodes.cgroup import CreateCgroup
from testbed.plan import naming
from testbed.plan.actions import AddAddress, CreateBridge, CreateNetns, ShapeEgress, StaticNeighbours
from testbed.plan.links import End, LinkContext, kind_for
from testbed.plan.plan import PINNED_INDEX_BASE, Endpoint, NodeInfo, Plan
from testbed.plan.tunnel_action import GSO_MAX_SIZE

def make_plan(topology: Topology, subnet: ipaddress.IPv4Network, underlays: dict[str, str] | None = None) -> Plan:
    """``underlays``: each host's tunnel address (the local one found at preflight); needed
    only when a link crosses hosts."""
    plan = Plan(topology, subnet)
    _node_table(plan)
    tunnels = any(l.type == "tunnel" for l in topology.links)
    ctx = LinkContext(topology.name, topology.data_mtu, underlays, topology.vxlan_port, _IndexAllocator(),
                      tunnel_port(topology), GSO_MAX_SIZE if tunnels else None)
    _switches(plan, ctx)
    made: set[str] = set()
    for link in topology.links:
        _link(plan, ctx, link, made)
    _neighbours(plan)
    for h in dict.fromkeys(n.host for n in topology.nodes):  # what `exec` and `run` start in a node joins it
        plan.add(h, CreateCgroup(topology.name))
    _ready(plan)
    return plan


TUNNEL_PORTS = (20000, 60000)
"""Where a testbed's derived tunnel ports start: [20000, 60000), its links above that."""


def tunnel_port(topology: Topology) -> int:
    """The first UDP port of the testbed's tunnel links: ``tunnel: {port}``, else derived from
    its name and the user's uid (as the host knows it), so two users' testbeds, and one
    user's testbeds of different names, rarely meet on one port; the same on every host."""
    if topology.tunnel_port is not None:
        return topology.tunnel_port
    low, high = TUNNEL_PORTS
    digest = hashlib.sha256(f"{rootless.outer_uid()}/{topology.name}".encode()).digest()
    return low + int.from_bytes(digest[:4], "big") % (high - low)


def _node_table(plan: Plan) -> None:
    """Every node's kernel names, data-plane address and rank (workers in topology order)."""
    topology, name = plan.topology, plan.topology.name
    hosts = plan.subnet.hosts()
    for rank, w in enumerate(topology.workers):
        plan.nodes[w.name] = NodeInfo(w.name, "worker", w.backend, naming.node_netns(name, w.name),
                                      naming.WORKER_IFACE, str(next(hosts)), rank, w.gpu, w.host,
                                      backend(w.backend).own_gpu(w))
    for i, s in enumerate(topology.switches):
        plan.nodes[s.name] = NodeInfo(s.name, "switch", None, naming.fabric_netns(name), naming.bridge_ifname(i),
                                      None, host=s.host)


class _IndexAllocator:
    """Interfaces created locally get their index from the plan, so applying it needs no
    lookup by name. The range starts far above what the kernel hands out by itself (veth
    peers, fallback tunnel devices some modules add to every new namespace), so pinned and
    automatic indexes never collide. pyroute2 cannot pin a veth peer's index."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], int] = {}

    def __call__(self, host: str, ns: str) -> int:
        self.last[(host, ns)] = self.last.get((host, ns), PINNED_INDEX_BASE - 1) + 1
        return self.last[(host, ns)]


def _switches(plan: Plan, ctx: LinkContext) -> None:
    """A fabric namespace on each host with switches, holding a bridge per switch."""
    topology = plan.topology
    fabric = naming.fabric_netns(topology.name)
    for h in dict.fromkeys(s.host for s in topology.switches):
        plan.add(h, CreateNetns(fabric, naming.tag(topology.name)))
        for s in topology.switches:
            if s.host == h:
                info = plan.nodes[s.name]
                assert info.iface is not None  # a switch has its bridge (_node_table)
                plan.add(h, CreateBridge(fabric, info.iface, s.name, s.stp, ctx.alloc(h, fabric)))


def _end(plan: Plan, link, end: str, node_name: str, made: set[str]) -> End:
    """One end of ``link``: a worker's eth0 (its node made first, once) or a switch port."""
    info = plan.nodes[node_name]
    topology = plan.topology
    if info.kind != "worker":
        return End(info.netns, naming.link_end_ifname(link.index, end), info.iface, info.host)
    b = backend(info.backend)
    if info.netns not in made:
        node = topology.node(node_name)
        plan.add(info.host, *b.plan_node(topology.name, node, info.netns, naming.tag(topology.name),
                                         f"{info.address}/{plan.subnet.prefixlen}", node.sysctls))
        made.add(info.netns)
    return End(info.netns, naming.WORKER_IFACE, b.node_master, info.host)


def _link(plan: Plan, ctx: LinkContext, link, made: set[str]) -> None:
    """Make ``link`` by its type's kind, address its workers, and shape each direction on its egress."""
    a, b = _end(plan, link, "a", link.a, made), _end(plan, link, "b", link.b, made)
    for host, action in kind_for(link).plan(ctx, link, a, b):
        plan.add(host, action)
    for node_name in (link.a, link.b):
        info = plan.nodes[node_name]
        if info.kind == "worker" and backend(info.backend).host_address:
            assert info.address is not None and info.rank is not None  # a worker has both (_node_table)
            plan.add(info.host, AddAddress(info.netns, naming.WORKER_IFACE, info.address, plan.subnet.prefixlen,
                                           naming.worker_mac(plan.topology.name, info.rank)))
    plan.egress[(link.index, "forward")] = Endpoint(a.ns, a.ifname, a.host)
    plan.egress[(link.index, "reverse")] = Endpoint(b.ns, b.ifname, b.host)
    plan.add(a.host, ShapeEgress(a.ns, a.ifname, link.forward, link.index, "forward"))
    plan.add(b.host, ShapeEgress(b.ns, b.ifname, link.reverse, link.index, "reverse"))


def _neighbours(plan: Plan) -> None:
    """Every worker whose address the host sets (its kernel is the host's) gets permanent ARP
    entries for the others of its kind (StaticNeighbours says why); a VM's guest, with its
    own kernel and MAC, resolves and is resolved by ARP as usual."""
    static = [plan.nodes[w.name] for w in plan.topology.workers if backend(w.backend).host_address]
    for info in static:
        entries = tuple(f"{p.address} {naming.worker_mac(plan.topology.name, p.rank or 0)}"
                        for p in static if p is not info)
        if entries:
            plan.add(info.host, StaticNeighbours(info.netns, naming.WORKER_IFACE, entries))


def _ready(plan: Plan) -> None:
    """What each backend waits for at the end (e.g. VMs that booted meanwhile), per host."""
    workers = plan.topology.workers
    for bname in dict.fromkeys(w.backend for w in workers):
        for h in dict.fromkeys(w.host for w in workers if w.backend == bname):
            plan.add(h, *backend(bname).plan_ready([plan.nodes[w.name] for w in workers
                                                    if w.backend == bname and w.host == h]))
