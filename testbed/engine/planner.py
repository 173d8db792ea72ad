"""Planning: a Topology becomes a :class:`~testbed.plan.plan.Plan` (pure; no I/O).

What a worker node is made of is its backend's business (:meth:`Backend.plan_node`); every
later action reaches the node's interfaces through the namespace that the backend's actions
named. Actions are ordered so that each worker's namespace is created, wired and shaped in
one stretch (the executor keeps few netlink sockets open, even at 1024 workers).
"""

from __future__ import annotations

import ipaddress

from testbed.common.errors import TopologyError
from testbed.model.topology import Topology
from testbed.nodes import get as backend
from testbed.plan import naming
from testbed.plan.actions import AddAddress, CreateBridge, CreateNetns, CreateVeth, CreateVxlan, SetSysctl, ShapeEgress
from testbed.plan.plan import PINNED_INDEX_BASE, Endpoint, NodeInfo, Plan, vni_base

def make_plan(topology: Topology, subnet: ipaddress.IPv4Network, underlays: dict[str, str] | None = None) -> Plan:
    """``underlays``: each host's tunnel address (the local one found at preflight); needed
    only when a link crosses hosts."""
    name = topology.name
    fabric = naming.fabric_netns(name)
    plan = Plan(topology, subnet)
    hosts = subnet.hosts()
    mtu = topology.data_mtu
    veth_mtu = None if mtu == 1500 else mtu
    switch_index = {s.name: i for i, s in enumerate(topology.switches)}
    for rank, w in enumerate(topology.workers):
        plan.nodes[w.name] = NodeInfo(w.name, "worker", w.backend, naming.node_netns(name, w.name),
                                      naming.WORKER_IFACE, str(next(hosts)), rank, w.gpu, w.host)
    for s in topology.switches:
        plan.nodes[s.name] = NodeInfo(s.name, "switch", None, fabric, naming.bridge_ifname(switch_index[s.name]), None,
                                      host=s.host)

    # Interfaces created locally get their index from the plan, so applying it needs no
    # lookup by name. The range starts far above what the kernel hands out by itself
    # (veth peers, fallback tunnel devices some modules add to every new namespace), so
    # pinned and automatic indexes never collide. pyroute2 cannot pin a veth peer's index.
    next_index: dict[tuple[str, str], int] = {}

    def alloc(host: str, ns: str) -> int:
        next_index[(host, ns)] = next_index.get((host, ns), PINNED_INDEX_BASE - 1) + 1
        return next_index[(host, ns)]

    for h in dict.fromkeys(s.host for s in topology.switches):  # a fabric namespace per host with switches
        plan.add(h, CreateNetns(fabric, naming.tag(name)))
        for s in topology.switches:
            if s.host == h:
                plan.add(h, CreateBridge(fabric, naming.bridge_ifname(switch_index[s.name]), s.name, s.stp,
                                         alloc(h, fabric)))

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
                        plan.add(info.host, *b.plan_node(name, node, info.netns, naming.tag(name)))
                        plan.add(info.host, *(SetSysctl(info.netns, k, v) for k, v in node.sysctls))
                    else:  # a VM: the guest's eth0 carries the address, its kernel the sysctls
                        plan.add(info.host, *b.plan_node(name, node, info.netns, naming.tag(name),
                                                         address=f"{info.address}/{subnet.prefixlen}",
                                                         sysctls=node.sysctls))
                    created.add(info.netns)
                ends[end] = (info.netns, naming.WORKER_IFACE, b.node_master, info.host)
            else:
                ends[end] = (fabric, naming.link_end_ifname(link.index, end), info.iface, info.host)
        (na, ia, ma, ha), (nb, ib, mb, hb) = ends["a"], ends["b"]
        if ha == hb:
            # Create from the switch side when there is one: the bridge lives there.
            if ma is None and mb is not None:
                plan.add(ha, CreateVeth(nb, ib, na, ia, master=mb, link=link.index, index=alloc(ha, nb), mtu=veth_mtu))
            else:
                plan.add(ha, CreateVeth(na, ia, nb, ib, master=ma, peer_master=mb, link=link.index,
                                        index=alloc(ha, na), mtu=veth_mtu))
        else:  # the link crosses hosts: a VXLAN device at each end, one VNI per link
            if underlays is None or ha not in underlays or hb not in underlays:
                raise TopologyError(f"{link.path}", f"link {link.name} joins hosts {ha} and {hb}, "
                                    "whose tunnel addresses are not known", "give hosts[].underlay:")
            vni = vni_base(name) + link.index
            for (ns, ifname, master, h), other in (((na, ia, ma, ha), hb), ((nb, ib, mb, hb), ha)):
                plan.add(h, CreateVxlan(ns, ifname, vni, underlays[h], underlays[other], topology.vxlan_port, mtu,
                                        master=master, link=link.index))
        for end, node_name in (("a", link.a), ("b", link.b)):
            info = plan.nodes[node_name]
            if info.kind == "worker" and backend(info.backend).host_address:
                plan.add(info.host, AddAddress(info.netns, naming.WORKER_IFACE, info.address, subnet.prefixlen))
        plan.egress[(link.index, "forward")] = Endpoint(na, ia, ha)
        plan.egress[(link.index, "reverse")] = Endpoint(nb, ib, hb)
        plan.add(ha, ShapeEgress(na, ia, link.forward, link.index, "forward"))
        plan.add(hb, ShapeEgress(nb, ib, link.reverse, link.index, "reverse"))
    for bname in dict.fromkeys(w.backend for w in topology.workers):  # e.g. wait for VMs that boot meanwhile
        for h in dict.fromkeys(w.host for w in topology.workers if w.backend == bname):
            plan.add(h, *backend(bname).plan_ready([plan.nodes[w.name] for w in topology.workers
                                                    if w.backend == bname and w.host == h]))
    return plan
