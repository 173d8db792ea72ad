"""Kernel names: short, deterministic, never taken from user node names for interfaces.

Layout of one testbed called NAME (netns backend):

* namespace ``NAME`` holds every switch (a Linux bridge ``swI``) and the switch-side
  veth ends ``lIa`` / ``lIb`` (link I, endpoint a or b). Keeping the bridges out of the
  host namespace makes them immune to host iptables (Docker sets FORWARD to DROP).
* namespace ``NAME.NODE`` per worker, with loopback and one data-plane interface ``eth0``;
  for a docker worker it is the container's own namespace (container ``testbed-NAME.NODE``),
  named under /run/netns like the others.

Interface names are unique only within their namespace, so they stay far below the
kernel's 15-character limit whatever the topology. ``.`` cannot occur in testbed or node
names, so namespace names of different testbeds never collide. Every namespace carries
the ownership tag ``testbed:NAME`` as the alias of its loopback, so ``down --all`` can
recover even without the ledger. The tag also names the state directory
(``testbed:NAME@ID``, ID a hash of its path), so ``down --all`` of one state directory
never touches another's testbeds.
"""

from __future__ import annotations

IFNAMSIZ = 15
WORKER_IFACE = "eth0"
TAG_PREFIX = "testbed:"


def fabric_netns(testbed: str) -> str:
    return testbed


def node_netns(testbed: str, node: str) -> str:
    return f"{testbed}.{node}"


def container_name(netns: str) -> str:
    """A docker worker's container: ``testbed-NAME.NODE`` (valid Docker name characters)."""
    return f"testbed-{netns}"


def bridge_ifname(switch_index: int) -> str:
    return f"sw{switch_index}"


def link_end_ifname(link_index: int, end: str) -> str:
    assert end in ("a", "b")
    return f"l{link_index}{end}"


def tunnel_ifname(link_index: int, end: str) -> str:
    """The forwarder's veth end of a tunnel link, beside the link's end ``end`` (a or b)."""
    return f"t{link_index}{end}"


def owned_namespace(testbed: str, ns: str) -> bool:
    """Whether ``ns`` is a namespace name testbed ``testbed``'s plan can make."""
    import re

    return ns == fabric_netns(testbed) or re.fullmatch(re.escape(testbed) + r"\.[A-Za-z0-9][A-Za-z0-9_-]{0,62}", ns) is not None


DEFAULT_STATE = "/run/testbed"


def state_id(state_dir: str | None = None) -> str:
    """A short id of a state directory: tags say which one owns a namespace."""
    import hashlib
    import os

    from testbed.common.state import state_root

    path = os.path.realpath(state_dir or str(state_root()))
    return hashlib.sha256(path.encode()).hexdigest()[:12]


def worker_mac(testbed: str, rank: int) -> str:
    """Worker ``rank``'s MAC address in ``testbed``: locally administered unicast (02:...),
    two bytes of the testbed's name hashed, three of the rank (unique within the testbed,
    the one L2 segment its workers share, also across hosts)."""
    import hashlib

    h = hashlib.sha256(testbed.encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in (h[0], h[1], (rank >> 16) & 0xFF, (rank >> 8) & 0xFF, rank & 0xFF))


def tag(testbed: str, state: str | None = None) -> str:
    """``testbed:NAME@STATEID``: the testbed and the state directory that own an object."""
    return f"{TAG_PREFIX}{testbed}@{state or state_id()}"


def owner_of_tag(alias: str | None) -> tuple[str, str] | None:
    """The testbed a tag names and the id of the state directory that owns it; None for
    anything that is not a tag. A tag without a state id (written before ids existed)
    belongs to the default state directory."""
    if not alias or not alias.startswith(TAG_PREFIX):
        return None
    name, sep, owner = alias[len(TAG_PREFIX):].partition("@")
    return name, owner if sep else state_id(DEFAULT_STATE)


def testbed_of_tag(alias: str | None, state: str | None = None) -> str | None:
    """The testbed a tag names, if this state directory (``state``: its id) owns it.

    Tags of other state directories, and anything else, are foreign: None."""
    found = owner_of_tag(alias)
    if found is None:
        return None
    name, owner = found
    return name if owner == (state or state_id()) else None
