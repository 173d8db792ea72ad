"""Hosts: where kernel calls happen. An endpoint is (host, namespace handle, ifname).

Actions reach the kernel exclusively through the host they run on, so they never assume
where they run. Another host of a multi-host testbed runs its share of the plan with the
testbed package on its side (``testbed _host apply`` over SSH, :mod:`testbed.engine.hostagent`),
through its own LocalHost; the controller only talks to it (:mod:`testbed.hosts.ssh.client`).
"""

from __future__ import annotations

from testbed.net import netns
from testbed.net.handles import HandleCache
from testbed.net.rtnl import Rtnl

from testbed.model.topology import LOCAL_HOST as LOCAL  # noqa: E402


class LocalHost:
    """This machine: namespaces under /run/netns, netlink through pyroute2."""

    name = LOCAL

    def __init__(self) -> None:
        self._handles = HandleCache()
        self._docker = None

    def docker(self):
        """The local Docker engine (docker SDK client), connected on first use."""
        if self._docker is None:
            from testbed.nodes.docker.api import client

            self._docker = client()
        return self._docker

    def rtnl(self, ns: str) -> Rtnl:
        """An open netlink handle inside namespace ``ns`` (cached; do not close it)."""
        return self._handles.get(ns)

    def create_netns(self, ns: str) -> Rtnl:
        return self._handles.put(Rtnl.create_netns(ns))

    def attach_netns(self, ns: str, pid: int) -> Rtnl:
        """Name the network namespace of process ``pid`` (a container's) as ``ns``."""
        netns.attach(ns, pid)
        return self._handles.put(Rtnl.open(ns))

    def remove_netns(self, ns: str) -> bool:
        self._handles.discard(ns)
        return netns.remove(ns)

    def netns_exists(self, ns: str) -> bool:
        return netns.exists(ns)

    def set_sysctl(self, ns: str, key: str, value: str) -> None:
        netns.set_sysctl(ns, key, value)

    def delete_link(self, ns: str, ifname: str) -> bool:
        if not netns.exists(ns):
            return False
        with Rtnl.open(ns) as rt:
            return rt.delete_link(ifname)

    def kill_processes(self, namespaces: list[str]) -> list[int]:
        """Stop every process in the namespaces; a TestbedError names any that SIGKILL did not end."""
        return netns.stop_processes(namespaces, "processes in the nodes")

    def close(self) -> None:
        self._handles.close()
        if self._docker is not None:
            self._docker.close()
            self._docker = None


def get(name: str | None) -> LocalHost:
    """The host an endpoint or node names (only the local one exists yet)."""
    from testbed.common.errors import StateError

    if name not in (None, LOCAL):
        raise StateError(f"unknown host {name!r}", "only the local host is supported")
    return LocalHost()
