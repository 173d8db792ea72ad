"""Link types: what a link's ``type:`` may name, and the keys each type takes.

Every link has a type. ``veth`` (a veth pair) joins two ends on one host; ``vxlan`` (a VXLAN
device at each end, one VNI per link, the inner MTU lowered) and ``tunnel`` (a user-space
forwarder at each end, UDP between them: :mod:`testbed.net.tunnel`) join ends on two hosts.
A link without ``type:`` gets the first registered type that is ``automatic`` for its ends'
hosts: ``veth`` on one host; across hosts ``vxlan`` as root, ``tunnel`` for an ordinary
user in their rootless namespaces (who cannot make VXLAN devices). Either may
be written out; a type that cannot join the ends' hosts is an error naming the link.

A type declares here what the loader needs, without importing the planner (the model
layer imports no netlink): its name, the keys it takes beyond every link's own
(:data:`testbed.model.links.LINK_KEYS`) with their checks and their JSON schema, and which
hosts it joins. How it is made is its planner side, :class:`testbed.plan.links.LinkKind`,
a subclass of :class:`LinkType`; :func:`testbed.plan.links.register_link_kind` registers
one object in both registries, so a new kind is one module plus that one call. A type's
own keys need its ``type:`` written out (an automatic choice takes none).
"""

from __future__ import annotations

from typing import Any

from testbed.common import rootless
from testbed.common.errors import TopologyError


class LinkType:
    """A kind of link as the topology file sees it."""

    name: str = ""
    description: str = ""
    """One line for the JSON schema and the docs."""
    keys: tuple[str, ...] = ()
    """Keys this type takes on a link beyond every link's own."""
    schema: dict[str, dict] = {}
    """The JSON schema of each of :attr:`keys` (``topologies/schema.json`` is generated from it)."""

    def joins(self, host_a: str, host_b: str) -> bool:
        """Whether this type can join an end on ``host_a`` to one on ``host_b``."""
        return True

    def automatic(self, host_a: str, host_b: str) -> bool:
        """Whether a link without ``type:`` between these hosts gets this type."""
        return False

    def validate(self, options: dict[str, Any], path: str) -> tuple[tuple[str, Any], ...]:
        """Check this type's own keys of one link (``path``: ``links[3]``); return them
        normalised and hashable. Keys outside :attr:`keys` never reach here."""
        return tuple((k, options[k]) for k in self.keys if k in options)

    def export(self, options: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
        """The topology-file form of validated options (``validate(export(o)) == o``)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in options}


class VethType(LinkType):
    name = "veth"
    description = "a veth pair: both ends on one host (the default there)"

    def joins(self, host_a: str, host_b: str) -> bool:
        return host_a == host_b

    automatic = joins


class VxlanType(LinkType):
    name = "vxlan"
    description = "a VXLAN tunnel between two hosts (the default across hosts as root; port and MTU under vxlan:)"

    def joins(self, host_a: str, host_b: str) -> bool:
        return host_a != host_b

    def automatic(self, host_a: str, host_b: str) -> bool:
        return host_a != host_b and not rootless.active()


class TunnelType(LinkType):
    name = "tunnel"
    description = ("a user-space tunnel between two hosts (UDP between two forwarders; the default across hosts "
                   "for an ordinary user, who cannot make VXLAN devices)")

    def joins(self, host_a: str, host_b: str) -> bool:
        return host_a != host_b

    def automatic(self, host_a: str, host_b: str) -> bool:
        return host_a != host_b and rootless.active()


LINK_TYPES: dict[str, LinkType] = {t.name: t for t in (VethType(), VxlanType(), TunnelType())}
"""Type name -> its declaration, in the order automatic types are tried. The planner's
registry (:data:`testbed.plan.links.LINK_KINDS`) holds the same names; a test checks it."""


def register_link_type(link_type: LinkType) -> None:
    """Make ``type: NAME`` known to the loader (and to the generated schema)."""
    if not link_type.name or set(link_type.keys) != set(link_type.schema):
        raise ValueError(f"link type {link_type.name!r}: a name, and a schema for exactly its keys {link_type.keys}")
    LINK_TYPES[link_type.name] = link_type


def own_keys() -> tuple[str, ...]:
    """Every type's own keys, each once, in registry order."""
    return tuple(dict.fromkeys(k for t in LINK_TYPES.values() for k in t.keys))


def check_type(value: Any, path: str) -> LinkType:
    if not isinstance(value, str) or value not in LINK_TYPES:
        raise TopologyError(f"{path}.type", f"unknown link type {value!r}", f"choose one of: {', '.join(LINK_TYPES)}")
    return LINK_TYPES[value]


def check_own_keys(spec: dict, given: str | None, path: str) -> tuple[tuple[str, Any], ...]:
    """The keys of ``spec`` that belong to a link type, checked by ``given`` (the link's
    ``type:``, or None: then it may hold none)."""
    mine = {k: spec[k] for k in own_keys() if k in spec}
    impl = LINK_TYPES[given] if given is not None else None
    for k in mine:
        if impl is None or k not in impl.keys:
            owners = [t.name for t in LINK_TYPES.values() if k in t.keys]
            raise TopologyError(f"{path}.{k}", f"'{k}' does not apply to link type {given or 'veth/vxlan (automatic)'}",
                                f"it belongs to type {', '.join(owners)}: write type: {owners[0]}, or remove it")
    return impl.validate(mine, path) if impl is not None else ()


def choose_type(given: str | None, host_a: str, host_b: str, what: str, path: str) -> str:
    """The type of a link between ends on ``host_a`` and ``host_b`` (``what``: its name)."""
    if given is None:
        auto = next((t for t in LINK_TYPES.values() if t.automatic(host_a, host_b)), None)
        if auto is None:
            raise TopologyError(path, f"no link type joins {host_a} and {host_b} by itself", "write type: NAME")
        return auto.name
    if not LINK_TYPES[given].joins(host_a, host_b):
        where = f"one host ({host_a})" if host_a == host_b else f"hosts {host_a} and {host_b}"
        fits = [t.name for t in LINK_TYPES.values() if t.joins(host_a, host_b)]
        raise TopologyError(f"{path}.type", f"link {what} of type {given} cannot join ends on {where}",
                            f"use type: {' or '.join(fits) or '?'}, or leave type: out to choose by placement")
    return given
