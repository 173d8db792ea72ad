"""The Testbed: realise a Topology on this host, inspect it, change it, tear it down.

    with Testbed.up(load_topology("topologies/three_switch.yaml")) as tb:
        tb.exec("w0", ["ping", "-c1", tb.address("w1")])

``up`` validates against the running kernel first (names free, netem present when asked
for, subnet clear of the host's routes) so that a bad topology creates nothing. It then
executes the plan, writing each action to the ledger before performing it; on any
failure, Ctrl-C or SIGTERM it removes what it created and re-raises. ``down`` (also from
another process, also after ``kill -9``) reads the ledger and removes exactly that.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Iterable, Sequence

from testbed.common.version import __version__
from testbed.plan import naming
from testbed.common import procs
from testbed.engine.apply import FAULT_ENV, Progress, apply_plan  # noqa: F401  (FAULT_ENV: the tests' hook)
from testbed.nodes import get as get_backend
from testbed.common.errors import StateError, TestbedError
from testbed.plan.ledger import Ledger
from testbed.common.state import global_lock
from testbed.net import netns, tc
from testbed.net.handles import NetlinkPool  # noqa: F401  (the exporter's)
from testbed.net.rtnl import Rtnl
from testbed.net.tcbatch import LinkChanger
from testbed.hosts.local import LOCAL, LocalHost
from testbed.plan.actions import ApplyContext
from testbed.engine.preflight import local_plan, preflight
from testbed.plan.plan import Endpoint, NodeInfo, Plan
from testbed.engine.teardown import down, down_all, list_testbeds  # noqa: F401  (the library's API)
from testbed.model.topology import DIRECTIONS, Link, Shape, Topology, check_shape, load_topology_dict
from testbed.model.units import Duration, Loss, Rate



_IFINDEX: dict[tuple[str, int | None, str], int] = {}
"""(namespace, its inode, interface) -> ifindex. An interface keeps its index for its whole
life, and the inode tells a namespace apart from a later one of the same name, so
repeated counter reads (the exporter's scrapes) skip the lookups."""


class Testbed:
    """A running testbed (built by :meth:`up`, or found by :meth:`attach`)."""

    __test__ = False

    def __init__(self, state: dict):
        self._state = state
        self.name: str = state["name"]
        self.topology: Topology = load_topology_dict(state["topology"], source=state.get("source"))
        self.nodes: dict[str, NodeInfo] = {n: NodeInfo(**d) for n, d in state["nodes"].items()}
        self.egress: dict[tuple[int, str], Endpoint] = {
            (int(k.split("/")[0]), k.split("/")[1]): Endpoint(**v) for k, v in state["egress"].items()
        }
        # the state file is untrusted input: every namespace it names must be this testbed's
        for ns in [n.netns for n in self.nodes.values()] + [e.ns for e in self.egress.values()]:
            if not naming.owned_namespace(self.name, ns):
                raise StateError(f"the state of testbed '{self.name}' names namespace {ns!r}, which it cannot own",
                                 f"`testbed down {self.name}` removes what its ledger lists")
        self._owned = False
        self.here: str = state.get("host", LOCAL)
        """The host this process runs on: ``local`` on the controller, a host's name on a
        host that holds a share of a multi-host testbed."""
        self._remotes: dict = {}

    def remote(self, host: str):
        """The SSH link to ``host`` (from the controller), opened on first use."""
        from testbed.hosts.ssh import Remote

        if self.here != LOCAL:
            raise StateError(f"this is host {self.here}'s share of testbed '{self.name}'",
                             "run this on the controller (where `testbed up` ran)")
        if host not in self._remotes:
            self._remotes[host] = Remote(self.topology.host(host))
        return self._remotes[host]

    def close(self) -> None:
        for r in self._remotes.values():
            r.close()
        self._remotes.clear()

    # ------------------------------------------------------------------ building
    @classmethod
    def preflight(cls, topology: Topology, exporter: str | None = None) -> Plan:
        """Every check that needs the kernel, before anything is created. Returns the plan."""
        return preflight(topology, exporter)

    @classmethod
    def up(cls, topology: Topology, progress: Progress | None = None, exporter: str | None = None) -> "Testbed":
        """Build the testbed. On failure or interrupt, everything created is removed.

        ``exporter``: HOST:PORT (port 0: any free one) for this testbed's link exporter, a
        host process announced to Prometheus through a file-SD target; None starts none."""
        with global_lock():
            plan = cls.preflight(topology, exporter)
            ledger = Ledger(topology.name)
            ledger.create()
            state = _initial_state(plan)
            ledger.write_state(state)
            ctx = ApplyContext(topology.name, LocalHost())
            apply_plan(local_plan(plan, state, ctx, exporter is not None), ledger, state, progress, exporter,
                       ctx=ctx)
            if ctx.results.get("host_exporters"):
                state["host_exporters"] = ctx.results["host_exporters"]
                ledger.write_state(state)
        tb = cls(state)
        tb._owned = True
        return tb

    @classmethod
    def attach(cls, name: str) -> "Testbed":
        state = Ledger(name).read_state()
        if state is None:
            up = Ledger.all_names()
            raise StateError(f"testbed '{name}' is not up",
                             f"running testbeds: {', '.join(up)}" if up else "start one with `testbed up FILE`")
        if not state.get("ready"):
            raise StateError(f"testbed '{name}' did not finish coming up",
                             f"`testbed down {name}` removes what it created")
        return cls(state)

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def down(self) -> None:
        down(self.name)

    # ------------------------------------------------------------------ queries
    @property
    def workers(self) -> list[NodeInfo]:
        return sorted((n for n in self.nodes.values() if n.kind == "worker"), key=lambda n: n.rank)

    def node(self, name: str) -> NodeInfo:
        try:
            return self.nodes[name]
        except KeyError:
            raise TestbedError(f"no node '{name}' in testbed '{self.name}'",
                               f"nodes: {', '.join(self.nodes)}") from None

    def address(self, node: str) -> str:
        info = self.node(node)
        if info.address is None:
            raise TestbedError(f"node '{node}' is a switch and has no address")
        return info.address

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "ready": self._state.get("ready", False),
            "created": self._state.get("created"),
            "subnet": self._state.get("subnet"),
            "source": self._state.get("source"),
            "exporter": self._state.get("exporter"),
            "nodes": [asdict(n) for n in self.nodes.values()],
            "links": [_link_dict(l, self.egress) for l in self.topology.links],
        }

    # ------------------------------------------------------------------ processes
    def backend(self, node: str):
        return get_backend(self.node(node).backend)

    def command(self, node: str, argv: Sequence[str], *, mounts: Sequence[Path] = (),
                cwd: Path | None = None) -> list[str]:
        """Host argv that runs ``argv`` inside ``node`` (through its backend; no shell). A
        node on another host: through :mod:`testbed.hosts.sshexec`, which relays over SSH."""
        info = self.node(node)
        if info.host != self.here:
            if self.here != LOCAL:
                raise TestbedError(f"node {node} is on host {info.host}", "run this on the controller")
            if mounts or cwd is not None:
                raise TestbedError(f"node {node} is on host {info.host}: host directories cannot be mounted there")
            return self.remote_command(node, argv)
        return get_backend(info.backend).command(info, argv, mounts=mounts, cwd=cwd)

    def remote_command(self, node: str, argv: Sequence[str], *, python: bool = False, run: str | None = None,
                       env: dict[str, str] | None = None, mounts: Sequence[Path] = ()) -> list[str]:
        """Host argv that runs ``argv`` in ``node`` on its (other) host, relayed over SSH by
        :mod:`testbed.hosts.sshexec`. ``python``: ``argv`` is MODULE ARGS for the node's Python
        there; ``run``: start in that host's directory of the run; ``env``: variables set
        on top of the node's own environment there; ``mounts``: directories that exist
        on that host too (a container sees them)."""
        info = self.node(node)
        h = self.topology.host(info.host)
        opts = (["--python"] if python else []) + ([f"--run={run}"] if run else [])
        opts += [f"--env={k}={v}" for k, v in (env or {}).items()] + [f"--mount={m}" for m in mounts]
        return procs.python_argv("testbed.hosts.sshexec", "--host", json.dumps(h.to_dict()), "--testbed", self.name,
                                 "--node", node, *(f"--remote-opt={o}" for o in opts), "--", *argv)

    def spawn(self, node: str, argv: Sequence[str], *, mounts: Sequence[Path] = (), cwd: Path | None = None,
              **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``node`` (no shell)."""
        return subprocess.Popen(self.command(node, argv, mounts=mounts, cwd=cwd), **popen_kwargs)

    def exec(self, node: str, argv: Sequence[str], **run_kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(node, argv), **run_kwargs)

    # ------------------------------------------------------------------ links
    def find_links(self, spec: str | None = None, bottleneck: bool = False) -> list[Link]:
        links = self.topology.links
        if bottleneck:
            found = [l for l in links if l.bottleneck]
            if not found:
                raise TestbedError(f"testbed '{self.name}' has no bottleneck links",
                                   "mark links with 'bottleneck: true' in the topology, or name a link")
            return found
        if spec is None:
            raise TestbedError("name a link (e.g. s1-s0) or pass --bottleneck",
                               f"links: {', '.join(l.name for l in links)}")
        idx = spec[6:-1] if spec.startswith("links[") and spec.endswith("]") else spec
        for l in links:
            if spec in (l.name, f"{l.a}-{l.b}", f"{l.b}-{l.a}") or (idx.isdigit() and int(idx) == l.index):
                return [l]
        raise TestbedError(f"no link '{spec}' in testbed '{self.name}'",
                           f"links: {', '.join(l.name for l in links)}")

    def set_links(self, links: Iterable[Link], *, rate: Rate | None = None, delay: Duration | None = None,
                  jitter: Duration | None = None, loss: Loss | None = None, limit: int | None = None,
                  direction: str = "both", changer: LinkChanger | None = None) -> list[Link]:
        """Change running links in place; returns the links with their new shapes.

        All directions are changed with one netlink datagram per namespace. ``changer``: one
        the caller keeps across calls (a trace replay), so that interface indexes, child
        qdiscs and encoded requests are learnt once, not per change."""
        if direction not in ("both", *DIRECTIONS):
            raise TestbedError(f"unknown direction '{direction}'", "choose one of: both, forward, reverse")
        changes = {k: v for k, v in dict(rate=rate, delay=delay, jitter=jitter, loss=loss, limit=limit).items()
                   if v is not None}
        if not changes:
            raise TestbedError("nothing to change", "give --bw, --delay, --jitter, --loss or --limit")
        dirs = DIRECTIONS if direction == "both" else (direction,)
        wanted = [l.index for l in links]
        with global_lock():
            # Re-read under the lock: another process may have changed other links meanwhile.
            state = Ledger(self.name).read_state()
            if state is None:
                raise StateError(f"testbed '{self.name}' is no longer up")
            current = load_topology_dict(state["topology"], source=state.get("source"))
            new_links = {}
            for idx in wanted:
                l = current.links[idx]
                shapes = {d: l.shape(d) for d in DIRECTIONS}
                for d in dirs:
                    # the loader's rules on the result (jitter needs delay, queue within bounds),
                    # for every direction before any is changed
                    shapes[d] = check_shape(replace(shapes[d], **changes), f"link {l.name} ({d})")
                new_links[idx] = replace(l, forward=shapes["forward"], reverse=shapes["reverse"])
            if any(s.needs_netem for l in new_links.values() for s in (l.forward, l.reverse)):
                from testbed.net.probe import netem_missing

                if detail := netem_missing():
                    raise TestbedError(f"delay/jitter/loss need the netem qdisc, which this kernel lacks ({detail})",
                                       tc.NETEM_MISSING_HINT)
            own = changer is None
            changer = changer or LinkChanger()
            todo = [(self.egress[(idx, d)], l.shape(d), f"{l.name} {d}: changing the shape")
                    for idx, l in new_links.items() for d in dirs if self.egress[(idx, d)].host == self.here]
            self._shape_elsewhere([(idx, d, l.shape(d)) for idx, l in new_links.items() for d in dirs
                                   if self.egress[(idx, d)].host != self.here])
            try:
                changer.apply(todo)
            except BaseException as e:
                # the others may have applied: put back their shapes from before, so kernel and state agree
                failed = set(getattr(e, "failed", ()))
                try:
                    changer.apply([(self.egress[(idx, d)], current.links[idx].shape(d), f"{l.name} {d}: restoring")
                                   for idx, l in new_links.items() for d in dirs
                                   if f"{l.name} {d}: changing the shape" not in failed])
                    restored = ""
                except Exception as err:  # reported with the original error below
                    restored = str(err)
                if isinstance(e, TestbedError):
                    e.message += (" (the shapes from before were restored)" if not restored
                                  else f" (restoring failed too: {restored})")
                raise
            finally:
                if own:
                    changer.close()
            self.topology = current.with_links(new_links.get(l.index, l) for l in current.links)
            state["topology"] = self.topology.to_dict()
            self._state = state
            Ledger(self.name).write_state(state)
        return [new_links[i] for i in wanted]

    def _shape_elsewhere(self, changes: list[tuple[int, str, "Shape"]]) -> None:
        """Change link ends on other hosts (before the local ones: a refusal there leaves
        nothing changed here)."""
        by_host: dict[str, list[dict]] = {}
        for idx, d, shape in changes:
            by_host.setdefault(self.egress[(idx, d)].host, []).append(
                {"link": idx, "direction": d, "shape": shape.to_dict()})
        for host, items in by_host.items():
            self.remote(host).call("shape", self.name, payload={"changes": items}, timeout=60)

    def link_counters(self, links: Iterable[Link] | None = None, pool: "NetlinkPool | None" = None,
                      local_only: bool = False) -> dict[tuple[int, str], dict]:
        """Live egress counters (bytes, packets, drops, ...) per (link index, direction),
        from every host (``local_only``: this host's link ends only).

        ``pool`` keeps the netlink handles open between calls (an exporter's scrapes)."""
        wanted = None if links is None else {l.index for l in links}
        by_ns: dict[str, list[tuple[int, str, Endpoint]]] = {}
        elsewhere: set[str] = set()
        for (idx, d), ep in self.egress.items():
            if wanted is None or idx in wanted:
                if ep.host != self.here:
                    elsewhere.add(ep.host)
                else:
                    by_ns.setdefault(ep.ns, []).append((idx, d, ep))
        counters: dict[tuple[int, str], dict] = {}
        if elsewhere and not local_only:
            counters.update(self._remote_counters(sorted(elsewhere), wanted))
        for ns, eps in by_ns.items():
            ino = netns.inode(ns)
            if ino is None:
                raise StateError(f"network namespace {ns} of testbed '{self.name}' is gone",
                                 f"`testbed down {self.name}` removes the rest")
            rt = pool.get(ns, ino) if pool is not None else Rtnl.open(ns)
            try:
                stats = tc.egress_stats(rt)
                todo = [ep.ifname for _, _, ep in eps if (ns, ino, ep.ifname) not in _IFINDEX]
                if len(todo) > 1:
                    rt.load_indexes()
                for name in todo:
                    _IFINDEX[(ns, ino, name)] = rt.index(name)
            except BaseException:
                if pool is not None:
                    pool.drop(ns, ino)
                raise
            finally:
                if pool is None:
                    rt.close()
            for idx, d, ep in eps:
                counters[(idx, d)] = stats.get(_IFINDEX[(ns, ino, ep.ifname)], {})
        return counters

    def _remote_counters(self, hosts: list[str], wanted: set[int] | None) -> dict[tuple[int, str], dict]:
        """The other hosts' link-end counters, asked in parallel over SSH."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
            answers = list(pool.map(lambda h: self.remote(h).call("counters", self.name, timeout=60), hosts))
        out: dict[tuple[int, str], dict] = {}
        for host, ans in zip(hosts, answers):
            got = ans.get("counters")
            if not isinstance(got, dict):
                raise StateError(f"host {host} answered counters without counters")
            for key, c in got.items():
                i, _, d = str(key).partition("/")
                if not i.isdigit() or d not in DIRECTIONS or not isinstance(c, dict):
                    raise StateError(f"host {host} answered a malformed counter key {key!r}")
                if (wanted is None or int(i) in wanted) and self.egress.get((int(i), d), Endpoint("", "")).host == host:
                    out[(int(i), d)] = {k: v for k, v in c.items() if isinstance(v, (int, float))}
        return out

    def link_stats(self) -> list[dict]:
        """Per link and direction: shape in force and live egress counters."""
        counters = self.link_counters()
        out = []
        for l in self.topology.links:
            row = _link_dict(l, self.egress)
            for d in DIRECTIONS:
                row[d]["counters"] = counters.get((l.index, d), {})
            out.append(row)
        return out


def _link_dict(l: Link, egress: dict[tuple[int, str], Endpoint]) -> dict:
    row = {"index": l.index, "name": l.name, "a": l.a, "b": l.b, "bottleneck": l.bottleneck}
    for d, (src, dst) in (("forward", (l.a, l.b)), ("reverse", (l.b, l.a))):
        ep = egress[(l.index, d)]
        row[d] = {"src": src, "dst": dst, "shape": l.shape(d).to_dict(), "netns": ep.ns, "ifname": ep.ifname,
                  "host": ep.host}
    return row


def _initial_state(plan: Plan) -> dict:
    return {
        "name": plan.topology.name,
        "version": __version__,
        "created": time.time(),
        "pid": os.getpid(),
        "ready": False,
        "source": plan.topology.source,
        "subnet": str(plan.subnet),
        "topology": plan.topology.to_dict(),
        "nodes": {n: asdict(i) for n, i in plan.nodes.items()},
        "egress": {f"{i}/{d}": asdict(ep) for (i, d), ep in plan.egress.items()},
    }
