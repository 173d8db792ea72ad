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

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from collections import OrderedDict
from dataclasses import asdict, replace
from typing import Callable, Iterable, Sequence

from . import __version__, naming, procs
from .backends import get as get_backend
from .errors import KernelError, StateError, TestbedError, TopologyError
from .ledger import Ledger, global_lock
from .net import netns, tc
from .net.rtnl import Rtnl
from .plan import (AddAddress, CreateBridge, CreateNetns, CreateVeth, Endpoint, NodeInfo, Plan, SetSysctl, ShapeEgress,
                   action_to_dict, choose_subnet, make_plan)
from .topology import Link, Topology, load_topology_dict
from .units import Duration, Loss, Rate

Progress = Callable[[int, int, str], None]
DIRECTIONS = ("forward", "reverse")
FAULT_ENV = "TESTBED_FAULT_STEP"  # test hook: SIGKILL ourselves before executing plan step N
LEDGER_CHUNK = 64  # actions recorded per fsync; down treats recorded-but-never-made as already gone


def require_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError("building a testbed needs root (network namespaces, veth, tc)", "run with sudo")


def host_routes() -> list[ipaddress.IPv4Network]:
    from pyroute2 import IPRoute

    out = []
    with IPRoute() as ipr:
        for r in ipr.get_routes(family=socket.AF_INET):
            dst = r.get_attr("RTA_DST")
            if dst and r["dst_len"] > 0 and r.get_attr("RTA_TABLE") in (254, None):
                out.append(ipaddress.ip_network(f"{dst}/{r['dst_len']}", strict=False))
    return out


class _Handles:
    """A few open netlink handles, least recently used closed first (1024 workers, 1024 fds)."""

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._h: OrderedDict[str, Rtnl] = OrderedDict()

    def put(self, rt: Rtnl) -> Rtnl:
        self._h[rt.ns] = rt
        self._h.move_to_end(rt.ns)
        while len(self._h) > self.capacity:
            self._h.popitem(last=False)[1].close()
        return rt

    def get(self, ns: str) -> Rtnl:
        rt = self._h.get(ns)
        if rt is None:
            return self.put(Rtnl.open(ns))
        self._h.move_to_end(ns)
        return rt

    def close(self) -> None:
        for rt in self._h.values():
            rt.close()
        self._h.clear()


_IFINDEX: dict[tuple[str, int | None, str], int] = {}
"""(namespace, its inode, interface) -> ifindex. An interface keeps its index for its whole
life, and the inode tells a namespace apart from a later one of the same name, so
repeated counter reads (the exporter's scrapes) skip the lookups."""


class NetlinkPool:
    """Netlink handles kept open between calls, keyed by (namespace, inode).

    Reopening a handle costs about as much as the qdisc dump itself, so a long-lived reader
    (the link exporter) keeps them. An open handle keeps its namespace alive after `ip netns
    del`, so the owner must :meth:`prune` or :meth:`close`: the exporter prunes the handles a
    scrape did not use, and `testbed down` stops a testbed's exporter before deleting its
    namespaces.
    """

    def __init__(self) -> None:
        self._h: dict[tuple[str, int], Rtnl] = {}
        self._used: set[tuple[str, int]] = set()

    def get(self, ns: str, ino: int) -> Rtnl:
        key = (ns, ino)
        self._used.add(key)
        rt = self._h.get(key)
        if rt is None:
            rt = self._h[key] = Rtnl.open(ns)
        return rt

    def drop(self, ns: str, ino: int) -> None:
        rt = self._h.pop((ns, ino), None)
        if rt is not None:
            rt.close()

    def prune(self) -> None:
        """Close the handles not used since the last prune."""
        for key in set(self._h) - self._used:
            self._h.pop(key).close()
        self._used = set()

    def close(self) -> None:
        for rt in self._h.values():
            rt.close()
        self._h.clear()
        self._used = set()


def _execute(action, handles: _Handles) -> None:
    if isinstance(action, CreateNetns):
        rt = handles.put(Rtnl.create_netns(action.ns))
        rt.init_namespace(action.tag)
    elif isinstance(action, SetSysctl):
        netns.set_sysctl(action.ns, action.key, action.value)
    elif isinstance(action, CreateBridge):
        handles.get(action.ns).add_bridge(action.ifname, action.stp, action.index)
    elif isinstance(action, CreateVeth):
        rt = handles.get(action.ns)
        rt.add_veth(action.ifname, action.peer_ns, action.peer_ifname, action.master, action.index)
        if action.peer_master:
            handles.get(action.peer_ns).set_master_up(action.peer_ifname, action.peer_master)
    elif isinstance(action, AddAddress):
        handles.get(action.ns).add_address_up(action.ifname, action.address, action.prefixlen)
    elif isinstance(action, ShapeEgress):
        tc.apply(handles.get(action.ns), action.ifname, action.shape)
    else:  # pragma: no cover - the plan only makes the types above
        raise TypeError(action)


class _Signals:
    """While building: SIGINT, SIGTERM and SIGHUP only set a flag, checked between actions.

    Raising KeyboardInterrupt asynchronously could land inside a pyroute2 call and leave
    its event loop half-run (a noisy "Event loop is closed" at exit); an action takes a few
    milliseconds, so checking between actions is just as prompt.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self.received: int | None = None
        self._old = {}
        for sig in self.SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._note)
            except ValueError:  # not the main thread: signals cannot be caught here anyway
                pass
        return self

    def _note(self, signum, frame):
        self.received = signum

    def check(self) -> None:
        if self.received is not None:
            raise KeyboardInterrupt(f"signal {self.received}")

    def __exit__(self, *exc):
        for sig, h in self._old.items():
            signal.signal(sig, h)


def _ignore_interrupts():
    try:
        return {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:
        return {}


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
        self._owned = False

    # ------------------------------------------------------------------ building
    @classmethod
    def preflight(cls, topology: Topology, exporter: str | None = None) -> Plan:
        """Every check that needs the kernel, before anything is created. Returns the plan."""
        require_root()
        if exporter is not None:
            procs.check_listen(exporter, "--exporter-listen", "127.0.0.1:0 (port 0: any free port)")
        if Ledger(topology.name).exists():
            raise StateError(f"testbed '{topology.name}' is already up (or a previous up did not finish)",
                             f"run `testbed down {topology.name}` first, or change 'name:' in the topology")
        if topology.needs_netem:
            from .net.probe import probe

            ok, detail = probe()["netem"]
            if not ok:
                link = next(l for l in topology.links if l.forward.needs_netem or l.reverse.needs_netem)
                shape = link.forward if link.forward.needs_netem else link.reverse
                field = "delay" if shape.delay else ("jitter" if shape.jitter else "loss")
                raise TopologyError(f"{link.path}.{field}",
                                    f"{field} needs the netem qdisc, which this kernel lacks ({detail})",
                                    tc.NETEM_MISSING_HINT)
        plan = make_plan(topology, choose_subnet(topology, host_routes()))
        taken = [ns for ns in plan.namespaces if netns.exists(ns)]
        if taken:
            raise StateError(f"network namespace(s) {', '.join(taken[:5])} already exist and are not this testbed's",
                             f"remove them (`ip netns del {taken[0]}`) or rename the testbed")
        return plan

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
            handles = _Handles()
            fault = int(os.environ.get(FAULT_ENV, "-1"))
            total = len(plan.actions)
            recorded = 0
            try:
                with _Signals() as signals:
                    for i, action in enumerate(plan.actions):
                        signals.check()
                        if i >= recorded:  # write ahead in chunks: one fsync per LEDGER_CHUNK actions
                            recorded = min(total, i + LEDGER_CHUNK)
                            ledger.record(*(action_to_dict(a) for a in plan.actions[i:recorded]))
                        if i == fault:
                            os.kill(os.getpid(), signal.SIGKILL)
                        _execute(action, handles)
                        if progress:
                            progress(i + 1, total, action.describe())
                    state["ready"] = True
                    ledger.write_state(state)
                    if exporter is not None:
                        signals.check()
                        state["exporter"] = _start_exporter(ledger, exporter, fault == total)
                        ledger.write_state(state)
            except BaseException as e:
                handles.close()
                old = _ignore_interrupts()
                try:
                    problems = _teardown(topology.name)
                finally:
                    for s, h in old.items():
                        signal.signal(s, h)
                if isinstance(e, KeyboardInterrupt):
                    raise TestbedError(f"interrupted while building '{topology.name}'; everything created was removed"
                                       + (f" except: {'; '.join(problems)}" if problems else "")) from None
                if problems and isinstance(e, TestbedError):
                    e.message += f" (cleanup also failed: {'; '.join(problems)})"
                raise
            finally:
                handles.close()
                ledger.close()
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
    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        info = self.node(node)
        return get_backend(info.backend or "netns").command(info.netns, argv)

    def spawn(self, node: str, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``node`` (no shell)."""
        return subprocess.Popen(self.command(node, argv), **popen_kwargs)

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
                  direction: str = "both") -> list[Link]:
        """Change running links in place; returns the links with their new shapes."""
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
                    s = replace(shapes[d], **changes)
                    if s.jitter and not s.delay:
                        raise TestbedError(f"link {l.name}: jitter {s.jitter} needs a delay", "also pass --delay")
                    shapes[d] = s
                new_links[idx] = replace(l, forward=shapes["forward"], reverse=shapes["reverse"])
            if any(s.needs_netem for l in new_links.values() for s in (l.forward, l.reverse)):
                from .net.probe import probe

                ok, detail = probe()["netem"]
                if not ok:
                    raise TestbedError(f"delay/jitter/loss need the netem qdisc, which this kernel lacks ({detail})",
                                       tc.NETEM_MISSING_HINT)
            handles = _Handles()
            try:
                for idx, l in new_links.items():
                    for d in dirs:
                        ep = self.egress[(idx, d)]
                        tc.change(handles.get(ep.ns), ep.ifname, l.shape(d))
            finally:
                handles.close()
            self.topology = current.with_links(new_links.get(l.index, l) for l in current.links)
            state["topology"] = self.topology.to_dict()
            self._state = state
            Ledger(self.name).write_state(state)
        return [new_links[i] for i in wanted]

    def link_counters(self, links: Iterable[Link] | None = None,
                      pool: "NetlinkPool | None" = None) -> dict[tuple[int, str], dict]:
        """Live egress counters (bytes, packets, drops, ...) per (link index, direction).

        ``pool`` keeps the netlink handles open between calls (an exporter's scrapes)."""
        wanted = None if links is None else {l.index for l in links}
        by_ns: dict[str, list[tuple[int, str, Endpoint]]] = {}
        for (idx, d), ep in self.egress.items():
            if wanted is None or idx in wanted:
                by_ns.setdefault(ep.ns, []).append((idx, d, ep))
        counters: dict[tuple[int, str], dict] = {}
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
        row[d] = {"src": src, "dst": dst, "shape": l.shape(d).to_dict(), "netns": ep.ns, "ifname": ep.ifname}
    return row


def exporter_target(name: str) -> Path:
    from collectors.sd import targets_dir

    return targets_dir() / f"testbed-{name}.json"


def _start_exporter(ledger: Ledger, listen: str, fault: bool = False, timeout: float = 30.0) -> str:
    """Start the testbed's link exporter on the host; returns its /metrics URL once it listens."""
    from collectors.sd import read_target

    target = exporter_target(ledger.name)
    marker = f"--sd-file={target}"
    ledger.record({"action": "StartExporter", "marker": marker, "target": str(target)})
    target.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "collectors", "--testbed", ledger.name, "--listen", listen, marker,
            "--sd-label", "exporter=links"]
    log = ledger.dir / "exporter.log"
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # Ctrl-C in the terminal is ours to handle
    if fault:  # test hook: die with the exporter running and recorded only in the ledger
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while (addr := read_target(target)) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace").strip()[-600:]
            raise TestbedError(f"the link exporter did not start: {tail or 'no output'}", f"see {log}")
        time.sleep(0.05)
    return f"http://{addr}/metrics"


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


# ---------------------------------------------------------------------- teardown


def _teardown(name: str) -> list[str]:
    """Undo everything in ``name``'s ledger, newest first; return the failures."""
    ledger = Ledger(name)
    entries = ledger.entries()
    namespaces = [e["ns"] for e in entries if e.get("action") == "CreateNetns"]
    problems: list[str] = []
    # Host-side processes first: an exporter's open netlink handles would keep the
    # namespaces alive after they are deleted.
    for e in entries:
        if e.get("action") == "StartExporter":
            procs.terminate(procs.with_arg(e["marker"]))
        if e.get("action") in ("StartExporter", "TargetFile"):
            Path(e["target"]).unlink(missing_ok=True)
    netns.kill_processes(namespaces)
    for e in reversed(entries):
        try:
            if e.get("action") == "CreateNetns":
                netns.remove(e["ns"])
            elif e.get("ns") not in namespaces and e.get("action") in ("CreateVeth", "CreateBridge"):
                # An object outside the testbed's own namespaces: delete it individually.
                if netns.exists(e["ns"]):
                    with Rtnl.open(e["ns"]) as rt:
                        rt.delete_link(e["ifname"])
            # Everything else lives inside a ledgered namespace and went with it.
        except (TestbedError, OSError) as err:
            problems.append(f"{e.get('action')} {e.get('ns')}: {err}")
    if not problems:
        ledger.remove()
    return problems


def down(name: str) -> bool:
    """Tear down testbed ``name``; False if it was not up. Idempotent."""
    require_root()
    with global_lock():
        if not Ledger(name).exists():
            return False
        problems = _teardown(name)
    if problems:
        raise KernelError(f"could not remove everything of '{name}': " + "; ".join(problems),
                          f"fix the cause and run `testbed down {name}` again")
    return True


def down_all() -> list[str]:
    """Tear down every testbed in the state dir, then any tagged namespace left without a ledger."""
    require_root()
    removed: list[str] = []
    problems: list[str] = []
    with global_lock():
        for name in Ledger.all_names():
            p = _teardown(name)
            problems += p
            if not p:
                removed.append(name)
        orphans: dict[str, list[str]] = {}
        for ns in netns.list_all():
            try:
                with Rtnl.open(ns) as rt:
                    owner = naming.testbed_of_tag(rt.lo_alias())
            except TestbedError:
                continue
            if owner:
                orphans.setdefault(owner, []).append(ns)
        for owner, nss in orphans.items():
            target = exporter_target(owner)  # its exporter, if the lost ledger had started one
            procs.terminate(procs.with_arg(f"--sd-file={target}"))
            target.unlink(missing_ok=True)
            netns.kill_processes(nss)
            for ns in nss:
                try:
                    netns.remove(ns)
                except TestbedError as e:
                    problems.append(str(e))
            if owner not in removed:
                removed.append(owner)
    if problems:
        raise KernelError("could not remove everything: " + "; ".join(problems))
    return removed


def list_testbeds() -> list[dict]:
    out = []
    for name in Ledger.all_names():
        st = Ledger(name).read_state() or {}
        out.append({
            "name": name,
            "ready": st.get("ready", False),
            "created": st.get("created"),
            "workers": sum(1 for n in st.get("nodes", {}).values() if n.get("kind") == "worker"),
            "links": len(st.get("topology", {}).get("links", [])),
            "source": st.get("source"),
        })
    return out
