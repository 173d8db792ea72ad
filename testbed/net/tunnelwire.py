"""The user-space tunnel's wire format: how a frame becomes UDP datagrams and back.

One datagram carries one Ethernet frame (with its virtio-net header, ``PACKET_VNET_HDR``)
between a 24-byte header and a 16-byte tag::

    magic "TBT2" (4) | sender (8) | counter (8) | frame number (2) | part (1) | parts (1) | vnet header + frame | tag (16)

The tag authenticates everything before it with a key both forwarders derive from the link's
token, which neither sends; the sender and counter keep a datagram from being replayed or
reflected (:mod:`testbed.net.tunnelauth`). A datagram that is too short, has another magic,
fails its tag, names the receiver as its sender or repeats a counter is dropped (and
counted); so is one that does not come from the peer's address and port (the forwarder's UDP
socket is connected, so the kernel drops those before we see them). Nothing is encrypted.

A datagram with ``parts`` 0 carries no frame: a **keepalive**, which a forwarder sends when
it has sent nothing for a while, so that its peer can tell a quiet link from a dead one.

A frame that fits one datagram (the usual case: the veths' ``gso_max_size`` is capped so
that a GSO frame of up to ~60 kB fits) is sent whole: ``parts`` 1, ``part`` 0, frame number
0. A larger one (``max_payload`` below the frame, e.g. an underlay that must not IP-fragment,
or a GRO'd frame forwarded by a bridge) is cut into up to 255 parts numbered 0..n-1 with one
frame number, each its own datagram with its own counter and tag; the receiver
(:class:`Reassembler`) keeps at most one frame being rebuilt and accepts its parts only in
order: a missing, repeated or reordered part drops the frame (TCP recovers it), never
splices two frames.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Iterator

from testbed.net import tunnelauth as auth

MAGIC = b"TBT2"
TOKEN_BYTES = 16
SENDER_AT = len(MAGIC)
COUNTER_AT = SENDER_AT + auth.SENDER_BYTES
TAIL_AT = COUNTER_AT + auth.COUNTER_BYTES
"""Where the frame number, part and parts sit."""
HEADER_BYTES = TAIL_AT + 4
TAG_BYTES = auth.TAG_BYTES
OVERHEAD = HEADER_BYTES + TAG_BYTES
"""What a datagram holds besides the vnet header and frame."""
UDP_MAX_PAYLOAD_V4 = 65535 - 20 - 8
"""The largest UDP payload over IPv4 (the IP length field is 16 bits)."""
UDP_MAX_PAYLOAD_V6 = 65535 - 8
"""Over IPv6 (without jumbograms): the payload length excludes the fixed IPv6 header."""
VNET_HDR_BYTES = 10
"""struct virtio_net_hdr (without num_buffers), what PACKET_VNET_HDR puts before a frame."""
MAX_FRAME = VNET_HDR_BYTES + 14 + 4 + 65535
"""The longest vnet header + frame an interface can hand us (a 64 kB GSO frame, VLAN tag)."""
MAX_PARTS = 255
WHOLE = b"\0\0\0\x01"
"""Frame number 0, part 0 of 1: the header's tail for a frame sent whole."""
KEEPALIVE = b"\0\0\0\0"
"""Part 0 of 0: the header's tail for a datagram that carries no frame."""
REJECTED, REFLECTED, REPLAYED = -1, -2, -3
"""What :meth:`Receiver.open` says of a datagram it drops."""


class WireError(ValueError):
    """A token or address the forwarder was given is unusable."""


def new_token() -> bytes:
    """A fresh per-link token."""
    return os.urandom(TOKEN_BYTES)


def parse_token(text: str) -> bytes:
    """A token from its hex form (how it travels to a forwarder: on its stdin)."""
    try:
        token = bytes.fromhex(text.strip())
    except ValueError:
        raise WireError("the tunnel token is not hex") from None
    if len(token) != TOKEN_BYTES:
        raise WireError(f"the tunnel token must be {TOKEN_BYTES} bytes ({2 * TOKEN_BYTES} hex digits), "
                        f"got {len(token)}")
    return token


def address(host: str, port: str | int) -> tuple[str, int]:
    """A literal IP address and a port (0..65535), checked; no name is resolved."""
    try:
        ip = ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        raise WireError(f"not an IP address and port: {host!r} {port!r}") from None
    if not 0 <= number <= 65535:
        raise WireError(f"port {number} is not in 0..65535")
    return str(ip), number


def parse_hostport(text: str) -> tuple[str, int]:
    """``ADDRESS:PORT`` (``[V6]:PORT`` for IPv6) -> (address, port)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise WireError(f"expected ADDRESS:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise WireError(f"write an IPv6 address in brackets: [{host}]:{port}")
    return address(host, port)


def parse_peer(line: str) -> tuple[str, int]:
    """The ``peer ADDRESS PORT`` line a forwarder reads when started without ``--peer``."""
    fields = line.split()
    if len(fields) != 3 or fields[0] != "peer":
        raise WireError("expected 'peer ADDRESS PORT'")
    return address(fields[1], fields[2])


class Sender:
    """Headers and tags for the datagrams one forwarder sends (its name, its counter)."""

    def __init__(self, token: bytes, sender: bytes | None = None, counter: int | None = None) -> None:
        if len(token) != TOKEN_BYTES:
            raise WireError(f"the tunnel token must be {TOKEN_BYTES} bytes")
        self.mac = auth.Mac(token)
        self.sender = sender or auth.new_sender()
        self._fixed = MAGIC + self.sender
        self._count = auth.counter(counter)

    def head(self, tail: bytes) -> bytes:
        """The next datagram's header (a fresh counter) with ``tail`` (frame number, part, parts)."""
        return self._fixed + next(self._count).to_bytes(auth.COUNTER_BYTES, "big") + tail

    def seal(self, tail: bytes, body: memoryview | bytes) -> tuple[bytes, bytes]:
        """(header, tag) of the next datagram carrying ``body``: send header + body + tag."""
        head = self._fixed + next(self._count).to_bytes(auth.COUNTER_BYTES, "big") + tail  # head(), inlined
        return head, self.mac.tag(head, body)

    def keepalive(self) -> bytes:
        """A whole datagram that carries no frame."""
        head = self.head(KEEPALIVE)
        return head + self.mac.tag(head)

    def split(self, frame: memoryview, number: int, max_payload: int) -> Iterator[tuple[bytes, memoryview, bytes]]:
        """(header, chunk, tag) triples, one per datagram, for a frame too long for one
        datagram: ``number`` (mod 65536) names the frame, the parts are numbered in order.
        Empty when the frame needs more than :data:`MAX_PARTS` datagrams."""
        n = parts(len(frame), max_payload)
        room = max_payload - OVERHEAD
        number &= 0xFFFF
        for i in range(n):
            chunk = frame[i * room:(i + 1) * room]
            head, tag = self.seal(bytes((number >> 8, number & 0xFF, i, n)), chunk)
            yield head, chunk, tag


class Receiver:
    """Checks the datagrams from the peer: tag, sender, counter (:mod:`testbed.net.tunnelauth`)."""

    def __init__(self, token: bytes, own_sender: bytes) -> None:
        if len(token) != TOKEN_BYTES:
            raise WireError(f"the tunnel token must be {TOKEN_BYTES} bytes")
        self.mac = auth.Mac(token)
        self.own = own_sender
        self.window = auth.ReplayWindow()

    def open(self, datagram: memoryview, n: int) -> int:
        """Where the tagged part of a received datagram (its first ``n`` bytes) ends, when it
        is authentic, not ours and new (its counter is then remembered); else
        :data:`REJECTED`, :data:`REFLECTED` or :data:`REPLAYED`."""
        end = n - TAG_BYTES
        if (end < HEADER_BYTES or datagram[:SENDER_AT] != MAGIC
                or not hmac.compare_digest(self.mac.tag(datagram[:end]), datagram[end:n])):
            return REJECTED
        if datagram[SENDER_AT:COUNTER_AT] == self.own:
            return REFLECTED
        counter = int.from_bytes(datagram[COUNTER_AT:TAIL_AT], "big")
        if not self.window.fresh(counter):
            return REPLAYED
        self.window.accept(counter)
        return end


def parts(frame_len: int, max_payload: int) -> int:
    """How many datagrams of at most ``max_payload`` bytes carry a frame of ``frame_len``
    (0: more than :data:`MAX_PARTS`, so it cannot be sent)."""
    room = max_payload - OVERHEAD
    if room <= 0:
        raise WireError(f"a datagram of {max_payload} bytes has no room beside the tunnel's {OVERHEAD} bytes")
    n = max(1, -(-frame_len // room))
    return n if n <= MAX_PARTS else 0


class Reassembler:
    """Rebuilds frames sent in parts; one frame in progress at a time, bounded in size."""

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self.buf = bytearray(limit)
        self.limit = limit
        self.number = -1
        self.next_part = 0
        self.size = 0
        self.dropped = 0
        """Frames given up: a part missing, out of order, or too long."""

    def _reset(self, failed: bool) -> None:
        if failed and self.number >= 0:
            self.dropped += 1
        self.number, self.next_part, self.size = -1, 0, 0

    def add(self, datagram: memoryview, end: int) -> memoryview | None:
        """Take one opened datagram that is a part (its header says ``parts`` > 1; its chunk
        ends at ``end``, where its tag starts); returns the whole frame when this was its last
        part, else None. The frame returned is valid until the next call."""
        number = (datagram[TAIL_AT] << 8) | datagram[TAIL_AT + 1]
        part, total = datagram[TAIL_AT + 2], datagram[TAIL_AT + 3]
        if part == 0:
            self._reset(failed=True)
            self.number = number
        elif number != self.number or part != self.next_part:
            self._reset(failed=True)
            return None
        chunk = end - HEADER_BYTES
        if total < 2 or part >= total or self.size + chunk > self.limit:
            self._reset(failed=True)
            return None
        self.buf[self.size:self.size + chunk] = datagram[HEADER_BYTES:end]
        self.size += chunk
        self.next_part = part + 1
        if self.next_part < total:
            return None
        frame = memoryview(self.buf)[:self.size]
        self._reset(failed=False)
        return frame
