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

import contextlib
import ipaddress
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable, Sequence, cast

from testbed.common.version import __version__
from testbed.plan import naming
from testbed.engine.apply import FAULT_ENV, Progress, apply_plan  # noqa: F401  (FAULT_ENV: the tests' hook)
from testbed.nodes import get as get_backend
from testbed.common.digits import ascii_int
from testbed.common.errors import StateError, TestbedError, shown
from testbed.plan.ledger import Ledger
from testbed.common.state import global_lock
from testbed.net import tc
from testbed.net.handles import NetlinkPool  # noqa: F401  (the exporter's)
from testbed.net.tcbatch import Derived, LinkChanger
from testbed.hosts.local import LOCAL, LocalHost
from testbed.hosts import kinds
from testbed.hosts.site import LocalSite, ShapeChange, Site
from testbed.plan.actions import ApplyContext
from testbed.engine.preflight import local_plan, preflight
from testbed.plan.plan import Endpoint, NodeInfo, Plan
from testbed.engine.teardown import down, down_all, list_testbeds, require_root  # noqa: F401  (the library's API)
from testbed.model.topology import DIRECTIONS, Link, Topology, load_topology_dict
from testbed.model.units import Duration, Loss, Rate




_DAMAGED_HINT = "`testbed down {name}` still removes it (down reads the ledger)"
"""The hint for a testbed whose state file is damaged (unreadable, or of the wrong shape)."""


class Testbed:
    """A running testbed (built by :meth:`up`, or found by :meth:`attach`)."""

    __test__ = False

    def __init__(self, state: dict):
        self._state = state
        try:
            self._read(state)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as e:  # the file is untrusted input
            name = state.get("name") if isinstance(state, dict) else None
            raise StateError(f"the state of testbed {shown(name)} is damaged ({type(e).__name__}: {shown(str(e))})",
                             _DAMAGED_HINT.format(name="NAME")) from None

    def _read(self, state: dict) -> None:
        if not isinstance(state["name"], str):
            raise TypeError("name must be a string")
        ipaddress.ip_network(state["subnet"])  # ValueError unless an IPv4/IPv6 network
        self.name: str = state["name"]
        try:
            self.topology: Topology = load_topology_dict(state["topology"], source=state.get("source"))
        except TestbedError as e:
            raise ValueError(f"its topology: {e.message}") from None
        self.nodes: dict[str, NodeInfo] = {n: NodeInfo(**d) for n, d in state["nodes"].items()}
        self.egress: dict[tuple[int, str], Endpoint] = {
            (int(k.split("/")[0]), k.split("/")[1]): Endpoint(**v) for k, v in state["egress"].items()
        }
        missing = [f"{l.index}/{d}" for l in self.topology.links for d in DIRECTIONS if (l.index, d) not in self.egress]
        if missing:
            raise KeyError(f"egress has no entry for {', '.join(missing[:4])}")
        # the state file is untrusted input: every namespace it names must be this testbed's
        for ns in [n.netns for n in self.nodes.values()] + [e.ns for e in self.egress.values()]:
            if not naming.owned_namespace(self.name, ns):
                raise StateError(f"the state of testbed '{self.name}' names namespace {ns!r}, which it cannot own",
                                 f"`testbed down {self.name}` removes what its ledger lists")
        self._owned = False
        self.here: str = state.get("host", LOCAL)
        """The host this process runs on: ``local`` on the controller, a host's name on a
        host that holds a share of a multi-host testbed."""
        self._sites: dict[str, Site] = {}

    def site(self, host: str) -> Site:
        """The part of this testbed on ``host``: this machine's, or another host's (over SSH,
        or a node of the Slurm job: :mod:`testbed.hosts.kinds`)."""
        if host not in self._sites:
            cls = LocalSite if host == self.here else kinds.site_class(self.topology.host(host))
            self._sites[host] = cls(self, host)
        return self._sites[host]

    def close(self) -> None:
        for s in self._sites.values():
            s.close()
        self._sites.clear()

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
        require_root()  # an ordinary user's program: into their rootless namespaces first (their state is there)
        with contextlib.ExitStack() as building:
            with global_lock():  # only while the name is checked and reserved (its ledger made)
                plan = cls.preflight(topology, exporter)
                ledger = Ledger(topology.name)
                ledger.create()
                state = _initial_state(plan)
                ledger.write_state(state)
                building.enter_context(ledger.lock())  # the build holds its own: `down NAME` waits for it
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
        require_root()  # an ordinary user's program: into their rootless namespaces, where their testbeds are
        ledger = Ledger(name)
        state = ledger.read_state()
        if state is None and ledger.state_damaged():
            raise StateError(f"testbed '{name}': its state file {ledger.state_path} is damaged",
                             _DAMAGED_HINT.format(name=name))
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
        """A testbed this object brought up (``up``) is taken down; one it attached to is not."""
        if self._owned:
            self.down()

    def down(self) -> None:
        down(self.name)

    # ------------------------------------------------------------------ queries
    @property
    def workers(self) -> list[NodeInfo]:
        # a worker's rank is always set (planner._node_table), so the key is an int
        return sorted((n for n in self.nodes.values() if n.kind == "worker"), key=lambda n: cast(int, n.rank))

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

    def shape_changed_at(self, link: Link, direction: str) -> float | None:
        """When the shape in force on ``link``'s ``direction`` was set (Unix time): by ``up``,
        or the last change (``link set``, a trace step, a run's ``--bw`` or its restore)."""
        at = (self._state.get("shape_changed_at") or {}).get(f"{link.name} {direction}", self._state.get("created"))
        return at if isinstance(at, (int, float)) and not isinstance(at, bool) else None

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

    def why_stopped(self, node: str) -> str | None:
        """Why a process in ``node`` may have died beyond its own doing, asked on the node's
        own host (another host's backend over SSH)."""
        info = self.node(node)
        return self.site(info.host).why_stopped(info)

    def command(self, node: str, argv: Sequence[str], *, mounts: Sequence[Path] = (),
                cwd: Path | None = None) -> list[str]:
        """Host argv that runs ``argv`` inside ``node`` (through its backend, on its host; no shell)."""
        info = self.node(node)
        return self.site(info.host).command(info, argv, mounts=mounts, cwd=cwd)

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
            if spec in (l.name, f"{l.a}-{l.b}", f"{l.b}-{l.a}") or ascii_int(idx) == l.index:
                return [l]
        raise TestbedError(f"no link '{spec}' in testbed '{self.name}'",
                           f"links: {', '.join(l.name for l in links)}")

    def set_links(self, links: Iterable[Link], *, rate: Rate | None = None, delay: Duration | None = None,
                  jitter: Duration | None = None, loss: Loss | None = None, limit: int | None = None,
                  direction: str = "both", changer: LinkChanger | None = None,
                  applied: Callable[[], None] | None = None) -> list[Link]:
        """Change running links in place; returns the links with their new shapes.

        All directions are changed with one netlink datagram per namespace. ``changer``: one
        the caller keeps across calls (a trace replay), so that interface indexes, child
        qdiscs and encoded requests are learnt once, not per change. ``applied``: called
        when the kernel has every change, before the state file is written (the lock held)."""
        if direction not in ("both", *DIRECTIONS):
            raise TestbedError(f"unknown direction '{direction}'", "choose one of: both, forward, reverse")
        changes = {k: v for k, v in dict(rate=rate, delay=delay, jitter=jitter, loss=loss, limit=limit).items()
                   if v is not None}
        if not changes:
            raise TestbedError("nothing to change", "give --bw, --delay, --jitter, --loss or --limit")
        dirs = DIRECTIONS if direction == "both" else (direction,)
        wanted = [l.index for l in links]
        with Ledger(self.name).lock():  # this testbed's: others' up, down and steps go on
            state, current = self._current(changer)
            # the loader's rules on the result (jitter needs delay, queue within bounds), for
            # every direction before any is changed; a replay's changer keeps what it derived
            derived = changer.derived if changer is not None else Derived()
            new_links = derived.links((current.links[idx] for idx in wanted), changes, dirs)
            if any(s.needs_netem for l in new_links.values() for s in (l.forward, l.reverse)):
                from testbed.net.probe import netem_missing

                if detail := netem_missing():
                    raise TestbedError(f"delay/jitter/loss need the netem qdisc, which this kernel lacks ({detail})",
                                       tc.NETEM_MISSING_HINT)
            by_site: dict[str, list[ShapeChange]] = {}
            for idx, l in new_links.items():
                for d in dirs:
                    ep = self.egress[(idx, d)]
                    by_site.setdefault(ep.host, []).append(
                        ShapeChange(idx, d, f"{l.name} {d}", ep, l.shape(d), current.links[idx].shape(d)))
            own = changer is None
            changer = changer or LinkChanger()
            # every other host keeps a copy of the state (`testbed status` typed there): the
            # hosts changed get the new shapes with their change; on a one-off change (not a
            # trace's steps, which go on at their pace) the others get them too
            hosts = set(by_site) | ({h.name for h in current.hosts} if own else set())
            copies = ({idx: {d: l.shape(d).to_dict() for d in DIRECTIONS} for idx, l in new_links.items()}
                      if hosts - {self.here} else None)  # (0.3 ms of a 64-link step; this host keeps none)
            try:
                for site in sorted((self.site(h) for h in hosts), key=lambda s: s.order):
                    site.shape(by_site.get(site.host, []), changer, copies)
            finally:
                if own:
                    changer.close()
            if applied is not None:
                applied()
            self.topology = current.with_links(new_links.get(l.index, l) for l in current.links)
            if changer.memo is not None and state is changer.memo[1]:  # a replay's own state: its changed links
                for idx, l in new_links.items():  # (to_dict of 64 links was 0.6 ms of each 64-link step)
                    state["topology"]["links"][idx] = derived.to_dict(l)
            else:
                state["topology"] = self.topology.to_dict()
            changed_at = time.time()  # exported, so a dashboard marks the change even when no scrape fell between
            times = state.setdefault("shape_changed_at", {})
            for l in new_links.values():
                times.update({f"{l.name} {d}": changed_at for d in dirs})
            self._state = state
            ledger = Ledger(self.name)
            ledger.write_state(state, durable=own)  # a trace's steps: atomic, not each fsynced
            if not own:
                changer.memo = (_file_id(ledger.state_path), state, self.topology)
        return [new_links[i] for i in wanted]

    def _current(self, changer: LinkChanger | None) -> tuple[dict, Topology]:
        """The state and topology, under the lock: another process may have changed other
        links meanwhile. A trace replay (``changer`` kept across steps) keeps what it wrote
        at its last step while the state file is still that one (a new write is a new file)."""
        ledger = Ledger(self.name)
        memo = changer.memo if changer is not None else None
        if memo is not None and memo[0] == _file_id(ledger.state_path):
            return memo[1], memo[2]
        state = ledger.read_state()
        if state is None:
            raise StateError(f"testbed '{self.name}' is no longer up")
        return state, load_topology_dict(state["topology"], source=state.get("source"))

    def link_counters(self, links: Iterable[Link] | None = None, pool: "NetlinkPool | None" = None,
                      local_only: bool = False) -> dict[tuple[int, str], dict]:
        """Live egress counters (bytes, packets, drops, ...) per (link index, direction),
        from every host (``local_only``: this host's link ends only).

        ``pool`` keeps the netlink handles open between calls (an exporter's scrapes)."""
        wanted = None if links is None else {l.index for l in links}
        by_host: dict[str, list[tuple[int, str, Endpoint]]] = {}
        for (idx, d), ep in self.egress.items():
            if (wanted is None or idx in wanted) and (not local_only or ep.host == self.here):
                by_host.setdefault(ep.host, []).append((idx, d, ep))
        sites = [self.site(h) for h in by_host]
        if len(sites) <= 1:  # in this thread: ``pool``'s handles belong to it (the exporter's)
            return sites[0].counters(by_host[sites[0].host], pool) if sites else {}
        with ThreadPoolExecutor(max_workers=len(sites)) as workers:  # hosts answer in parallel
            answers = list(workers.map(lambda s: s.counters(by_host[s.host], pool), sites))
        return {k: v for got in answers for k, v in got.items()}

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
    row = {"index": l.index, "name": l.name, "a": l.a, "b": l.b, "type": l.type, "bottleneck": l.bottleneck}
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


def _file_id(path: Path) -> tuple[int, int, int] | None:
    """Which file ``path`` is now (replaced atomically, each write is a new inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size
