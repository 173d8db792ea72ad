"""Topology files: YAML -> :class:`Topology` (frozen data, no I/O beyond reading the file).

The format is close to containerlab's (``nodes:`` mapping, ``links: - endpoints: [a, b]``).
Every error names the YAML path of the offending value (``links[3].rate``) and says how
to fix it. Checks that need the running kernel (netem present, subnet free of the host's
routes) happen in :mod:`testbed.plan.plan`'s preflight, still before anything is created.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from testbed.common.errors import TestbedError, TopologyError
from testbed.model.trace import Trace, parse_schedule
from testbed.model.backend_options import OPTIONS
from testbed.model.fields import MAX_NODE_NAME, MAX_TESTBED_NAME, NAME_RE, RESERVED_NAMES, check_testbed_name
from testbed.model.fields import check_name as _name, mapping as _mapping, unknown_keys as _unknown_keys
from testbed.model.defaults import parse_defaults
from testbed.model.flows import Flow, flow_from_dict
from testbed.model.hosts import (DEFAULT_VXLAN_PORT, DNS_RE, LOCAL_HOST, MIN_INNER_MTU, PROGRAM_RE, USER_RE,
                                 VXLAN_OVERHEAD, Host, host_from_json, parse_hosts, parse_vxlan)
from testbed.model.shapes import (DEFAULT_RATE, DIRECTIONS, MAX_LIMIT, MTU_BYTES, Shape, check_shape,
                                  parse_shape_values, shape_from_dict)
from testbed.model.shapes import SHAPE_KEYS as _SHAPE_KEYS, check_shape as _check_shape, shape_fields as _shape_fields
from testbed.model.sysctls import SYSCTL_KEY_RE, SYSCTL_VALUE_RE
from testbed.model.sysctls import parse_sysctls as _sysctls
from testbed.model.yamlfile import SHIPPED_DIR, read_topology_file, shipped

NODE_KINDS = ("worker", "switch")
MAX_BRIDGE_PORTS = 1023  # Linux bridge port numbers are 10 bits and 0 is reserved (EXFULL beyond)

_LINK_KEYS = ("endpoints", "name", "bottleneck", "forward", "reverse", "schedule", "loop", *_SHAPE_KEYS)
_TOP_KEYS = ("name", "defaults", "nodes", "links", "subnet", "traffic", "hosts", "vxlan")
_NODE_KEYS = {"worker": ("kind", "backend", "gpu", "sysctls", "host"), "switch": ("kind", "stp", "host")}


@dataclass(frozen=True)
class Node:
    """A worker (runs one rank) or a switch (an L2 bridge)."""

    name: str
    kind: str
    backend: str | None = None
    gpu: int | None = None
    stp: bool = False
    sysctls: tuple[tuple[str, str], ...] = ()
    """Network sysctls set inside the worker's namespace after it is created (key, value)."""
    options: tuple[tuple[str, Any], ...] = ()
    """The backend's own keys (e.g. docker's image, cpus), validated by that backend."""
    host: str = LOCAL_HOST
    """The machine the node is placed on (a ``hosts:`` entry, or the local host)."""

    @property
    def is_worker(self) -> bool:
        return self.kind == "worker"


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

    @property
    def path(self) -> str:
        return f"links[{self.index}]"

    @property
    def endpoints(self) -> tuple[str, str]:
        return (self.a, self.b)

    def shape(self, direction: str) -> Shape:
        return self.forward if direction == "forward" else self.reverse


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
        nodes: dict[str, dict] = {}
        for n in self.nodes:
            d: dict[str, Any] = {"kind": n.kind}
            if n.is_worker:
                d["backend"] = n.backend
                if n.gpu is not None:
                    d["gpu"] = n.gpu
                if n.sysctls:
                    d["sysctls"] = dict(n.sysctls)
                if n.options:
                    d.update(OPTIONS[n.backend].export(n.options))
            elif n.stp:
                d["stp"] = True
            if n.host != LOCAL_HOST:
                d["host"] = n.host
            nodes[n.name] = d
        links = []
        for l in self.links:
            d = {"endpoints": [l.a, l.b], "name": l.name}
            if l.bottleneck:
                d["bottleneck"] = True
            d["forward"] = l.forward.to_dict()
            d["reverse"] = l.reverse.to_dict()
            if l.schedule is not None:
                d["schedule"] = [{"at": f"{st.at_s:g}s", **{k: v for k, v in st.to_dict().items() if k != "at_s"}}
                                 for st in l.schedule.steps]
                if l.schedule.loop:  # the period's end is written as a last step with the first's values
                    first = {k: v for k, v in l.schedule.steps[0].to_dict().items() if k != "at_s"}
                    d["schedule"].append({"at": f"{l.schedule.period_s:g}s", **first})
                    d["loop"] = True
            links.append(d)
        out: dict[str, Any] = {"name": self.name, "nodes": nodes, "links": links}
        if self.subnet is not None:
            out["subnet"] = str(self.subnet)
        if self.traffic:
            out["traffic"] = [f.to_dict() for f in self.traffic]
        if self.hosts:
            out["hosts"] = [h.to_dict() for h in self.hosts]
        if self.vxlan_port != DEFAULT_VXLAN_PORT or self.mtu is not None:
            out["vxlan"] = {"port": self.vxlan_port, **({"mtu": self.mtu} if self.mtu is not None else {})}
        return out


# --------------------------------------------------------------------------- loading


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; a bare name (``three_switch``) that is no file
    here is one of the shipped topologies."""
    data, source = read_topology_file(path)
    return load_topology_dict(data, source=source)


def load_topology_dict(data: Any, source: str | None = None) -> Topology:
    """Validate an already-parsed topology mapping (the YAML document)."""
    top = _mapping(data, "", "the topology document")
    _unknown_keys(top, _TOP_KEYS, "")
    for required in ("name", "nodes", "links"):
        if required not in top:
            raise TopologyError(required, "missing", f"every topology needs '{required}:'")
    name = check_testbed_name(top["name"])

    option_keys = tuple(dict.fromkeys(k for b in OPTIONS.values() for k in b.keys))
    defaults = parse_defaults(top.get("defaults"))
    default_backend, default_options, default_shape = defaults.backend, defaults.options, defaults.link
    default_sysctls = defaults.sysctls

    hosts = parse_hosts(top.get("hosts"))
    host_names = {h.name for h in hosts} | {LOCAL_HOST}
    vxlan_port, mtu = parse_vxlan(top.get("vxlan"))
    nodes_in = _mapping(top["nodes"], "nodes", "node name -> node")
    if not nodes_in:
        raise TopologyError("nodes", "no nodes", "define at least two workers and the switches between them")
    nodes: list[Node] = []
    for nname, spec in nodes_in.items():
        path = f"nodes.{nname}"
        _name(nname, path, MAX_NODE_NAME, "node name")
        spec = _mapping(spec if spec is not None else {}, path, "kind: worker|switch")
        kind = spec.get("kind")
        if kind not in NODE_KINDS:
            raise TopologyError(f"{path}.kind", f"unknown or missing kind {kind!r}",
                                f"choose one of: {', '.join(NODE_KINDS)}")
        _unknown_keys(spec, _NODE_KEYS[kind] + (option_keys if kind == "worker" else ()), path)
        if kind == "worker":
            backend = spec.get("backend", default_backend)
            if not isinstance(backend, str) or backend not in OPTIONS:
                raise TopologyError(f"{path}.backend", f"unknown backend {backend!r}",
                                    f"choose one of: {', '.join(OPTIONS)}")
            impl = OPTIONS[backend]
            # defaults: apply to the workers whose backend takes them; a node's own keys must fit
            opts = {k: v for k, v in default_options.items() if k in impl.keys}
            opts.update({k: spec[k] for k in option_keys if k in spec})
            options = impl.validate(opts, path)
            gpu = spec.get("gpu")
            if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0):
                raise TopologyError(f"{path}.gpu", f"gpu must be a device index >= 0, got {gpu!r}")
            sysctls = {**default_sysctls, **_sysctls(spec.get("sysctls"), f"{path}.sysctls")}
            nodes.append(Node(nname, "worker", backend=backend, gpu=gpu, sysctls=tuple(sysctls.items()),
                              options=options, host=_node_host(spec, path, host_names)))
        else:
            stp = spec.get("stp", False)
            if not isinstance(stp, bool):
                raise TopologyError(f"{path}.stp", f"stp must be true or false, got {stp!r}")
            nodes.append(Node(nname, "switch", stp=stp, host=_node_host(spec, path, host_names) or LOCAL_HOST))
    by_name = {n.name: n for n in nodes}
    workers = [n for n in nodes if n.is_worker]
    if not workers:
        raise TopologyError("nodes", "no workers", "add nodes with kind: worker")

    links_in = top["links"]
    if not isinstance(links_in, list):
        raise TopologyError("links", f"expected a list of links, got {type(links_in).__name__}",
                            "write links as '- endpoints: [a, b]' items")
    links: list[Link] = []
    seen_pairs: dict[frozenset, int] = {}
    names: dict[str, int] = {}
    for i, spec in enumerate(links_in):
        path = f"links[{i}]"
        spec = _mapping(spec, path, "endpoints and shape")
        _unknown_keys(spec, _LINK_KEYS, path)
        eps = spec.get("endpoints")
        if not isinstance(eps, list) or len(eps) != 2 or not all(isinstance(e, str) for e in eps):
            raise TopologyError(f"{path}.endpoints", f"expected two node names, got {eps!r}",
                                "write endpoints: [w0, s1]")
        a, b = eps
        for j, e in enumerate(eps):
            if e not in by_name:
                raise TopologyError(f"{path}.endpoints[{j}]", f"node '{e}' is not defined",
                                    f"define it under nodes:, or use one of: {', '.join(list(by_name)[:12])}")
        if a == b:
            raise TopologyError(f"{path}.endpoints", f"link from '{a}' to itself")
        pair = frozenset((a, b))
        if pair in seen_pairs:
            raise TopologyError(f"{path}.endpoints", f"duplicate link {a}-{b} (same as links[{seen_pairs[pair]}])",
                                "remove one; to change its shape, edit the first")
        seen_pairs[pair] = i
        bottleneck = spec.get("bottleneck", False)
        if not isinstance(bottleneck, bool):
            raise TopologyError(f"{path}.bottleneck", f"must be true or false, got {bottleneck!r}")
        lname = spec.get("name", f"{a}-{b}")
        if not isinstance(lname, str) or not lname or len(lname) > 2 * MAX_NODE_NAME + 1:
            raise TopologyError(f"{path}.name", f"invalid link name {lname!r}")
        if lname in names:
            raise TopologyError(f"{path}.name", f"link name '{lname}' is used by links[{names[lname]}] too",
                                "give one of them a distinct name:")
        names[lname] = i
        both = _shape_fields(spec, path)
        dirs = {}
        for d in ("forward", "reverse"):
            dspec = _mapping(spec.get(d) or {}, f"{path}.{d}", "a link shape")
            _unknown_keys(dspec, _SHAPE_KEYS, f"{path}.{d}")
            fields = {**default_shape.__dict__, **both, **_shape_fields(dspec, f"{path}.{d}")}
            dirs[d] = _check_shape(Shape(**fields), f"{path}.{d}" if dspec else path)
        schedule = _schedule(spec, path, dirs)
        links.append(Link(i, a, b, dirs["forward"], dirs["reverse"], bottleneck, lname, schedule))

    _check_graph(by_name, links)
    nodes = _place(nodes, links)
    by_name = {n.name: n for n in nodes}
    if any(n.host != LOCAL_HOST for n in nodes):
        vm = next((n for n in nodes if n.is_worker and n.backend == "vm"), None)
        if vm is not None:
            raise TopologyError(f"nodes.{vm.name}.backend", "VM workers cannot be part of a multi-host topology yet "
                                "(their guest's MTU and files are the controller's)",
                                "use backend netns or docker on topologies with hosts:")
    used = {n.host for n in nodes} - {LOCAL_HOST}
    unused = [h.name for h in hosts if h.name not in used]
    if unused:
        raise TopologyError("hosts", f"host(s) {', '.join(unused)} carry no node",
                            "place nodes there with host: NAME, or remove the entry")

    subnet = None
    if "subnet" in top:
        s = top["subnet"]
        try:
            subnet = ipaddress.ip_network(s, strict=True) if isinstance(s, str) else None
        except ValueError as e:
            raise TopologyError("subnet", f"{s!r} is not a network: {e}", "write e.g. subnet: 10.77.0.0/24") from None
        if not isinstance(subnet, ipaddress.IPv4Network):
            raise TopologyError("subnet", f"{s!r} is not an IPv4 network", "write e.g. subnet: 10.77.0.0/24")
        if subnet.num_addresses - 2 < len(workers):
            raise TopologyError("subnet", f"{subnet} has room for {max(subnet.num_addresses - 2, 0)} "
                                f"addresses but there are {len(workers)} workers", "use a shorter prefix")
        if subnet.is_loopback or subnet.is_multicast or subnet.is_link_local:
            raise TopologyError("subnet", f"{subnet} is a loopback/multicast/link-local range",
                                "use a private range such as 10.77.0.0/16")
    traffic = _traffic(top.get("traffic"), {n.name for n in workers})
    return Topology(name=name, nodes=tuple(nodes), links=tuple(links), subnet=subnet, source=source, traffic=traffic,
                    hosts=hosts, vxlan_port=vxlan_port, mtu=mtu)


def _node_host(spec: dict, path: str, host_names: set[str]) -> str | None:
    if "host" not in spec:
        return None  # placed later: a worker follows its switch
    h = spec["host"]
    if not isinstance(h, str) or h not in host_names:
        raise TopologyError(f"{path}.host", f"unknown host {h!r}",
                            f"define it under hosts:, or use one of: {', '.join(sorted(host_names))}")
    return h


def _place(nodes: list[Node], links: list[Link]) -> list[Node]:
    """Workers without ``host:`` go where the switch they hang off is (the common case:
    put ``host:`` on the switches); a worker linked to another worker stays local."""
    by_name = {n.name: n for n in nodes}
    out = []
    for n in nodes:
        if n.host is None:
            peer = next(by_name[l.b if l.a == n.name else l.a] for l in links if n.name in l.endpoints)
            host = peer.host if not peer.is_worker else LOCAL_HOST
            n = replace(n, host=host or LOCAL_HOST)
        out.append(n)
    return out


def _schedule(spec: dict, path: str, shapes: dict[str, Shape]) -> Trace | None:
    """A link's ``schedule:`` (and ``loop:``), every distinct step checked against both
    directions' shapes as ``link set`` would."""
    if "schedule" not in spec:
        if "loop" in spec:
            raise TopologyError(f"{path}.loop", "loop without a schedule", "add schedule: [{at: 0s, rate: ...}, ...]")
        return None
    trace = parse_schedule(spec["schedule"], spec.get("loop", False), f"{path}.schedule")
    seen = set()
    for st in trace.steps:
        if st.values() in seen:
            continue
        seen.add(st.values())
        changes: dict[str, Any] = {"rate": st.rate}
        if st.delay is not None:
            changes["delay"] = st.delay
        if st.loss is not None:
            changes["loss"] = st.loss
        for d, shape in shapes.items():
            _check_shape(replace(shape, **changes), f"{path}.schedule (at {st.at_s:g}s, {d})")
    return trace


def _traffic(value: Any, workers: set[str]) -> tuple[Flow, ...]:
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


def _check_graph(by_name: dict[str, Node], links: list[Link]) -> None:
    """Workers have exactly one link; the graph is connected; loops only through STP switches."""
    degree = {n: 0 for n in by_name}
    adj: dict[str, list[str]] = {n: [] for n in by_name}
    for l in links:
        degree[l.a] += 1
        degree[l.b] += 1
    for name, node in by_name.items():
        if not node.is_worker and degree[name] > MAX_BRIDGE_PORTS:
            raise TopologyError(f"nodes.{name}", f"switch '{name}' has {degree[name]} links; a Linux bridge holds at "
                                f"most {MAX_BRIDGE_PORTS} ports", "split its workers over several switches joined by a core switch")
        if node.is_worker and degree[name] != 1:
            raise TopologyError(f"nodes.{name}",
                                f"worker '{name}' has {degree[name]} links; a worker has exactly one data-plane interface",
                                "connect each worker to one switch (or, for two workers, to each other)")
    parent = {n: n for n in by_name}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for l in links:
        ra, rb = find(l.a), find(l.b)
        if ra == rb:
            cycle = _path(adj, l.b, l.a) + [l.b]
            if not all(by_name[n].stp for n in cycle if not by_name[n].is_worker):
                raise TopologyError(f"{l.path}.endpoints",
                                    f"link {l.a}-{l.b} closes the loop {' - '.join(cycle)}; "
                                    "Linux bridges forward broadcasts around a loop forever",
                                    "remove a link, or set 'stp: true' on every switch of the loop")
        else:
            parent[ra] = rb
        adj[l.a].append(l.b)
        adj[l.b].append(l.a)
    roots = {find(n) for n in by_name}
    if len(roots) > 1:
        comps: dict[str, list[str]] = {}
        for n in by_name:
            comps.setdefault(find(n), []).append(n)
        parts = sorted(comps.values(), key=len)
        raise TopologyError("links", f"the topology is not connected: {', '.join(parts[0][:6])} "
                            f"cannot reach {', '.join(parts[-1][:6])}", "add a link between the parts")


def _path(adj: dict[str, list[str]], src: str, dst: str) -> list[str]:
    """BFS path src->dst in the graph built so far (exists when a link closes a loop)."""
    prev = {src: src}
    queue = [src]
    for x in queue:
        if x == dst:
            break
        for y in adj[x]:
            if y not in prev:
                prev[y] = x
                queue.append(y)
    out = [dst]
    while out[-1] != src:
        out.append(prev[out[-1]])
    return out
