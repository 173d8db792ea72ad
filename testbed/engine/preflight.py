"""Preflight: every check ``up`` makes before anything is created, on this host and (over
SSH) on every other host of the testbed; ``testbed up --dry-run`` runs the same."""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

from testbed.common import rootless
from testbed.common.errors import StateError, TopologyError
from testbed.common.version import __version__
from testbed.engine.planner import make_plan
from testbed.engine.teardown import require_root
from testbed.hosts.share import AwaitShares, RemoteShare
from testbed.hosts import kinds
from testbed.model.topology import LOCAL_HOST as LOCAL
from testbed.model.topology import Topology
from testbed.monitor import sd
from testbed.monitor.sd import testbed_target
from testbed.net import netns, tc
from testbed.net.probe import netem_missing
from testbed.net.routes import host_routes, route_source
from testbed.net.underlay import check_underlay
from testbed.nodes import BACKENDS
from testbed.plan.actions import Action, TargetFile
from testbed.plan.ledger import Ledger
from testbed.plan.plan import Plan, choose_subnet


def preflight(topology: Topology, exporter: str | None = None) -> Plan:
    """Every check that needs the kernel, before anything is created. Returns the plan."""
    require_root()
    check_rootless(topology)
    if exporter is not None:
        sd.check_listen(exporter, "--exporter-listen", "127.0.0.1:0 (port 0: any free port)")
    check_share(topology, LOCAL)
    underlays = check_hosts(topology) if topology.multi_host else None
    plan = make_plan(topology, choose_subnet(topology, host_routes()), underlays)
    if underlays is not None:  # multi-host
        probe_hosts(topology, plan, underlays)
    check_free(plan.namespaces)
    return plan


def check_rootless(topology: Topology) -> None:
    """In an ordinary user's rootless namespaces, refuse what needs root (before anything is made)."""
    if not rootless.active():
        return
    for link in topology.links:
        if link.type == "vxlan":
            raise rootless.RootlessError(
                f"link {link.name} ({link.path}) has type vxlan, which needs root on both hosts",
                "leave type: out (or write type: tunnel): an ordinary user's links between hosts are user-space "
                "tunnels; or run it as root (sudo $(command -v testbed) up ...)")
    for w in topology.workers:
        assert w.backend is not None  # a worker always has one
        why = BACKENDS[w.backend].needs_root
        if why:
            raise rootless.RootlessError(f"worker {w.name} has backend {w.backend}, which needs root: {why}",
                                         "run it as root (sudo $(command -v testbed) up ...), or use backend: netns rootless")


def check_share(topology: Topology, host: str) -> None:
    """What each host checks of its share before anything is created (the controller for
    its own, every other host in ``testbed _host probe``): the testbed not up here,
    netem present when asked for, the backends of the workers placed here ready."""
    if Ledger(topology.name).exists():
        raise StateError(f"testbed '{topology.name}' is already up (or a previous up did not finish)",
                         f"run `testbed down {topology.name}` first, or change 'name:' in the topology")
    if topology.needs_netem:
        if detail := netem_missing():
            link = next(l for l in topology.links if l.forward.needs_netem or l.reverse.needs_netem
                        or (l.schedule is not None and l.schedule.needs_netem))
            shape = link.forward if link.forward.needs_netem else link.reverse
            field = ("delay" if shape.delay else ("jitter" if shape.jitter else "loss")) if shape.needs_netem \
                else "schedule"  # only a step of its schedule has delay or loss
            raise TopologyError(f"{link.path}.{field}",
                                f"{field} needs the netem qdisc, which this kernel lacks ({detail})",
                                tc.NETEM_MISSING_HINT)
    for name, backend in BACKENDS.items():  # e.g. docker: engine reachable, images present
        nodes = [w for w in topology.workers if w.backend == name and w.host == host]
        if nodes:
            backend.preflight(nodes)


def check_free(namespaces: Iterable[str]) -> None:
    """Refuse namespaces that already exist on this host (someone else's)."""
    taken = [ns for ns in namespaces if netns.exists(ns)]
    if taken:
        raise StateError(f"network namespace(s) {', '.join(taken[:5])} already exist and are not this testbed's",
                         f"remove them (`ip netns del {taken[0]}`) or rename the testbed")


def check_hosts(topology: Topology) -> dict[str, str]:
    """Each host's tunnel address: the remote ones from the topology, the local one the
    source address of the route towards them (its interface's MTU checked)."""
    underlays = {h.name: h.underlay for h in topology.hosts}
    if any(n.host == LOCAL for n in topology.nodes):
        dst = topology.hosts[0].underlay
        src = route_source(dst)
        if src is None:
            raise StateError(f"this host has no route to {dst} (hosts[0].underlay)",
                             "check the address, or the network between the hosts")
        check_underlay(src, topology.data_mtu, f"this host's route to {dst}")
        underlays[LOCAL] = src
    return underlays


def probe_hosts(topology: Topology, plan: Plan, underlays: dict[str, str]) -> None:
    """Ask every remote host, in parallel, whether it can build its share (root, version,
    underlay and MTU, names free, its backends ready); the first refusal is raised."""
    def one(h):
        r = kinds.remote(h)
        try:
            if not rootless.active():  # an ordinary user's hosts build in their own rootless namespaces
                r.require_root()
            return r.call("probe", payload={
                "version": __version__, "topology": topology.to_dict(), "host": h.name,
                "underlay": underlays[h.name], "mtu": topology.data_mtu,
                "namespaces": plan.namespaces_on(h.name)}, timeout=120)
        finally:
            r.close()

    remote = [h for h in topology.hosts if h.name in plan.hosts]
    with ThreadPoolExecutor(max_workers=max(1, len(remote))) as pool:
        futures = [pool.submit(one, h) for h in remote]
        for f in futures:
            f.result()


def local_plan(plan: Plan, state: dict, ctx, exporters: bool = True) -> Plan:
    """What this host executes: the other hosts' shares (started in the background, each
    recorded first), its own actions, then the wait for the others.

    ``exporters``: each host also starts its link exporter, on the address the controller
    reaches it at (its management network; any free port), announced here to Prometheus
    through a file-SD target ``testbed-NAME@HOST.json``."""
    remote = [h for h in plan.topology.hosts if h.name in plan.hosts]
    if not remote:
        return plan
    acts: list[Action] = []
    for h in remote:
        ctx.shares[h.name] = {"state": {**state, "host": h.name},
                              "actions": [a.to_dict() for a in plan.share(h.name)]}
        acts.append(RemoteShare.of(h))
        if exporters:
            listen = h.address if _is_ipv4(h.address) else h.underlay
            ctx.shares[h.name]["exporter"] = f"{listen}:0"
            acts.append(TargetFile(str(testbed_target(plan.topology.name).with_name(
                f"testbed-{plan.topology.name}@{h.name}.json"))))
    return Plan(plan.topology, plan.subnet, acts + plan.share(LOCAL) + [AwaitShares()], plan.nodes, plan.egress)


def _is_ipv4(s: str) -> bool:
    try:
        ipaddress.IPv4Address(s)
        return True
    except ValueError:
        return False
