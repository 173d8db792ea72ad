"""What a replay's steps reuse (testbed.net.tcbatch): links derived once per (shape, change)
and found again by identity, datagrams put together once per distinct call, and the
sequence numbers and refusals of a batch (over a socket pair standing in for netlink)."""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import replace

import pytest

from testbed.common.errors import TestbedError
from testbed.model.topology import load_topology_dict
from testbed.model.units import Duration, Rate
from testbed.net import nlbatch, tcbatch
from testbed.net.nlbatch import Datagram, Refused, ShapeBatch
from testbed.net.tcbatch import Derived, LinkChanger
from testbed.plan.plan import Endpoint
from tests.helpers import dumbbell

A, B = {"rate": Rate.parse("200mbit")}, {"rate": Rate.parse("100mbit")}


def _links():
    return list(load_topology_dict(dumbbell("tcp", rate="300mbit")).links)


def test_alternating_steps_reuse_the_same_link_objects():
    d = Derived()
    links = _links()
    first = d.links(links, A, ("forward", "reverse"))
    second = d.links(first.values(), B, ("forward", "reverse"))
    third = d.links(second.values(), A, ("forward", "reverse"))  # from B's links: equal to A's, the same objects
    fourth = d.links(third.values(), B, ("forward", "reverse"))
    assert all(third[i] is first[i] for i in first) and all(fourth[i] is second[i] for i in second)
    for l in links:
        assert first[l.index] == replace(l, forward=replace(l.forward, **A), reverse=replace(l.reverse, **A))
        assert d.to_dict(first[l.index]) == first[l.index].to_dict()
        assert d.to_dict(first[l.index]) is d.to_dict(first[l.index]), "made once"
    assert d.to_dict(links[0]) == links[0].to_dict(), "a link it did not make: made afresh"


def test_one_direction_keeps_the_other_and_equal_inputs_give_equal_results():
    d = Derived()
    links = _links()
    fwd = d.links(links, A, ("forward",))
    assert all(l.reverse is links[i].reverse and l.forward.rate == A["rate"] for i, l in fwd.items())
    # the same links read again from the state file (new objects): the same results
    again = d.links(_links(), A, ("forward",))
    assert all(again[i] == fwd[i] for i in fwd)


def test_a_change_that_breaks_the_loaders_rules_is_refused_by_name():
    with pytest.raises(TestbedError, match=r"link s0-s1 \(forward\)\.jitter.*needs a delay"):
        Derived().links([_links()[2]], {"jitter": Duration.parse("1ms")}, ("forward", "reverse"))


def test_the_tables_are_emptied_past_their_limit():
    d = Derived(limit=4)
    links = _links()
    for rate in ("10mbit", "20mbit", "30mbit"):
        out = d.links(links, {"rate": Rate.parse(rate)}, ("forward", "reverse"))
    assert len(d._shapes) + len(d._links) <= 4 + 2 * len(links) + len(links)
    assert all(l.forward.rate == Rate.parse("30mbit") for l in out.values())


def _changer(monkeypatch, kinds=None):
    """A changer that knows its endpoints (no kernel): messages are 16-byte headers tagged
    with the interface index and the shape's rate."""
    def messages(index, shape, kind):
        msg = struct.pack("=IHHII", 16, 0, 0, 0, index * 1000 + shape.rate.bps // 1_000_000)
        return [msg, msg] if shape.delay else [msg], "netem" if shape.delay else kind

    monkeypatch.setattr(tcbatch, "change_messages", messages)
    changer = LinkChanger()
    eps = [Endpoint("ns-a", "a0"), Endpoint("ns-a", "a1"), Endpoint("ns-b", "b0")]
    for i, ep in enumerate(eps):
        changer._index[(ep.ns, ep.ifname)] = i + 1
        changer._kind[(ep.ns, ep.ifname)] = (kinds or {}).get(ep.ifname)
    monkeypatch.setattr(changer.batch, "open", lambda namespaces: None)
    return changer, eps


def test_a_call_is_put_together_once_per_namespace_and_found_again_by_identity(monkeypatch):
    changer, eps = _changer(monkeypatch)
    shape = Derived().links(_links()[:1], A, ("forward",))[0].forward
    changes = [(eps[0], shape, "x"), (eps[2], shape, "y"), (eps[1], shape, "z")]
    ready = changer.prepare(changes)
    assert set(ready.datagrams) == {"ns-a", "ns-b"}
    a = ready.datagrams["ns-a"]
    assert a.offsets == (0, 16) and a.owners == (0, 2) and len(a.data) == 32
    assert struct.unpack_from("=I", a.data, 12 + 16)[0] == 2 * 1000 + 200, "in the order given"
    assert changer.prepare([(ep, s, "other words") for ep, s, _ in changes]) is ready
    equal = replace(shape)  # equal, another object: put together again
    assert changer.prepare([(eps[0], equal, "x"), (eps[2], shape, "y"), (eps[1], shape, "z")]) is not ready


def test_a_change_of_child_kind_drops_what_was_put_together(monkeypatch):
    changer, eps = _changer(monkeypatch)
    sent = []
    monkeypatch.setattr(changer.batch, "send", lambda datagrams, name: sent.append(datagrams))
    netem = replace(_links()[0].forward, delay=Duration.parse("5ms"))
    changer.apply([(eps[0], netem, "x")])
    assert changer._kind[("ns-a", "a0")] == "netem" and not changer._prepared
    changer.apply([(eps[0], netem, "x")])
    assert len(changer._prepared) == 1 and len(sent) == 2


def _answering(peer: socket.socket, refuse: set[int]):
    """Reads one datagram of 16-byte requests and acknowledges each (errno EINVAL for the
    positions in ``refuse``), one answer datagram per request."""
    data = peer.recv(1 << 16)
    for pos, off in enumerate(range(0, len(data), 16)):
        seq = struct.unpack_from("=I", data, off + 8)[0]
        code = -22 if pos in refuse else 0
        peer.send(struct.pack("=IHHII", 36, nlbatch.NLMSG_ERROR, 0, seq, 0) + struct.pack("=i", code) + bytes(16))


def test_send_stamps_sequence_numbers_and_names_every_refusal():
    batch = ShapeBatch(timeout=5)
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    batch._socks["ns"] = ours
    msg = struct.pack("=IHHII", 16, 0, 0, 0, 0)
    dg = Datagram(msg * 3, (0, 16, 32), (0, 1, 1))
    try:
        t = threading.Thread(target=_answering, args=(peer, set()))
        t.start()
        batch.send({"ns": dg}, lambda i: f"change {i}")
        t.join()
        t = threading.Thread(target=_answering, args=(peer, {0, 2}))
        t.start()
        with pytest.raises(Refused, match=r"\[ns\] change 0 failed: Invalid argument") as e:
            batch.send({"ns": dg}, lambda i: f"change {i}")
        t.join()
        assert sorted(e.value.owners) == [0, 1]
    finally:
        batch.close()
        peer.close()


@pytest.mark.parametrize("n,size", [(128, 10**6), (7, 10**6), (128, 40), (3, 25), (128, 5)])
def test_a_datagram_splits_into_parts_within_both_limits_and_keeps_every_request(n, size):
    """Split by count and by bytes (a request longer than the limit goes alone): the parts
    together are the datagram, each request still starts where its offset says and keeps
    its owner."""
    msgs = [bytes([i]) * (10 + i % 7) for i in range(50)]
    dg = Datagram.of(msgs, range(50))
    parts = list(dg.parts(n, size))
    assert b"".join(p.data for p in parts) == dg.data and sum((p.owners for p in parts), ()) == dg.owners
    for p in parts:
        assert len(p.offsets) <= n and (len(p.data) <= size or len(p.offsets) == 1)
        assert [p.data[o:o + 1] for o in p.offsets] == [bytes([x]) for x in p.owners]
    assert (len(parts) == 1) == (len(msgs) <= n and len(dg.data) <= size)
