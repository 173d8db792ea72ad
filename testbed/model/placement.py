"""Where each node runs: a node's ``host:``, else (a worker) the host of the switch it
hangs off, else the local host; then what a placement may not be."""

from __future__ import annotations

from dataclasses import replace

from testbed.common.errors import TopologyError
from testbed.model.backend_options import OPTIONS
from testbed.model.hosts import LOCAL_HOST, Host
from testbed.model.links import Link
from testbed.model.nodes import Node


def place_workers(nodes: list[Node], links: list[Link]) -> list[Node]:
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


def check_placement(nodes: list[Node], hosts: tuple[Host, ...]) -> None:
    """No worker of a backend that stays on one host (``vm``) in a multi-host topology;
    every ``hosts:`` entry carries a node."""
    if any(n.host != LOCAL_HOST for n in nodes):
        local = next((n for n in nodes if n.is_worker and not OPTIONS[n.backend or ""].multi_host), None)
        if local is not None:
            fits = [name for name, o in OPTIONS.items() if o.multi_host]
            raise TopologyError(f"nodes.{local.name}.backend", f"{local.backend} workers cannot be part of a "
                                "multi-host topology yet", f"use backend {' or '.join(fits)} on topologies with hosts:")
    used = {n.host for n in nodes} - {LOCAL_HOST}
    unused = [h.name for h in hosts if h.name not in used]
    if unused:
        raise TopologyError("hosts", f"host(s) {', '.join(unused)} carry no node",
                            "place nodes there with host: NAME, or remove the entry")
