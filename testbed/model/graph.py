"""Checks on the graph the nodes and links make: every worker has exactly one link, no
switch has more ports than a Linux bridge holds, switch loops only where STP runs, and
everything reaches everything."""

from __future__ import annotations

from testbed.common.errors import TopologyError
from testbed.model.links import Link
from testbed.model.nodes import Node

MAX_BRIDGE_PORTS = 1023  # Linux bridge port numbers are 10 bits and 0 is reserved (EXFULL beyond)


def check_graph(by_name: dict[str, Node], links: list[Link]) -> None:
    """Workers have exactly one link; the graph is connected; loops only through STP switches."""
    _check_degrees(by_name, links)
    parent = _check_loops(by_name, links)
    _check_connected(by_name, parent)


def _check_degrees(by_name: dict[str, Node], links: list[Link]) -> None:
    degree = {n: 0 for n in by_name}
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


def _check_loops(by_name: dict[str, Node], links: list[Link]) -> dict[str, str]:
    """Add the links one by one (union-find); a link whose ends are already joined closes a
    loop, allowed only when every switch on it runs STP. Returns the union-find's parents."""
    parent = {n: n for n in by_name}
    adj: dict[str, list[str]] = {n: [] for n in by_name}
    for l in links:
        ra, rb = _find(parent, l.a), _find(parent, l.b)
        if ra == rb:
            cycle = _path(adj, l.b, l.a) + [l.a]  # a ... b, back to a
            if not all(by_name[n].stp for n in cycle if not by_name[n].is_worker):
                raise TopologyError(f"{l.path}.endpoints",
                                    f"link {l.a}-{l.b} closes the loop {' - '.join(cycle)}; "
                                    "Linux bridges forward broadcasts around a loop forever",
                                    "remove a link, or set 'stp: true' on every switch of the loop")
        else:
            parent[ra] = rb
        adj[l.a].append(l.b)
        adj[l.b].append(l.a)
    return parent


def _check_connected(by_name: dict[str, Node], parent: dict[str, str]) -> None:
    roots = {_find(parent, n) for n in by_name}
    if len(roots) > 1:
        comps: dict[str, list[str]] = {}
        for n in by_name:
            comps.setdefault(_find(parent, n), []).append(n)
        parts = sorted(comps.values(), key=len)
        raise TopologyError("links", f"the topology is not connected: {', '.join(parts[0][:6])} "
                            f"cannot reach {', '.join(parts[-1][:6])}", "add a link between the parts")


def _find(parent: dict[str, str], x: str) -> str:
    """The root of ``x``'s set (halving the path on the way)."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


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
