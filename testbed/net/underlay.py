"""The underlay: the host interface that carries a testbed's VXLAN tunnels to other hosts."""

from __future__ import annotations

from pyroute2.iproute.linux import IPRoute

from testbed.common.errors import StateError
from testbed.model.topology import VXLAN_OVERHEAD


def underlay_interface(address: str) -> tuple[str, int] | None:
    """(interface, MTU) holding IPv4 ``address`` in this process's namespace, or None."""
    with IPRoute() as ipr:
        for a in ipr.get_addr(family=2):
            if a.get_attr("IFA_ADDRESS") == address or a.get_attr("IFA_LOCAL") == address:
                link = ipr.get_links(a["index"])[0]
                return link.get_attr("IFLA_IFNAME"), link.get_attr("IFLA_MTU")
    return None


def check_underlay(address: str, mtu: int, where: str) -> None:
    found = underlay_interface(address)
    if found is None:
        raise StateError(f"{where}: {address} is not an address of this host",
                         "set hosts[].underlay: to an address the other hosts reach this one at")
    dev, dev_mtu = found
    if dev_mtu - VXLAN_OVERHEAD < mtu:
        raise StateError(f"{where}: the underlay {dev} has MTU {dev_mtu}, too small for data-plane MTU {mtu} "
                         f"plus VXLAN's {VXLAN_OVERHEAD} bytes",
                         f"set vxlan: {{mtu: {dev_mtu - VXLAN_OVERHEAD}}} in the topology, or raise {dev}'s MTU")
