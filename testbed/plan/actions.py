"""Actions: the steps of a plan, each owning how it is performed and how it is undone.

A plan (:mod:`testbed.plan.plan`) is an ordered list of actions. ``up`` records each one in the
ledger *before* :meth:`Action.apply` runs it; ``down`` turns the ledger's entries back into
actions (:func:`from_dict`) and reverses them, newest first, in two passes:

1. :meth:`Action.release` stops what keeps the action's objects busy: host processes (an
   exporter holds netlink handles into the namespaces), processes inside the nodes, a
   node's container. Processes inside namespaces are collected and stopped together, so
   one grace period covers them all.
2. :meth:`Action.undo` removes the object. "Already gone" is success: the entry may have
   been recorded ahead of a crash that came before the object existed.

An object that lives inside a namespace the testbed created (a bridge, a veth end, an
address, a qdisc) goes with that namespace; its undo only acts when the namespace is not
the testbed's own. A new kind of node or link (a container, a VM, a tunnel) adds action
classes here or in its backend module, registered with :func:`register`; nothing else
branches on what a node is made of.

What an action is, the registry and the contexts: :mod:`testbed.plan.base` (re-exported here).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from testbed.common import procs
from testbed.common.errors import StateError, TestbedError
from testbed.common.files import tail_text
from testbed.monitor import auth
from testbed.model.topology import Shape
from testbed.plan.base import (  # noqa: F401  (the actions' API, one import path)
    Action, ApplyContext, Teardown, from_dict, register, registered,
)

# ---------------------------------------------------------------------- namespaces and links


@register
@dataclass(frozen=True)
class CreateNetns(Action):
    ns: str
    tag: str
    creates_namespace: ClassVar[bool] = True

    def describe(self) -> str:
        return f"netns add {self.ns}  (lo up, alias {self.tag})"

    def apply(self, ctx: ApplyContext) -> None:
        ctx.host.create_netns(self.ns).init_namespace(self.tag)

    def release(self, td: Teardown) -> None:
        td.kill_in.append(self.ns)

    def undo(self, td: Teardown) -> None:
        td.host.remove_netns(self.ns)


@register
@dataclass(frozen=True)
class SetSysctl(Action):
    ns: str
    key: str
    value: str

    def describe(self) -> str:
        return f"[{self.ns}] sysctl {self.key}={self.value}"

    def apply(self, ctx: ApplyContext) -> None:
        ctx.host.set_sysctl(self.ns, self.key, self.value)


class _InterfaceAction(Action):
    """Undo deletes the interface only when its namespace is not one the testbed owns."""

    ns: str  # fields of each subclass (a dataclass); declared here for the type checker
    ifname: str

    def undo(self, td: Teardown) -> None:
        if self.ns not in td.owned:
            td.host.delete_link(self.ns, self.ifname)


@register
@dataclass(frozen=True)
class CreateBridge(_InterfaceAction):
    ns: str
    ifname: str
    switch: str
    stp: bool = False
    index: int | None = None

    def describe(self) -> str:
        return f"[{self.ns}] bridge {self.ifname} for switch {self.switch}" + (" stp on" if self.stp else "")

    def apply(self, ctx: ApplyContext) -> None:
        ctx.host.rtnl(self.ns).add_bridge(self.ifname, self.stp, self.index)


@register
@dataclass(frozen=True)
class CreateVeth(_InterfaceAction):
    ns: str
    ifname: str
    peer_ns: str
    peer_ifname: str
    master: str | None = None
    peer_master: str | None = None
    link: int = -1
    index: int | None = None
    mtu: int | None = None
    gso_max_size: int | None = None
    """Both ends' largest GSO frame (a tunnel link's ends: one frame fits one datagram)."""
    peer_up: bool = False
    """Bring the peer end up though it joins no bridge (a tunnel link's forwarder side)."""

    def describe(self) -> str:
        m = f" master {self.master}" if self.master else ""
        pm = f" master {self.peer_master}" if self.peer_master else ""
        mtu = f" mtu {self.mtu}" if self.mtu else ""
        gso = f" gso_max_size {self.gso_max_size}" if self.gso_max_size else ""
        return (f"[{self.ns}] veth {self.ifname}{m} <-> [{self.peer_ns}] {self.peer_ifname}{pm}{mtu}{gso}  "
                f"(links[{self.link}])")

    def apply(self, ctx: ApplyContext) -> None:
        ctx.host.rtnl(self.ns).add_veth(self.ifname, self.peer_ns, self.peer_ifname, self.master, self.index,
                                        self.mtu, self.gso_max_size)
        if self.peer_master:
            ctx.host.rtnl(self.peer_ns).set_master_up(self.peer_ifname, self.peer_master)
        elif self.peer_up:
            rt = ctx.host.rtnl(self.peer_ns)
            rt.call(f"setting {self.peer_ifname} up", "link", "set", index=rt.index(self.peer_ifname), state="up")


@register
@dataclass(frozen=True)
class CreateVxlan(_InterfaceAction):
    """One end of a link whose other end is on another host: a VXLAN device (its UDP
    socket on this host's underlay) in the node's or the switches' namespace. It plays the
    veth end's role: shaped, counted and bridged the same way."""

    ns: str
    ifname: str
    vni: int
    local: str
    remote: str
    port: int
    mtu: int
    master: str | None = None
    link: int = -1

    def describe(self) -> str:
        m = f" master {self.master}" if self.master else ""
        return (f"[{self.ns}] vxlan {self.ifname}{m} vni {self.vni} {self.local} -> {self.remote}:{self.port} "
                f"mtu {self.mtu}  (links[{self.link}])")

    def apply(self, ctx: ApplyContext) -> None:
        from testbed.net.rtnl import add_vxlan

        add_vxlan(self.ns, self.ifname, self.vni, self.local, self.remote, self.port, self.mtu)
        rt = ctx.host.rtnl(self.ns)
        if self.master:
            rt.set_master_up(self.ifname, self.master)
        else:
            rt.call(f"setting {self.ifname} up", "link", "set", index=rt.index(self.ifname), state="up")


@register
@dataclass(frozen=True)
class AddAddress(Action):
    ns: str
    ifname: str
    address: str
    prefixlen: int
    mac: str | None = None
    """Set before the address (the plan's, so that every worker knows it: StaticNeighbours)."""

    def describe(self) -> str:
        mac = f" lladdr {self.mac}" if self.mac else ""
        return f"[{self.ns}] addr {self.address}/{self.prefixlen} dev {self.ifname}{mac} up"

    def apply(self, ctx: ApplyContext) -> None:
        ctx.host.rtnl(self.ns).add_address_up(self.ifname, self.address, self.prefixlen, self.mac)


@register
@dataclass(frozen=True)
class StaticNeighbours(Action):
    """Permanent ARP entries for every other worker, as Mininet's ``staticArp``. The kernel's
    neighbour table is one for all network namespaces, its size bounded by the host's
    ``gc_thresh3`` (1024 by default): a full mesh of N workers needs N (N - 1) dynamic
    entries, so beyond 32 workers gloo's connects failed with "No route to host" (the kernel
    logs "neighbor table overflow"). Permanent entries are not counted against it, and no
    ARP request crosses the shaped links. Removed with the namespace."""

    ns: str
    ifname: str
    entries: tuple
    """"ADDRESS MAC" of each other worker (flat: a ledger holds no nested values)."""

    def describe(self) -> str:
        return f"[{self.ns}] {len(self.entries)} permanent neighbour entries on {self.ifname}"

    def apply(self, ctx: ApplyContext) -> None:
        from testbed.net import tcbatch

        pairs = [str(e).split(" ", 1) for e in self.entries]
        tcbatch.add_neighbours(ctx.host.rtnl(self.ns), self.ifname, [(p[0], p[-1]) for p in pairs])


@register
@dataclass(frozen=True)
class ShapeEgress(Action):
    ns: str
    ifname: str
    shape: Shape
    link: int
    direction: str

    def describe(self) -> str:
        return f"[{self.ns}] tc htb on {self.ifname}: {self.shape.describe()}  (links[{self.link}] {self.direction})"

    def apply(self, ctx: ApplyContext) -> None:
        from testbed.net import tc

        tc.apply(ctx.host.rtnl(self.ns), self.ifname, self.shape)


# ---------------------------------------------------------------------- host processes and files


@register
@dataclass(frozen=True)
class StartExporter(Action):
    """The testbed's link exporter: a host process found again by its ``--sd-file`` argument."""

    marker: str
    target: str
    listen: str = "127.0.0.1:0"
    log: str = "/dev/null"

    def describe(self) -> str:
        return f"link exporter on {self.listen} (file-SD target {self.target})"

    def apply(self, ctx: ApplyContext) -> None:
        self.wait(self.spawn(ctx), ctx)

    def spawn(self, ctx: ApplyContext) -> subprocess.Popen:
        """Start the exporter and return at once: `up` starts it before building the network
        (it attaches to the testbed on each scrape) and waits for it at the end (:meth:`wait`)."""
        Path(self.target).unlink(missing_ok=True)
        argv = procs.python_argv("collectors", "--testbed", ctx.testbed, "--listen", self.listen, self.marker,
                                 "--sd-label", "exporter=links", *auth.exporter_args())
        with open(self.log, "ab") as f:
            return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # Ctrl-C in the terminal is ours to handle

    def wait(self, proc: subprocess.Popen, ctx: ApplyContext) -> None:
        """Until the exporter announces its address in the target file (``ctx.results["exporter"]``)."""
        from testbed.monitor.sd import read_target

        if ctx.fault_after_exporter:  # test hook: die with the exporter running, recorded only in the ledger
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.monotonic()
        while (addr := read_target(Path(self.target))) is None:
            waited = time.monotonic() - start
            if proc.poll() is not None or waited > 30.0:
                tail = tail_text(Path(self.log)).strip()[-600:]
                raise TestbedError(f"the link exporter did not start: {tail or 'no output'}", f"see {self.log}")
            # it announces itself within tens of ms (collectors.__main__), often before the build
            # is done: a look costs a stat, so every 3 ms for the first second, then every 50
            time.sleep(0.003 if waited < 1.0 else 0.05)
        ctx.results["exporter"] = f"http://{addr}/metrics"

    def release(self, td: Teardown) -> None:
        _check_target(self.target, f"testbed-{td.testbed}.json")
        if self.marker != f"--sd-file={self.target}":
            raise TestbedError(f"exporter marker {self.marker!r} does not name its target file; left alone")
        procs.stop(procs.with_arg(self.marker), f"testbed {td.testbed}'s link exporter")
        Path(self.target).unlink(missing_ok=True)


REPLAY_MARKER = re.compile(r"--replay-id=[0-9a-f]{32}")
TRAFFIC_MARKER = re.compile(r"--logfile=(/.+)/traffic-(\d+)-(server|client)\.log")


@dataclass(frozen=True)
class _MarkedProcess(Action):
    """A process testbed started after ``up``, found again by an argument only it carries
    (``marker``). The marker comes from a ledger, so it must have the form testbed writes:
    one that could name a process testbed did not start is refused before any signal."""

    marker: str
    FORM: ClassVar[re.Pattern]
    NOUN: ClassVar[str]
    WRITTEN: ClassVar[str]

    def valid(self) -> bool:
        return bool(self.FORM.fullmatch(self.marker))

    def pids(self) -> list[int]:
        return procs.with_arg(self.marker) if self.valid() else []

    def release(self, td: Teardown) -> None:
        if not self.valid():
            raise TestbedError(f"{self.NOUN} marker {self.marker!r} is not {self.WRITTEN}; left alone")
        # killed outright: what they touch goes with the testbed (and a replay putting the
        # shapes back would wait for the lock this teardown holds)
        procs.stop(self.pids(), f"testbed {td.testbed}'s {self.NOUN} process", grace=0.0)


@register
@dataclass(frozen=True)
class StartReplay(_MarkedProcess):
    """A trace replay running in the background (``link replay --background``, ``run
    --bw-trace``, a topology ``schedule:``): a host process found by its ``--replay-id``."""

    log: str
    FORM: ClassVar[re.Pattern] = REPLAY_MARKER
    NOUN: ClassVar[str] = "replay"
    WRITTEN: ClassVar[str] = "--replay-id=<32 hex digits>"

    def describe(self) -> str:
        return f"trace replay (steps logged to {self.log})"


@register
@dataclass(frozen=True)
class StartTraffic(_MarkedProcess):
    """A cross-traffic iperf3 process inside a node (:mod:`testbed.runs.traffic`), found by its
    ``--logfile=`` argument (a ``traffic-N-server|client.log`` in a run directory)."""

    FORM: ClassVar[re.Pattern] = TRAFFIC_MARKER
    NOUN: ClassVar[str] = "cross-traffic"
    WRITTEN: ClassVar[str] = "--logfile=<run dir>/traffic-N-ROLE.log"

    def describe(self) -> str:
        return f"cross-traffic iperf3 ({self.marker})"


def recorded(name: str, cls: type) -> list:
    """The actions of class ``cls`` in testbed ``name``'s ledger (unreadable entries skipped)."""
    from testbed.plan.ledger import Ledger

    out = []
    for e in Ledger(name).entries():
        if isinstance(e, dict) and e.get("action") == cls.__name__:
            try:
                out.append(from_dict(e))
            except StateError:
                continue
    return out


@register
@dataclass(frozen=True)
class TargetFile(Action):
    """A file-SD target file written by a run's exporter (removed if the run dies), or the
    one announcing another host's link exporter (``testbed-NAME@HOST.json``)."""

    target: str

    def describe(self) -> str:
        return f"file-SD target {self.target}"

    def release(self, td: Teardown) -> None:
        name = Path(self.target).name
        _check_target(self.target, f"testbed-{td.testbed}@*.json" if name.startswith("testbed-")
                      else f"run-{td.testbed}-*.json")
        Path(self.target).unlink(missing_ok=True)


def _check_target(path: str, pattern: str) -> None:
    """A target file named by a ledger is removed only if it is one this testbed writes."""
    from testbed.monitor.sd import targets_dir

    p = Path(path)
    if p.parent != targets_dir() or not p.match(pattern):
        raise TestbedError(f"target file {path!r} is not {targets_dir()}/{pattern}; left alone")
