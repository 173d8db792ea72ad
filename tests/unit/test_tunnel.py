"""The user-space tunnel without privileges: its wire format and authentication
(:mod:`testbed.net.tunnelwire`), and two forwarders (:mod:`testbed.net.tunnel`) joined over
loopback UDP, with Unix datagram socket pairs standing in for the veths' packet sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from testbed.net import tunnelwire as wire
from testbed.net.tunnel import PACKET_OUTGOING, Forwarder

TOKEN = bytes(range(16))


# --------------------------------------------------------------------------- tokens, addresses
def test_token_round_trip_and_checks():
    t = wire.new_token()
    assert len(t) == wire.TOKEN_BYTES and t != wire.new_token()
    assert wire.parse_token(t.hex() + "\n") == t
    for bad in ("zz" * 16, "ab" * 15, "ab" * 17, ""):
        with pytest.raises(wire.WireError):
            wire.parse_token(bad)
    with pytest.raises(wire.WireError):
        wire.prefix(b"short")


@pytest.mark.parametrize("text,want", [("127.0.0.1:0", ("127.0.0.1", 0)), ("10.0.0.2:4790", ("10.0.0.2", 4790)),
                                       ("[::1]:5", ("::1", 5)), ("[fe80::0001]:65535", ("fe80::1", 65535))])
def test_hostport_parses_literal_addresses(text, want):
    assert wire.parse_hostport(text) == want


@pytest.mark.parametrize("text", ["localhost:80", "127.0.0.1", "1.2.3.4:65536", "1.2.3.4:-1", "::1:80",
                                  "1.2.3.4:http", "$(id):1", "[::1]:"])
def test_hostport_refuses_names_and_bad_ports(text):
    with pytest.raises(wire.WireError):
        wire.parse_hostport(text)


def test_peer_line():
    assert wire.parse_peer("peer 127.0.0.1 4000") == ("127.0.0.1", 4000)
    assert wire.parse_peer("peer ::1 4000") == ("::1", 4000)
    for bad in ("peer 127.0.0.1", "pear 127.0.0.1 1", "peer host.example 1", "peer 1.2.3.4 1 2"):
        with pytest.raises(wire.WireError):
            wire.parse_peer(bad)


# --------------------------------------------------------------------------- authentication
def _whole(token: bytes, frame: bytes) -> bytes:
    return wire.prefix(token) + wire.WHOLE + frame


def test_authentic_needs_magic_token_and_a_header():
    pfx = wire.prefix(TOKEN)
    good = _whole(TOKEN, b"frame")
    assert wire.authentic(pfx, memoryview(good), len(good))
    assert not wire.authentic(pfx, memoryview(_whole(bytes(16), b"frame")), len(good))  # another token
    bad_magic = b"TBT2" + good[4:]
    assert not wire.authentic(pfx, memoryview(bad_magic), len(bad_magic))
    assert not wire.authentic(pfx, memoryview(good), wire.HEADER_BYTES - 1)  # too short for a header
    assert not wire.authentic(pfx, memoryview(b""), 0)


# --------------------------------------------------------------------------- parts
def test_parts_count():
    room = 1000 - wire.HEADER_BYTES
    assert wire.parts(0, 1000) == 1
    assert wire.parts(room, 1000) == 1
    assert wire.parts(room + 1, 1000) == 2
    assert wire.parts(room * 255, 1000) == 255
    assert wire.parts(room * 255 + 1, 1000) == 0  # more than MAX_PARTS: cannot be sent
    with pytest.raises(wire.WireError):
        wire.parts(1, wire.HEADER_BYTES)


def _datagrams(frame: bytes, number: int, max_payload: int) -> list[bytes]:
    return [h + bytes(c) for h, c in wire.split(wire.prefix(TOKEN), memoryview(frame), number, max_payload)]


def _feed(r: wire.Reassembler, dgrams: list[bytes]) -> list[bytes]:
    out = []
    for d in dgrams:
        assert wire.authentic(wire.prefix(TOKEN), memoryview(d), len(d))
        f = r.add(memoryview(d), len(d))
        if f is not None:
            out.append(bytes(f))
    return out


def test_split_and_reassemble_a_64k_frame():
    frame = os.urandom(65000)
    dgrams = _datagrams(frame, 7, 1500)
    assert len(dgrams) == wire.parts(len(frame), 1500) == 45
    assert all(len(d) <= 1500 for d in dgrams)
    r = wire.Reassembler()
    assert _feed(r, dgrams) == [frame]
    assert r.dropped == 0
    frame2 = os.urandom(3000)  # and the next one, with a frame number that wraps
    assert _feed(r, _datagrams(frame2, 0x1_0000, 1500)) == [frame2]


def test_a_missing_reordered_or_repeated_part_drops_the_frame_only():
    a, b = os.urandom(5000), os.urandom(5000)
    da, db = _datagrams(a, 1, 1500), _datagrams(b, 2, 1500)
    r = wire.Reassembler()
    assert _feed(r, da[:2] + da[3:]) == []  # part 2 lost
    assert _feed(r, [da[0], da[2], da[1], da[3]]) == []  # reordered
    assert _feed(r, [da[0], da[1], da[1]]) == []  # repeated
    assert _feed(r, da[:2] + db) == [b]  # an unfinished frame gives way to the next
    assert r.dropped == 4
    assert _feed(r, da) == [a]  # and nothing stuck


def test_parts_of_two_frames_never_splice():
    a, b = os.urandom(4000), os.urandom(4000)
    da, db = _datagrams(a, 1, 1500), _datagrams(b, 2, 1500)
    r = wire.Reassembler()
    assert _feed(r, [da[0], db[1], da[1], da[2]]) == []


def test_reassembly_is_bounded():
    r = wire.Reassembler(limit=3000)
    assert _feed(r, _datagrams(os.urandom(5000), 3, 1500)) == []
    assert r.dropped == 1
    bogus = wire.prefix(TOKEN) + bytes((0, 9, 0, 1)) + b"x"  # part 0 of 1 sent as a part
    assert r.add(memoryview(bogus), len(bogus)) is None
    assert list(wire.split(wire.prefix(TOKEN), memoryview(bytes(300 * 1000)), 1, 1000)) == []  # > 255 parts


# --------------------------------------------------------------------------- two forwarders
class Pair:
    """Two forwarders over loopback UDP; each veth is one end of a Unix datagram pair."""

    def __init__(self, max_payload: int | None = None, token_b: bytes = TOKEN, v6: bool = False) -> None:
        self.udp = [socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
        for s in self.udp:
            s.bind(("::1" if v6 else "127.0.0.1", 0))
        self.udp[0].connect(self.udp[1].getsockname())
        self.udp[1].connect(self.udp[0].getsockname())
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2)]
        self.veth = [p[0] for p in pairs]  # what the node side sees
        for v in self.veth:
            v.settimeout(5)
        self.fwd = [Forwarder(self.udp[0], pairs[0][1], TOKEN, max_payload=max_payload),
                    Forwarder(self.udp[1], pairs[1][1], token_b, max_payload=max_payload)]
        for f in self.fwd:
            f.start()

    def close(self) -> None:
        for f in self.fwd:
            f.stop()
        for v in self.veth:
            v.close()


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()


def _wait(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_frames_cross_both_ways(pair):
    frames = [os.urandom(n) for n in (60, 1514, 30000, 65000)]
    for f in frames:
        pair.veth[0].send(f)
        assert pair.veth[1].recv(70000) == f
        pair.veth[1].send(f[::-1])
        assert pair.veth[0].recv(70000) == f[::-1]
    # a forwarder counts a frame out after its send returns, which can be after the peer delivered it
    assert _wait(lambda: all(f.counters.frames_in == 4 and f.counters.frames_out == 4 for f in pair.fwd))
    c = pair.fwd[0].counters
    assert (c.frames_out, c.bytes_out, c.frames_in, c.rejected) == (4, sum(map(len, frames)), 4, 0)


def test_a_frame_longer_than_a_datagram_crosses_in_parts():
    p = Pair(max_payload=1472)  # an underlay that must not IP-fragment
    try:
        f = os.urandom(65000)
        p.veth[0].send(f)
        assert p.veth[1].recv(70000) == f
        # counted once its last part is sent, which may be after the peer delivered the frame
        assert _wait(lambda: p.fwd[0].counters.split_out == 1)
    finally:
        p.close()


def test_an_ipv6_underlay_carries_the_largest_frames():
    try:
        p = Pair(v6=True)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        assert p.fwd[0].max_payload == wire.UDP_MAX_PAYLOAD_V6
        f = os.urandom(wire.UDP_MAX_PAYLOAD_V6 - wire.HEADER_BYTES)
        p.veth[0].send(f)
        assert p.veth[1].recv(70000) == f
        assert p.fwd[0].counters.split_out == 0
    finally:
        p.close()


def test_a_wrong_token_is_dropped_from_the_pinned_peer_and_strangers_never_get_in():
    p = Pair(token_b=bytes(16))  # b expects another token than a sends
    try:
        p.veth[0].send(b"x" * 100)
        assert _wait(lambda: p.fwd[1].counters.rejected == 1)
        stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        stranger.sendto(_whole(bytes(16), b"y" * 100), p.udp[1].getsockname())  # b's token, from elsewhere
        stranger.close()
        p.veth[1].settimeout(0.3)
        with pytest.raises(TimeoutError):
            p.veth[1].recv(70000)
        assert p.fwd[1].counters.frames_in == 0 and p.fwd[1].counters.rejected == 1  # the kernel dropped the stranger's
    finally:
        p.close()


def test_without_ignore_outgoing_our_own_frames_are_not_sent_back():
    class FakePacketSocket:
        def __init__(self):
            self.frames = [(b"mine", PACKET_OUTGOING), (b"theirs", 0)]

        def recvfrom_into(self, buf, nbytes, flags):
            data, kind = self.frames.pop(0)
            buf[:len(data)] = data
            return len(data), ("tf", 3, kind, 1, b"")

    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        f = Forwarder(udp, FakePacketSocket(), TOKEN, ignores_outgoing=False)  # type: ignore[arg-type]
        buf = bytearray(100)
        assert f._read_frame(buf) == 0
        assert f._read_frame(buf) == 6 and buf[:6] == b"theirs"
    finally:
        udp.close()


# --------------------------------------------------------------------------- the command's errors
def _command(*args: str, stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.net.tunnel", "--ifname", "tf", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,stdin,says", [
    (("--bind", "127.0.0.1:0"), "not-hex\n", "error: the tunnel token is not hex"),
    (("--bind", "127.0.0.1:0"), "ab" * 16, "error: expected the link's token as a line on stdin"),
    (("--bind", "127.0.0.1:0"), "ab" * 16 + "\npeer example.org 1\n", "error: not an IP address and port"),
    (("--bind", "127.0.0.1:0", "--peer", "127.0.0.1:9", "--netns", "/nonexistent"), "ab" * 16 + "\n",
     "error: cannot open namespace /nonexistent"),
])
def test_the_command_fails_in_one_line(args, stdin, says):
    r = _command(*args, stdin=stdin)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith(says), r.stderr


def test_the_command_refuses_names_in_its_arguments():
    r = _command("--bind", "localhost:0", stdin="")
    assert r.returncode == 2 and "--bind" in r.stderr


def test_a_port_in_use_is_named():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        r = _command("--bind", f"127.0.0.1:{port}", stdin="ab" * 16 + "\n")
    assert r.returncode == 1 and f"cannot bind the tunnel's UDP socket to 127.0.0.1 port {port}" in r.stderr
