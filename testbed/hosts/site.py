"""Where a running testbed's nodes and link ends are, seen from this process: a Site.

One interface, two implementations: :class:`LocalSite` (this machine: the node's backend
starts commands, netlink reads counters and changes shapes) and :class:`SshSite` (another
host of a multi-host testbed: commands are relayed by :mod:`testbed.hosts.ssh.relay`, counters
and shapes are asked of its ``testbed _host`` over SSH). ``Testbed.site(host)`` picks one;
the engine and the launcher never ask whether a host is remote.

A run's directory has the same two faces (:meth:`Site.open_run`): here it is the run
directory itself, mounted into the nodes; on another host it is that host's directory of
the run, its inputs uploaded and what the ranks write copied back
(:mod:`testbed.hosts.runplace`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from testbed.common import procs
from testbed.common.digits import ascii_int
from testbed.common.errors import StateError, TestbedError
from testbed.hosts.local import LOCAL
from testbed.hosts.runplace import CodeTree, LocalRun, RemoteRun, RunPlace
from testbed.model.topology import DIRECTIONS, Shape
from testbed.net import netns, tc
from testbed.net.rtnl import Rtnl
from testbed.net.tcbatch import LinkChanger
from testbed.nodes import get as get_backend
from testbed.plan.plan import Endpoint, NodeInfo

if TYPE_CHECKING:
    from testbed.hosts.session import AgentSession
    from testbed.hosts.ssh.client import Remote

WHY_TIMEOUT = 20.0
"""Seconds another host gets to say why a node's process stopped (a VM's probe takes 5)."""
MAX_WHY = 4000
"""Characters of another host's reason that are kept (it comes from untrusted input)."""

_IFINDEX: dict[tuple[str, int | None, str], int] = {}
"""(namespace, its inode, interface) -> ifindex. An interface keeps its index for its whole
life, and the inode tells a namespace apart from a later one of the same name, so
repeated counter reads (the exporter's scrapes) skip the lookups."""


@dataclass(frozen=True)
class ShapeChange:
    """One direction of one link to reshape: where it leaves, the shape wanted, the one in force."""

    link: int
    direction: str
    label: str
    """How errors name it: ``LINK DIRECTION``."""
    endpoint: Endpoint
    new: Shape
    old: Shape


class Site(ABC):
    """The part of a testbed on one host."""

    order = 0
    """Shapes change on sites in this order: other hosts first, so a refusal there leaves
    nothing changed here."""

    def __init__(self, tb, host: str):
        self.tb, self.host = tb, host

    @abstractmethod
    def command(self, info: NodeInfo, argv: Sequence[str], *, mounts: Sequence[Path] = (),
                cwd: Path | None = None) -> list[str]:
        """Argv for this process that runs ``argv`` inside node ``info`` (no shell)."""

    @abstractmethod
    def shape(self, changes: list[ShapeChange], changer: LinkChanger, copies: dict | None = None) -> None:
        """Change these link ends (all on this site) in place; ``copies``: link index ->
        direction -> the new shape, for a host that keeps its own copy of the state."""

    @abstractmethod
    def counters(self, ends: list[tuple[int, str, Endpoint]], pool=None) -> dict[tuple[int, str], dict]:
        """Live egress counters of these link ends, per (link index, direction)."""

    @abstractmethod
    def open_run(self, run_dir: Path, mounts: Sequence[Path], code: CodeTree | None = None) -> RunPlace:
        """The run directory as the ranks on this site see it (``code``: the user's code,
        which another host gets a copy of)."""

    @abstractmethod
    def why_stopped(self, info: NodeInfo) -> str | None:
        """Why a process in node ``info`` may have died beyond its own doing, as its backend
        tells on the node's own host (None: nothing known)."""

    def close(self) -> None:
        pass


class LocalSite(Site):
    """The host this process runs on."""

    order = 1

    def command(self, info, argv, *, mounts=(), cwd=None):
        return get_backend(info.backend).command(info, argv, mounts=mounts, cwd=cwd)

    def why_stopped(self, info):
        return get_backend(info.backend).why_stopped(info)

    def shape(self, changes, changer, copies=None):
        if not changes:
            return
        try:
            changer.apply([(c.endpoint, c.new, f"{c.label}: changing the shape") for c in changes])
        except BaseException as e:
            # the others may have applied: put back their shapes from before, so kernel and state agree
            failed = set(getattr(e, "failed", ()))
            try:
                changer.apply([(c.endpoint, c.old, f"{c.label}: restoring") for c in changes
                               if f"{c.label}: changing the shape" not in failed])
                restored = ""
            except Exception as err:  # reported with the original error below
                restored = str(err)
            if isinstance(e, TestbedError):
                e.message += (" (the shapes from before were restored)" if not restored
                              else f" (restoring failed too: {restored})")
            raise

    def counters(self, ends, pool=None):
        by_ns: dict[str, list[tuple[int, str, Endpoint]]] = {}
        for idx, d, ep in ends:
            by_ns.setdefault(ep.ns, []).append((idx, d, ep))
        out: dict[tuple[int, str], dict] = {}
        for ns, eps in by_ns.items():
            ino = netns.inode(ns)
            if ino is None:
                raise StateError(f"network namespace {ns} of testbed '{self.tb.name}' is gone",
                                 f"`testbed down {self.tb.name}` removes the rest")
            stats = _egress_stats(ns, ino, [ep.ifname for _, _, ep in eps], pool)
            for idx, d, ep in eps:
                out[(idx, d)] = stats.get(_IFINDEX[(ns, ino, ep.ifname)], {})
        return out

    def open_run(self, run_dir, mounts, code=None):
        return LocalRun(self.tb, run_dir, mounts)  # the code's directory is among the mounts


def _egress_stats(ns: str, ino: int, ifnames: list[str], pool) -> dict[int, dict]:
    """Egress counters per ifindex in ``ns``; learns the indexes of ``ifnames`` not yet known."""
    rt = pool.get(ns, ino) if pool is not None else Rtnl.open(ns)
    try:
        stats = tc.egress_stats(rt)
        todo = [name for name in ifnames if (ns, ino, name) not in _IFINDEX]
        if len(todo) > 1:
            rt.load_indexes()
        for name in todo:
            _IFINDEX[(ns, ino, name)] = rt.index(name)
        return stats
    except BaseException:
        if pool is not None:
            pool.drop(ns, ino)
        raise
    finally:
        if pool is None:
            rt.close()


class SshSite(Site):
    """Another host of a multi-host testbed, reached from the controller over SSH."""

    order = 0

    def __init__(self, tb, host: str):
        if tb.here != LOCAL:
            raise StateError(f"this is host {tb.here}'s share of testbed '{tb.name}', and host {host} is another's",
                             "run this on the controller (where `testbed up` ran)")
        super().__init__(tb, host)
        self.spec = tb.topology.host(host)
        self._remote: Remote | None = None
        self._session: AgentSession | None = None

    @property
    def remote(self):
        """The SSH link to the host, opened on first use."""
        from testbed.hosts.ssh.client import Remote

        if self._remote is None:
            self._remote = Remote(self.spec)
        return self._remote

    @property
    def agent(self):
        """This testbed's agent on the host, kept running for repeated requests."""
        from testbed.hosts.session import AgentSession

        if self._session is None:
            self._session = AgentSession(self.remote, self.tb.name)
        return self._session

    def command(self, info, argv, *, mounts=(), cwd=None):
        if mounts or cwd is not None:
            raise TestbedError(f"node {info.name} is on host {self.host}: host directories cannot be mounted there")
        return self.relay(info.name, argv)

    def relay(self, node: str, argv: Sequence[str], *, python: bool = False, run: str | None = None,
              env: dict[str, str] | None = None, mounts: Sequence[Path] = ()) -> list[str]:
        """Argv that runs ``argv`` in ``node`` there, relayed over SSH by
        :mod:`testbed.hosts.ssh.relay`. ``python``: ``argv`` is MODULE ARGS for the node's Python
        there; ``run``: start in that host's directory of the run; ``env``: variables set on
        top of the node's own environment there; ``mounts``: directories that exist on that
        host too (a container sees them)."""
        opts = (["--python"] if python else []) + ([f"--run={run}"] if run else [])
        opts += [f"--env={k}={v}" for k, v in (env or {}).items()] + [f"--mount={m}" for m in mounts]
        return procs.python_argv("testbed.hosts.ssh.relay", "--host", json.dumps(self.spec.to_dict()),
                                 "--testbed", self.tb.name, "--node", node,
                                 *(f"--remote-opt={o}" for o in opts), "--", *argv)

    def shape(self, changes, changer, copies=None):
        items = [{"link": c.link, "direction": c.direction, "shape": c.new.to_dict(), "old": c.old.to_dict()}
                 for c in changes]
        self.agent.ask("shape", {"changes": items, "copies": {str(i): v for i, v in (copies or {}).items()}})

    def counters(self, ends, pool=None):
        wanted = {(idx, d) for idx, d, _ in ends}
        got = self.agent.ask("counters").get("counters")
        if not isinstance(got, dict):
            raise StateError(f"host {self.host} answered counters without counters")
        out: dict[tuple[int, str], dict] = {}
        for key, c in got.items():
            text, _, d = str(key).partition("/")
            i = ascii_int(text)
            if i is None or d not in DIRECTIONS or not isinstance(c, dict):
                raise StateError(f"host {self.host} answered a malformed counter key {str(key)[:40]!r}")
            if (i, d) in wanted:
                out[(i, d)] = {k: v for k, v in c.items() if isinstance(v, (int, float))}
        return out

    def open_run(self, run_dir, mounts, code=None):
        return RemoteRun(self, run_dir, mounts, code)

    def why_stopped(self, info):
        """The node's backend asked on its host (this machine has no such container or VM);
        a host that does not answer is itself the likely reason."""
        try:
            why = self.agent.ask("why", {"node": info.name}, timeout=WHY_TIMEOUT).get("why")
        except TestbedError as e:
            return f"its host {self.host} did not say why: {e}"
        return why[:MAX_WHY] if isinstance(why, str) and why else None

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._remote is not None:
            self._remote.close()
            self._remote = None
