"""A netlink (rtnetlink) handle bound to one network namespace, with errors translated.

pyroute2 (0.1 s to import: its package imports every protocol it speaks) is imported when
a handle is first made, not with this module: ``down`` and ``status`` import the engine,
which imports this, and need no netlink handle of their own."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from testbed.common.errors import KernelError
from testbed.net import netns
from testbed.net.nlbatch import HINTS, ShapeBatch, send_messages

if TYPE_CHECKING:
    from pyroute2.netlink.exceptions import NetlinkError

def translate(e: NetlinkError, what: str, ns: str) -> KernelError:
    code = e.code if isinstance(e.code, int) else errno.EIO
    return KernelError(f"[{ns}] {what} failed: {os.strerror(code)} (errno {code})", HINTS.get(code))


class Rtnl:
    """``IPRoute`` for one namespace; interface indexes cached by name."""

    def __init__(self, ns: str, fd: int):
        from pyroute2.iproute.linux import IPRoute

        self.ns = ns
        self.ipr = IPRoute(fileno=fd)
        self._index: dict[str, int] = {}
        self._batch: ShapeBatch | None = None

    @classmethod
    def create_netns(cls, ns: str) -> "Rtnl":
        return cls(ns, netns.create(ns))

    @classmethod
    def open(cls, ns: str) -> "Rtnl":
        return cls(ns, netns.open_netlink(ns))

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
        try:
            self.ipr.close()
        except Exception:
            pass

    def __enter__(self) -> "Rtnl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, what: str, method: str, *args, **kwargs):
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            return getattr(self.ipr, method)(*args, **kwargs)
        except NetlinkError as e:
            raise translate(e, what, self.ns) from None

    def send(self, messages: Sequence[bytes], name: Callable[[int], str]) -> None:
        """Encoded requests (:mod:`testbed.net.nlbatch`) sent in few datagrams, not one round
        trip each through pyroute2, on a second socket in this namespace kept with the handle;
        the first refusal raised, named by ``name`` of the message's index."""
        if self._batch is None:
            self._batch = ShapeBatch()
        send_messages(self.ns, messages, name, batch=self._batch)

    def index(self, ifname: str) -> int:
        idx = self._index.get(ifname)
        if idx is None:
            found = self.call(f"looking up {ifname}", "link_lookup", ifname=ifname)
            if not found:
                raise KernelError(f"[{self.ns}] interface {ifname} does not exist")
            idx = self._index[ifname] = found[0]
        return idx

    def load_indexes(self) -> None:
        """Learn every interface's index with one dump (cheaper than a lookup per name)."""
        for msg in self.call("listing interfaces", "get_links"):
            self._index[msg.get_attr("IFLA_IFNAME")] = msg["index"]

    # ------------------------------------------------------------- links
    def init_namespace(self, tag: str) -> None:
        """Loopback up and the ownership tag on it."""
        self.call("setting lo up", "link", "set", index=1, state="up", ifalias=tag)

    def lo_alias(self) -> str | None:
        for msg in self.call("reading lo", "link", "get", index=1):
            return msg.get("ifalias") or msg.get_attr("IFLA_IFALIAS")
        return None

    def add_bridge(self, ifname: str, stp: bool, index: int | None = None) -> None:
        kw = {"br_stp_state": 1, "br_forward_delay": 400} if stp else {}
        if index is not None:
            kw["index"] = index
        self.call(f"creating bridge {ifname}", "link", "add", ifname=ifname, kind="bridge", state="up", **kw)
        if index is not None:
            self._index[ifname] = index

    def add_veth(self, ifname: str, peer_ns: str, peer_ifname: str, master: str | None,
                 index: int | None = None, mtu: int | None = None, gso_max_size: int | None = None) -> None:
        """Create a veth pair; ``index`` pins the local end's interface index (no lookup later);
        ``mtu`` and ``gso_max_size`` apply to both ends."""
        peer: dict = {"ifname": peer_ifname}
        if mtu is not None:
            peer["mtu"] = mtu
        if gso_max_size is not None:
            peer["gso_max_size"] = gso_max_size
        fd = None
        if peer_ns != self.ns:
            try:
                fd = os.open(netns.path(peer_ns), os.O_RDONLY)
            except FileNotFoundError:
                raise KernelError(f"network namespace '{peer_ns}' does not exist") from None
            peer["net_ns_fd"] = fd
        kw = {"master": self.index(master)} if master else {}
        if index is not None:
            kw["index"] = index
        if mtu is not None:
            kw["mtu"] = mtu
        if gso_max_size is not None:
            kw["gso_max_size"] = gso_max_size
        try:
            self.call(f"creating veth {ifname} <-> {peer_ns}/{peer_ifname}", "link", "add",
                      ifname=ifname, kind="veth", state="up", peer=peer, **kw)
        finally:
            if fd is not None:
                os.close(fd)
        if index is not None:
            self._index[ifname] = index

    def set_master_up(self, ifname: str, master: str) -> None:
        self.call(f"attaching {ifname} to {master}", "link", "set", index=self.index(ifname),
                  master=self.index(master), state="up")

    def add_address_up(self, ifname: str, address: str, prefixlen: int, mac: str | None = None) -> None:
        idx = self.index(ifname)
        if mac is not None:  # while it is down
            self.call(f"setting {ifname}'s MAC address to {mac}", "link", "set", index=idx, address=mac)
        self.call(f"adding {address}/{prefixlen} to {ifname}", "addr", "add", index=idx,
                  address=address, prefixlen=prefixlen)
        self.call(f"setting {ifname} up", "link", "set", index=idx, state="up")

    def delete_link(self, ifname: str) -> bool:
        found = self.call(f"looking up {ifname}", "link_lookup", ifname=ifname)
        if not found:
            return False
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            self.ipr.link("del", index=found[0])
        except NetlinkError as e:
            if e.code == errno.ENODEV:
                return False
            raise translate(e, f"deleting {ifname}", self.ns) from None
        return True


def add_vxlan(ns: str, ifname: str, vni: int, local: str, remote: str, port: int, mtu: int) -> None:
    """A VXLAN device to ``remote`` created from *this* process's namespace (the host's, so
    its UDP socket lives on the underlay) straight into namespace ``ns`` as ``ifname``."""
    try:
        fd = os.open(netns.path(ns), os.O_RDONLY)
    except FileNotFoundError:
        raise KernelError(f"network namespace '{ns}' does not exist") from None
    from pyroute2.iproute.linux import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=ifname, kind="vxlan", vxlan_id=vni, vxlan_local=local, vxlan_group=remote,
                     vxlan_port=port, vxlan_learning=1, mtu=mtu, net_ns_fd=fd)
    except NetlinkError as e:
        err = translate(e, f"creating VXLAN {ifname} (VNI {vni}, {local} -> {remote}:{port})", ns)
        if e.code == errno.EEXIST:
            err.hint = (f"another VXLAN device on this host uses VNI {vni} on UDP port {port} "
                        "(another testbed?); set vxlan: {port: N} in the topology to another port")
        raise err from None
    finally:
        os.close(fd)
