"""Netlink handles kept open: a small LRU cache for building, a pool for long-lived readers."""

from __future__ import annotations

from collections import OrderedDict

from testbed.net.rtnl import Rtnl


class HandleCache:
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

    def discard(self, ns: str) -> None:
        rt = self._h.pop(ns, None)
        if rt is not None:
            rt.close()

    def close(self) -> None:
        for rt in self._h.values():
            rt.close()
        self._h.clear()


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
