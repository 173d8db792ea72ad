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
recover even without the ledger.
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


def owned_namespace(testbed: str, ns: str) -> bool:
    """Whether ``ns`` is a namespace name testbed ``testbed``'s plan can make."""
    import re

    return ns == fabric_netns(testbed) or re.fullmatch(re.escape(testbed) + r"\.[A-Za-z0-9][A-Za-z0-9_-]{0,62}", ns) is not None


def tag(testbed: str) -> str:
    return f"{TAG_PREFIX}{testbed}"


def testbed_of_tag(alias: str | None) -> str | None:
    if alias and alias.startswith(TAG_PREFIX):
        return alias[len(TAG_PREFIX):]
    return None
