"""Topology files: YAML -> :class:`Topology` (frozen data, no I/O beyond reading the file).

The format is close to containerlab's (``nodes:`` mapping, ``links: - endpoints: [a, b]``).
Every error names the YAML path of the offending value (``links[3].rate``) and says how
to fix it. Checks that need the running kernel (netem present, subnet free of the host's
routes) happen in :mod:`testbed.plan.plan`'s preflight, still before anything is created.

:func:`load_topology_dict` reads the document section by section; each section has a
module of its own (its data class and its rules):

- :mod:`~testbed.model.yamlfile`: the file itself (shipped names, strict YAML)
- :mod:`~testbed.model.fields`: checks of single values the sections share
- :mod:`~testbed.model.defaults`, :mod:`~testbed.model.sysctls`: ``defaults:``, ``sysctls:``
- :mod:`~testbed.model.hosts`: ``hosts:`` and ``vxlan:`` (several machines)
- :mod:`~testbed.model.nodes`, :mod:`~testbed.model.links`: ``nodes:``, ``links:``
- :mod:`~testbed.model.backend_options`, :mod:`~testbed.model.link_types`: the registries of
  backends and link types, and the keys each takes
- :mod:`~testbed.model.shapes`, :mod:`~testbed.model.schedules`: a link's shapes and schedule
- :mod:`~testbed.model.graph`, :mod:`~testbed.model.placement`: the whole graph; which host runs what

Every public name of those modules that callers use is importable from here too.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from testbed.common.errors import TestbedError, TopologyError
from testbed.model.defaults import parse_defaults
from testbed.model.fields import (MAX_NODE_NAME, MAX_TESTBED_NAME, NAME_RE, RESERVED_NAMES, check_testbed_name,
                                  mapping, unknown_keys)
from testbed.model.flows import Flow, flow_from_dict
from testbed.model.graph import MAX_BRIDGE_PORTS, check_graph
from testbed.model.hosts import (DEFAULT_VXLAN_PORT, DNS_RE, LOCAL_HOST, MIN_INNER_MTU, PROGRAM_RE, USER_RE,
                                 VXLAN_OVERHEAD, Host, host_from_json, parse_hosts, parse_tunnel, parse_vxlan)
from testbed.model.links import Link, parse_links, type_links
from testbed.model.nodes import NODE_KINDS, Node, parse_nodes
from testbed.model.placement import check_placement, place_workers
from testbed.model.shapes import (DEFAULT_RATE, DIRECTIONS, MAX_LIMIT, MTU_BYTES, Shape, check_shape,
                                  parse_shape_values, shape_from_dict)
from testbed.model.sysctls import SYSCTL_KEY_RE, SYSCTL_VALUE_RE
from testbed.model.yamlfile import SHIPPED_DIR, read_topology_file, shipped

__all__ = [
    # the topology and loading it
    "Topology", "load_topology", "load_topology_dict", "shipped", "SHIPPED_DIR", "TOP_KEYS",
    # its parts, re-exported from their modules
    "Shape", "Node", "Link", "Host", "DIRECTIONS", "LOCAL_HOST",
    "check_shape", "shape_from_dict", "parse_shape_values", "check_testbed_name", "host_from_json",
    "NAME_RE", "MAX_NODE_NAME", "MAX_TESTBED_NAME", "RESERVED_NAMES", "DEFAULT_RATE", "MAX_LIMIT", "MTU_BYTES",
    "NODE_KINDS", "MAX_BRIDGE_PORTS", "VXLAN_OVERHEAD", "DEFAULT_VXLAN_PORT", "MIN_INNER_MTU", "DNS_RE", "USER_RE",
    "PROGRAM_RE", "SYSCTL_KEY_RE", "SYSCTL_VALUE_RE", "TestbedError", "TopologyError",
]

TOP_KEYS = ("name", "defaults", "nodes", "links", "subnet", "traffic", "hosts", "vxlan", "tunnel")
REQUIRED_KEYS = ("name", "nodes", "links")


@dataclass(frozen=True)
class Topology:
    """A validated topology. Pure data; :mod:`testbed.plan.plan` turns it into actions."""

    name: str
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    subnet: ipaddress.IPv4Network | None = None
    """Data-plane subnet; None means 'choose one clear of the host's routes at up time'."""
    source: str | None = field(default=None, compare=False)
    traffic: tuple[Flow, ...] = ()
    """Cross-traffic flows that run alongside every ``testbed run`` (:mod:`testbed.runs.traffic`)."""
    hosts: tuple[Host, ...] = ()
    """Remote machines (SSH); the local host is implicit."""
    vxlan_port: int = DEFAULT_VXLAN_PORT
    """UDP port of the tunnels that carry links between hosts."""
    mtu: int | None = None
    """Data-plane MTU of every link; None: 1500, or 1450 when a link crosses hosts."""
    tunnel_port: int | None = None
    """First UDP port of the ``tunnel`` links (link i: this + i); None: derived at up."""

    @property
    def multi_host(self) -> bool:
        return any(n.host != LOCAL_HOST for n in self.nodes)

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    @property
    def data_mtu(self) -> int:
        """The MTU every data-plane interface gets: one L2 domain, so one MTU (a bridge
        drops a frame too big for the port it leaves by)."""
        if self.mtu is not None:
            return self.mtu
        crosses = any(self.node(l.a).host != self.node(l.b).host for l in self.links)
        return 1500 - VXLAN_OVERHEAD if crosses else 1500

    @property
    def workers(self) -> tuple[Node, ...]:
        """Workers in topology order: rank r runs on workers[r]."""
        return tuple(n for n in self.nodes if n.is_worker)

    @property
    def switches(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if not n.is_worker)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def needs_netem(self) -> bool:
        return any(l.forward.needs_netem or l.reverse.needs_netem or (l.schedule is not None and l.schedule.needs_netem)
                   for l in self.links)

    def worker_link(self, worker: str) -> Link:
        for l in self.links:
            if worker in l.endpoints:
                return l
        raise KeyError(worker)

    def with_links(self, links: Iterable[Link]) -> "Topology":
        return replace(self, links=tuple(links))

    def to_dict(self) -> dict:
        """The canonical YAML/JSON form; ``load_topology_dict(t.to_dict()) == t``."""
        out: dict[str, Any] = {"name": self.name, "nodes": {n.name: n.to_dict() for n in self.nodes},
                               "links": [l.to_dict() for l in self.links]}
        if self.subnet is not None:
            out["subnet"] = str(self.subnet)
        if self.traffic:
            out["traffic"] = [f.to_dict() for f in self.traffic]
        if self.hosts:
            out["hosts"] = [h.to_dict() for h in self.hosts]
        if self.vxlan_port != DEFAULT_VXLAN_PORT or self.mtu is not None:
            out["vxlan"] = {"port": self.vxlan_port, **({"mtu": self.mtu} if self.mtu is not None else {})}
        if self.tunnel_port is not None:
            out["tunnel"] = {"port": self.tunnel_port}
        return out


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; a bare name (``three_switch``) that is no file
    here is one of the shipped topologies."""
    data, source = read_topology_file(path)
    return load_topology_dict(data, source=source)


def load_topology_dict(data: Any, source: str | None = None) -> Topology:
    """Validate an already-parsed topology mapping (the YAML document), section by section
    in this order; the first error stops it."""
    top = _check_document(data)
    name = check_testbed_name(top["name"])
    defaults = parse_defaults(top.get("defaults"))
    hosts = parse_hosts(top.get("hosts"))
    vxlan_port, mtu = parse_vxlan(top.get("vxlan"))
    tunnel_port = parse_tunnel(top.get("tunnel"))
    nodes = parse_nodes(top["nodes"], defaults, {h.name for h in hosts} | {LOCAL_HOST})
    by_name = {n.name: n for n in nodes}
    links = parse_links(top["links"], by_name, defaults.link)
    check_graph(by_name, links)
    nodes = place_workers(nodes, links)
    check_placement(nodes, hosts)
    links = type_links(links, {n.name: n.host for n in nodes})
    workers = [n.name for n in nodes if n.is_worker]
    subnet = _parse_subnet(top["subnet"], len(workers)) if "subnet" in top else None
    traffic = _parse_traffic(top.get("traffic"), set(workers))
    return Topology(name=name, nodes=tuple(nodes), links=tuple(links), subnet=subnet, source=source, traffic=traffic,
                    hosts=hosts, vxlan_port=vxlan_port, mtu=mtu, tunnel_port=tunnel_port)


def _check_document(data: Any) -> dict:
    """A mapping of the known top-level keys, with the required ones."""
    top = mapping(data, "", "the topology document")
    unknown_keys(top, TOP_KEYS, "")
    for required in REQUIRED_KEYS:
        if required not in top:
            raise TopologyError(required, "missing", f"every topology needs '{required}:'")
    return top


def _parse_subnet(s: Any, workers: int) -> ipaddress.IPv4Network:
    """``subnet:``: an IPv4 network with an address for every worker, in a range one may route."""
    try:
        subnet = ipaddress.ip_network(s, strict=True) if isinstance(s, str) else None
    except ValueError as e:
        raise TopologyError("subnet", f"{s!r} is not a network: {e}", "write e.g. subnet: 10.77.0.0/24") from None
    if not isinstance(subnet, ipaddress.IPv4Network):
        raise TopologyError("subnet", f"{s!r} is not an IPv4 network", "write e.g. subnet: 10.77.0.0/24")
    if subnet.num_addresses - 2 < workers:
        raise TopologyError("subnet", f"{subnet} has room for {max(subnet.num_addresses - 2, 0)} "
                            f"addresses but there are {workers} workers", "use a shorter prefix")
    if subnet.is_loopback or subnet.is_multicast or subnet.is_link_local:
        raise TopologyError("subnet", f"{subnet} is a loopback/multicast/link-local range",
                            "use a private range such as 10.77.0.0/16")
    return subnet


def _parse_traffic(value: Any, workers: set[str]) -> tuple[Flow, ...]:
    """``traffic:``: cross-traffic flows (:mod:`testbed.model.flows`) between workers."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TopologyError("traffic", "must be a list of flows", "write e.g. traffic: [{from: w0, to: w7}]")
    flows = []
    for i, item in enumerate(value):
        try:
            f = flow_from_dict(item, f"traffic[{i}]")
        except TestbedError as e:
            raise TopologyError("", e.message, e.hint) from None
        for k, n in (("from", f.src), ("to", f.dst)):
            if n not in workers:
                raise TopologyError(f"traffic[{i}].{k}", f"{n!r} is not a worker",
                                    f"workers: {', '.join(sorted(workers)[:12])}")
        flows.append(f)
    return tuple(flows)
