"""Link kinds: how a link between two ends is made, one class each, by the link's type.

A link joins two ends, each (namespace, interface, bridge it joins or None, host). The
loader gave every link its type (:mod:`testbed.model.link_types`: the ``type:`` written,
else ``veth`` on one host, ``vxlan`` across hosts); the kind of that name makes it.
``veth`` joins ends on one host; ``vxlan`` joins ends on two hosts (a VXLAN device at each
end, one VNI per link, the inner MTU lowered); so does ``tunnel`` (a veth pair at each end,
one of whose ends a user-space forwarder joins to the other host's over UDP: what an
ordinary user can make, ``docs/tunnel.md``).

A new kind is one module: a :class:`LinkKind` subclass (its name, its own keys with their
checks and schema, which hosts it joins, the actions that make it), plus one call,
``register_link_kind(MyKind())``, which makes ``type: NAME`` known to the loader, the
generated schema and the planner. Its actions are its own classes, registered as the
ledger's (:mod:`testbed.plan.base`); the link's shaping, addresses and teardown stay common.
"""

from __future__ import annotations

import abc
import secrets
from dataclasses import dataclass
from typing import Callable, NamedTuple

from testbed.common.errors import TopologyError
from testbed.model.link_types import LINK_TYPES, LinkType, TunnelType, VethType, VxlanType, register_link_type
from testbed.net.tunnelwire import new_token
from testbed.plan import naming
from testbed.plan.actions import Action, CreateVeth, CreateVxlan
from testbed.plan.plan import vni_base
from testbed.plan.tunnel_action import GSO_MAX_SIZE, StartTunnel


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
    tunnel_port: int = 0
    """The first UDP port of this testbed's tunnel links (link i uses this + i at both ends)."""
    gso_max_size: int | None = None
    """Every veth's largest GSO frame, when a tunnel link is in the plan: a frame TCP built in
    a worker crosses the bridges whole, and one larger than the tunnel end's limit would be
    cut into MTU-sized frames there in software (measured: 0.49 of 1 Gbit/s, not 0.95)."""


class LinkKind(LinkType, abc.ABC):
    """A link type (its declaration for the loader) and how it is made."""

    @abc.abstractmethod
    def plan(self, ctx: LinkContext, link, a: End, b: End) -> list[tuple[str, Action]]:
        """(host, action) pairs that make ``link`` between ends ``a`` and ``b``."""


class Veth(VethType, LinkKind):
    def plan(self, ctx: LinkContext, link, a: End, b: End) -> list[tuple[str, Action]]:
        mtu = None if ctx.mtu == 1500 else ctx.mtu
        if a.master is None and b.master is not None:  # from the switch side: the bridge lives there
            return [(a.host, CreateVeth(b.ns, b.ifname, a.ns, a.ifname, master=b.master, link=link.index,
                                        index=ctx.alloc(a.host, b.ns), mtu=mtu, gso_max_size=ctx.gso_max_size))]
        return [(a.host, CreateVeth(a.ns, a.ifname, b.ns, b.ifname, master=a.master, peer_master=b.master,
                                    link=link.index, index=ctx.alloc(a.host, a.ns), mtu=mtu,
                                    gso_max_size=ctx.gso_max_size))]


def _underlays(ctx: LinkContext, link, a: End, b: End) -> dict[str, str]:
    under = ctx.underlays or {}
    if a.host not in under or b.host not in under:
        raise TopologyError(f"{link.path}", f"link {link.name} joins hosts {a.host} and {b.host}, "
                            "whose tunnel addresses are not known", "give hosts[].underlay:")
    return under


class Vxlan(VxlanType, LinkKind):
    def plan(self, ctx: LinkContext, link, a: End, b: End) -> list[tuple[str, Action]]:
        under = _underlays(ctx, link, a, b)
        vni = vni_base(ctx.testbed) + link.index
        return [(e.host, CreateVxlan(e.ns, e.ifname, vni, under[e.host], under[other.host], ctx.vxlan_port, ctx.mtu,
                                     master=e.master, link=link.index))
                for e, other in ((a, b), (b, a))]


class Tunnel(TunnelType, LinkKind):
    """At each end a veth pair in the end's namespace, the link's end (shaped and counted as
    a local link's) and ``tNa``/``tNb``, the forwarder's; the forwarders' UDP sockets on the
    hosts' underlays, both on port ``tunnel_port + link.index``; one random token per link."""

    def plan(self, ctx: LinkContext, link, a: End, b: End) -> list[tuple[str, Action]]:
        under = _underlays(ctx, link, a, b)
        port = ctx.tunnel_port + link.index
        if not 1024 <= port <= 65535:
            raise TopologyError("tunnel.port", f"link {link.name} would use UDP port {port}, outside 1024..65535",
                                f"set tunnel: {{port: N}} with N + {link.index} at most 65535")
        token = new_token().hex()
        mtu = None if ctx.mtu == 1500 else ctx.mtu
        out: list[tuple[str, Action]] = []
        for e, other, side in ((a, b, "a"), (b, a, "b")):
            forwarder_end = naming.tunnel_ifname(link.index, side)
            out.append((e.host, CreateVeth(e.ns, e.ifname, e.ns, forwarder_end, master=e.master, link=link.index,
                                           index=ctx.alloc(e.host, e.ns), mtu=mtu, gso_max_size=GSO_MAX_SIZE,
                                           peer_up=True)))
            out.append((e.host, StartTunnel(f"--tunnel-id={secrets.token_hex(16)}", e.ns, forwarder_end,
                                            under[e.host], port, under[other.host], port, token, link.index)))
        return out


LINK_KINDS: dict[str, LinkKind] = {k.name: k for k in (Veth(), Vxlan(), Tunnel())}
"""Type name -> how it is made; the same names as the loader's :data:`LINK_TYPES`."""


def register_link_kind(kind: LinkKind) -> None:
    """Make a new link kind known to the loader (``type: NAME``, its keys, the schema) and
    to the planner: the one registration a new kind needs."""
    register_link_type(kind)
    LINK_KINDS[kind.name] = kind


def kind_for(link) -> LinkKind:
    """The kind that makes ``link`` (a loaded link always has a type)."""
    try:
        return LINK_KINDS[link.type]
    except KeyError:
        known = LINK_TYPES.keys() & LINK_KINDS.keys()
        raise TopologyError(f"{link.path}.type", f"link type {link.type!r} is declared but nothing makes it",
                            f"register it with testbed.plan.links.register_link_kind; made: {', '.join(known)}") \
            from None
