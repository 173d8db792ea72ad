"""Permanent neighbour entries encoded for one batched send (testbed.net.tcbatch): the
bytes decode, with pyroute2's own parser, to the request ``IPRoute.neigh("replace")``
makes. The entries' effect on real namespaces: tests/kernel/test_neighbours.py."""

from __future__ import annotations

import socket

from pyroute2.netlink.nlsocket import NetlinkRequest
from pyroute2.netlink.rtnl import RTM_NEWNEIGH
from pyroute2.netlink.rtnl.ndmsg import ndmsg

from testbed.net import tcbatch


def test_a_neighbour_message_is_a_permanent_replace_of_address_and_mac():
    data = tcbatch.neighbour_message(7, "10.0.0.5", "02:00:0a:00:00:05")
    msg = ndmsg(data)
    msg.decode()
    assert msg["header"]["type"] == RTM_NEWNEIGH
    assert msg["header"]["flags"] == NetlinkRequest.flags["replace"]  # request, ack, create, replace
    assert msg["header"]["length"] == len(data)
    assert (msg["family"], msg["ifindex"], msg["state"]) == (socket.AF_INET, 7, tcbatch.NUD_PERMANENT)
    assert msg.get_attr("NDA_DST") == "10.0.0.5" and msg.get_attr("NDA_LLADDR") == "02:00:0a:00:00:05"


def test_the_template_copies_are_byte_for_byte_pyroute2s():
    """Each entry is pyroute2's template with its index, address and MAC written in: the same
    bytes as pyroute2 encoding that entry, for indexes, addresses and MACs of every width."""
    import random

    rng = random.Random(7)
    for _ in range(500):
        index = rng.choice([1, 2, 255, 256, 65536, 2**31 - 1, rng.randrange(1, 2**31)])
        address = ".".join(str(rng.randrange(256)) for _ in range(4))
        mac = ":".join(f"{rng.randrange(256):02x}" for _ in range(6))
        assert tcbatch.neighbour_message(index, address, mac) == tcbatch.encode_neighbour(index, address, mac)
