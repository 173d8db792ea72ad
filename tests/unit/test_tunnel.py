"""The user-space tunnel without privileges: its wire format and authentication
(:mod:`testbed.net.tunnelwire`), and two forwarders (:mod:`testbed.net.tunnel`) joined over
loopback UDP, with Unix datagram socket pairs standing in for the veths' packet sockets."""

from __future__ import annotations

import hmac
import io
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from testbed.net import tunnelauth as auth
from testbed.net import tunnelwire as wire
from testbed.net.tunnel import PACKET_OUTGOING, Forwarder
from testbed.net.tunnellive import PeerWatch, Timing

TOKEN = bytes(range(16))


# --------------------------------------------------------------------------- tokens, addresses
def test_token_round_trip_and_checks():
    t = wire.new_token()
    assert len(t) == wire.TOKEN_BYTES and t != wire.new_token()
    assert wire.parse_token(t.hex() + "\n") == t
    for bad in ("zz" * 16, "ab" * 15, "ab" * 17, ""):
        with pytest.raises(wire.WireError):
            wire.parse_token(bad)
    for short in (b"short", TOKEN + b"x"):
        with pytest.raises(wire.WireError):
            wire.Sender(short)
        with pytest.raises(wire.WireError):
            wire.Receiver(short, auth.new_sender())


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
def _datagram(tx: wire.Sender, frame: bytes, tail: bytes = wire.WHOLE) -> bytes:
    head, tag = tx.seal(tail, frame)
    return head + frame + tag


def _open(rx: wire.Receiver, d: bytes) -> int:
    return rx.open(memoryview(bytearray(d)), len(d))


def test_the_key_is_derived_and_neither_it_nor_the_token_is_ever_sent():
    key = auth.link_key(TOKEN)
    assert len(key) == 32 and key == auth.link_key(TOKEN) and key != auth.link_key(bytes(16))
    tx = wire.Sender(TOKEN)
    d = _datagram(tx, b"frame" * 10) + tx.keepalive()
    assert TOKEN not in d and key not in d and key[:16] not in d and key[16:] not in d


def test_the_tag_is_hmac_sha256_truncated():
    head, body = os.urandom(wire.HEADER_BYTES), os.urandom(5000)
    assert auth.Mac(TOKEN).tag(head, body) == hmac.digest(auth.link_key(TOKEN), head + body, "sha256")[:16]


def test_a_valid_datagram_opens_and_its_frame_is_where_the_header_says():
    tx, rx = wire.Sender(TOKEN), wire.Receiver(TOKEN, auth.new_sender())
    d = _datagram(tx, b"frame")
    assert len(d) == wire.OVERHEAD + 5 and d[:4] == b"TBT2"
    end = _open(rx, d)
    assert end == len(d) - wire.TAG_BYTES and d[wire.HEADER_BYTES:end] == b"frame"
    assert _open(rx, tx.keepalive()) == wire.HEADER_BYTES  # a keepalive: no frame


def test_forged_truncated_and_foreign_datagrams_are_rejected():
    tx = wire.Sender(TOKEN)
    d = _datagram(tx, b"frame" * 20)
    rx = wire.Receiver(TOKEN, auth.new_sender())
    for i in range(len(d)):  # any byte changed: magic, sender, counter, tail, frame or tag
        forged = bytearray(d)
        forged[i] ^= 0x01
        assert _open(rx, bytes(forged)) == wire.REJECTED, i
    for n in range(len(d)):  # cut short anywhere
        assert _open(rx, d[:n]) == wire.REJECTED, n
    assert _open(rx, d + b"x") == wire.REJECTED  # longer
    assert _open(rx, _datagram(wire.Sender(bytes(16)), b"frame")) == wire.REJECTED  # another link's key
    head = d[:wire.HEADER_BYTES]
    assert _open(rx, head + b"crafted" + bytes(16)) == wire.REJECTED  # a seen header with a guessed tag
    assert _open(rx, d) > 0  # and the original still opens


def test_a_replayed_datagram_is_dropped_and_a_reflected_one_too():
    a, b = wire.Sender(TOKEN), wire.Sender(TOKEN)
    rx_b = wire.Receiver(TOKEN, b.sender)
    d = _datagram(a, b"frame")
    assert _open(rx_b, d) > 0
    assert _open(rx_b, d) == wire.REPLAYED
    assert _open(rx_b, _datagram(b, b"frame")) == wire.REFLECTED  # b's own, sent back to b
    late = _datagram(a, b"late")
    assert _open(rx_b, _datagram(a, b"next")) > 0
    assert _open(rx_b, late) > 0  # out of order but within the window: once
    assert _open(rx_b, late) == wire.REPLAYED


def test_a_restarted_sender_starts_above_what_it_sent_before():
    rx = wire.Receiver(TOKEN, auth.new_sender())
    before = _datagram(wire.Sender(TOKEN), b"before")  # a forwarder's datagram, never delivered
    time.sleep(0.001)
    assert _open(rx, _datagram(wire.Sender(TOKEN), b"after")) > 0  # the restarted one's: counters start at the clock
    assert _open(rx, before) == wire.REPLAYED  # 1 ms = 10**6 counters below: older than the window


def test_the_replay_window_edges():
    w = auth.ReplayWindow()
    assert w.fresh(0) and w.fresh(2**64 - 1)
    top = 10_000
    w.accept(top)
    assert not w.fresh(top)
    edge = top - (auth.WINDOW - 1)  # the oldest counter the window still holds
    assert w.fresh(edge) and w.fresh(top - 1) and w.fresh(top + 1)
    assert not w.fresh(edge - 1)  # one below: too old, dropped even though never seen
    w.accept(edge)
    assert not w.fresh(edge)
    w.accept(top + 1)  # the window slides by one: the edge falls out
    assert not w.fresh(edge) and not w.fresh(top) and not w.fresh(top + 1) and w.fresh(edge + 1)
    w.accept(top + 1 + auth.WINDOW)  # a jump by the whole window: only the new top is remembered
    assert not w.fresh(top + 1 + auth.WINDOW) and w.fresh(top + 2) and not w.fresh(top + 1)
    w2 = auth.ReplayWindow(size=8)
    for c in (5, 3, 9, 4):  # out of order
        assert w2.fresh(c)
        w2.accept(c)
    assert [c for c in range(12) if w2.fresh(c)] == [2, 6, 7, 8, 10, 11]  # 0 and 1: older than 9 - 7


# --------------------------------------------------------------------------- two forwarders
QUIET = Timing(keepalive=60, silent=60, probe=60)
"""One keepalive when a forwarder starts, then none within a test."""
FAST = Timing(keepalive=0.1, silent=2.0, probe=60, tick=0.02)
"""Keepalives ten times a second; silent after 2 s (CI's 2 cores under the suite's load stalled a
process for more than 0.6 s, the value before: a silence the test had not made)."""


class Pair:
    """Two forwarders over loopback UDP; each veth is one end of a Unix datagram pair."""

    def __init__(self, max_payload: int | None = None, token_b: bytes = TOKEN, v6: bool = False,
                 timing: Timing = Timing()) -> None:
        self.udp = [socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
        for s in self.udp:
            s.bind(("::1" if v6 else "127.0.0.1", 0))
        self.udp[0].connect(self.udp[1].getsockname())
        self.udp[1].connect(self.udp[0].getsockname())
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2)]
        self.veth = [p[0] for p in pairs]  # what the node side sees
        for v in self.veth:
            v.settimeout(5)
        self.fwd = [Forwarder(self.udp[0], pairs[0][1], TOKEN, max_payload=max_payload, timing=timing),
                    Forwarder(self.udp[1], pairs[1][1], token_b, max_payload=max_payload, timing=timing)]
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
        f = os.urandom(wire.UDP_MAX_PAYLOAD_V6 - wire.OVERHEAD)
        p.veth[0].send(f)
        assert p.veth[1].recv(70000) == f
        assert p.fwd[0].counters.split_out == 0
    finally:
        p.close()


def test_a_wrong_token_is_dropped_from_the_pinned_peer_and_strangers_never_get_in():
    p = Pair(token_b=bytes(16), timing=QUIET)  # b expects another token than a sends
    try:
        p.veth[0].send(b"x" * 100)
        assert _wait(lambda: p.fwd[1].counters.rejected >= 1)
        time.sleep(2 * QUIET.tick)  # and a's first keepalive, unless the frame went out before it
        rejected = p.fwd[1].counters.rejected
        assert rejected in (1, 2)
        stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        stranger.sendto(_datagram(wire.Sender(bytes(16)), b"y" * 100), p.udp[1].getsockname())  # b's key, elsewhere
        stranger.close()
        p.veth[1].settimeout(0.3)
        with pytest.raises(TimeoutError):
            p.veth[1].recv(70000)
        assert p.fwd[1].counters.frames_in == 0 and p.fwd[1].counters.rejected == rejected  # the kernel dropped it
    finally:
        p.close()


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_watch_keeps_an_idle_link_alive_and_stops_sending_to_a_silent_peer():
    clock, log = Clock(), io.StringIO()
    w = PeerWatch("127.0.0.1 port 9", Timing(keepalive=1, silent=5, probe=30), log, clock)

    def at(t: float) -> bool:
        clock.t = t
        due = w.tick()
        if due:
            w.sent()
        return due

    assert at(100)  # a keepalive at once: the peer hears this end is up
    assert not at(100.5) and at(101)  # then one after each idle second
    w.sent()  # a frame went out at 101
    assert not at(101.9) and at(102.0) and not w.silent
    assert at(105.0) and not w.silent  # heard last at 100 (the start): 5 s is not more than 5 s
    assert not at(105.1) and w.silent and w.silences == 1  # silent: no keepalive
    assert log.getvalue() == ("warning: nothing authentic from the tunnel's peer 127.0.0.1 port 9 for 5 s: no longer "
                              "sending to it (a probe without a frame every 30 s until it is heard)\n")
    assert not any(at(t) for t in (106, 120, 135.0))
    assert at(135.1) and not at(136) and not at(165.0) and at(165.1)  # a probe every 30 s
    w.heard()
    assert not w.silent and log.getvalue().endswith("peer 127.0.0.1 port 9 is heard again: sending to it resumes\n")
    assert at(166.1) and not at(166.2)  # idle: keepalives again


def test_an_idle_link_is_kept_alive():
    p = Pair(timing=FAST)
    try:
        time.sleep(1.5 * FAST.silent)  # idle for longer than a silence
        assert all(f.watch.silences == 0 and not f.watch.silent for f in p.fwd)
        assert all(f.counters.keepalives_in >= 3 and f.counters.rejected == 0 for f in p.fwd)
    finally:
        p.close()


def _taken(taker: socket.socket, seconds: float) -> list[tuple[float, bytes]]:
    """What ``taker`` receives for ``seconds``: (when, datagram)."""
    got, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        taker.settimeout(left)
        try:
            got.append((time.monotonic(), taker.recv(70000)))
        except TimeoutError:
            break
    return got


def test_after_its_peer_exits_a_forwarder_sends_its_port_nothing_and_takes_nothing_from_it(capsys):
    p = Pair(timing=FAST)
    taker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        port_b = p.udp[1].getsockname()
        p.veth[0].send(b"before")
        assert p.veth[1].recv(100) == b"before"
        p.fwd[1].stop()  # b exits; another user takes its port
        gone = time.monotonic()
        taker.bind(port_b)

        def send() -> None:  # the node keeps sending to the other side meanwhile
            for i in range(int((FAST.silent + 5) / 0.02)):
                p.veth[0].send(b"frame %d" % i)
                time.sleep(0.02)

        sending = threading.Thread(target=send)
        sending.start()
        got = _taken(taker, FAST.silent + 5)  # long past the bound below: any late frame is seen
        sending.join()
        bound = FAST.silent + 3  # the silence, noticed at the next tick, and slack for a loaded machine
        assert got and all(t - gone < bound for t, _ in got)  # frames until the bound, then nothing
        assert not any(TOKEN in d or auth.link_key(TOKEN)[:8] in d for _, d in got)
        a = p.fwd[0]
        assert a.watch.silent and a.counters.dropped_silent > 0
        for _, d in got:  # what the taker saw, sent back, and forged from it: nothing gets in
            taker.sendto(d, p.udp[0].getsockname())
            taker.sendto(d[:wire.HEADER_BYTES] + b"forged" + d[-wire.TAG_BYTES:], p.udp[0].getsockname())
        assert _wait(lambda: a.counters.reflected == len(got) and a.counters.rejected == len(got))
        assert a.watch.silent and a.counters.frames_in == 0
        taker.close()
        back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # b starts again, with the link's token
        back.bind(port_b)
        back.connect(p.udp[0].getsockname())
        pair_b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        b = Forwarder(back, pair_b[1], TOKEN, timing=FAST)
        b.start()
        try:
            assert _wait(lambda: not a.watch.silent)
            p.veth[0].send(b"after")
            pair_b[0].settimeout(5)
            assert pair_b[0].recv(100) == b"after"
        finally:
            b.stop()
            pair_b[0].close()
        err = capsys.readouterr().err
        assert "warning: nothing authentic from the tunnel's peer 127.0.0.1 port" in err and "heard again" in err
    finally:
        taker.close()
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
