"""Link kinds: how a link between two ends is made, one class each, chosen in order.

A link joins two ends, each (namespace, interface, bridge it joins or None, host). ``veth``
joins ends on one host; ``vxlan`` joins ends on two hosts (a VXLAN device at each end, one
VNI per link, the inner MTU lowered). A new kind is one class here plus its place in
:data:`LINK_KINDS` (the first kind that ``joins`` the two ends makes the link); its actions
live with it (:mod:`testbed.plan.actions`) or in its own module, registered.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, NamedTuple

from testbed.common.errors import TopologyError
from testbed.plan.actions import Action, CreateVeth, CreateVxlan
from testbed.plan.plan import vni_base


class End(NamedTuple):
    ns: str
    ifname: str
    master: str | None
    """The bridge in ``ns`` this end joins (a switch's, or a VM's NIC bridge), or None."""
    host: str


@dataclass(frozen=True)
class LinkContext:
    """What every link of one plan shares."""

    testbed: str
    mtu: int
    """The data plane's MTU (1500 unless the topology lowers it)."""
    underlays: dict[str, str] | None
    """Each host's tunnel address (only for links that cross hosts)."""
    vxlan_port: int
    alloc: Callable[[str, str], int]
    """(host, namespace) -> the next pinned interface index there."""


class LinkKind(abc.ABC):
    name = ""

    @abc.abstractmethod
    def joins(self, a: End, b: End) -> bool:
        """Whether this kind makes a link between ends ``a`` and ``b``."""

    @abc.abstractmethod
    def plan(self, ctx: LinkContext, link, a: End, b: End) -> list[tuple[str, Action]]:
        """(host, action) pairs that make ``link`` between ends ``a`` and ``b``."""


class Veth(LinkKind):
    name = "veth"

    def joins(self, a: End, b: End) -> bool:
        return a.host == b.host

    def plan(self, ctx: LinkContext, link, a: End, b: End) -> list[tuple[str, Action]]:
        mtu = None if ctx.mtu == 1500 else ctx.mtu
        if a.master is None and b.master is not None:  # from the switch side: the bridge lives there
            return [(a.host, CreateVeth(b.ns, b.ifname, a.ns, a.ifname, master=b.master, link=link.index,
                                        index=ctx.alloc(a.host, b.ns), mtu=mtu))]
        return [(a.host, CreateVeth(a.ns, a.ifname, b.ns, b.ifname, master=a.master, peer_master=b.master,
                                    link=link.index, index=ctx.alloc(a.host, a.ns), mtu=mtu))]


class Vxlan(LinkKind):
    name = "vxlan"

    def joins(self, a: End, b: End) -> bool:
        return a.host != b.host

    def plan(self, ctx: LinkContext, link, a: End, b: End) -> list[tuple[str, Action]]:
        under = ctx.underlays or {}
        if a.host not in under or b.host not in under:
            raise TopologyError(f"{link.path}", f"link {link.name} joins hosts {a.host} and {b.host}, "
                                "whose tunnel addresses are not known", "give hosts[].underlay:")
        vni = vni_base(ctx.testbed) + link.index
        return [(e.host, CreateVxlan(e.ns, e.ifname, vni, under[e.host], under[other.host], ctx.vxlan_port, ctx.mtu,
                                     master=e.master, link=link.index))
                for e, other in ((a, b), (b, a))]


LINK_KINDS: list[LinkKind] = [Veth(), Vxlan()]


def kind_for(a: End, b: End) -> LinkKind:
    return next(k for k in LINK_KINDS if k.joins(a, b))
