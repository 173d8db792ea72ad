"""The user-space tunnel's wire format: how a frame becomes UDP datagrams and back.

One datagram carries one Ethernet frame (with its virtio-net header, ``PACKET_VNET_HDR``)
behind a 24-byte header::

    magic "TBT1" (4) | token (16) | frame number (2) | part (1) | parts (1) | vnet header + frame

The **token** is 16 random bytes made per link (:func:`new_token`) and given to both
forwarders out of band (never on a command line). A datagram whose first 20 bytes are not
``magic + token`` is dropped (compared in constant time), as is one that does not come from
the peer's address and port (the forwarder's UDP socket is connected, so the kernel drops
those before we see them). That keeps out another local user, or a stray sender on the
network, who can send UDP to the forwarder's port but cannot read the datagrams between
the two forwarders. It does not keep out someone who can read them (root on either host, or
an on-path observer of the underlay): such a one learns the token and can inject frames into
the link, as on any VXLAN link, which has no authentication at all. Nothing is encrypted.

A frame that fits one datagram (the usual case: the veths' ``gso_max_size`` is capped so
that a GSO frame of up to ~60 kB fits) is sent whole: ``parts`` 1, ``part`` 0, frame number
0, so its header is a constant. A larger one (``max_payload`` below the frame, e.g. an
underlay that must not IP-fragment, or a GRO'd frame forwarded by a bridge) is cut into up
to 255 parts numbered 0..n-1 with one frame number; the receiver (:class:`Reassembler`)
keeps at most one frame being rebuilt and accepts its parts only in order: a missing,
repeated or reordered part drops the frame (TCP recovers it), never splices two frames.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Iterator

MAGIC = b"TBT1"
TOKEN_BYTES = 16
PREFIX_BYTES = len(MAGIC) + TOKEN_BYTES
HEADER_BYTES = PREFIX_BYTES + 4
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
"""Frame number 0, part 0 of 1: the header tail of a frame sent whole."""


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


def prefix(token: bytes) -> bytes:
    """The first bytes of every datagram of this link."""
    if len(token) != TOKEN_BYTES:
        raise WireError(f"the tunnel token must be {TOKEN_BYTES} bytes")
    return MAGIC + token


def authentic(pfx: bytes, datagram: memoryview | bytes, n: int) -> bool:
    """The datagram (its first ``n`` bytes) starts with this link's magic and token."""
    return n >= HEADER_BYTES and hmac.compare_digest(datagram[:PREFIX_BYTES], pfx)


def parts(frame_len: int, max_payload: int) -> int:
    """How many datagrams of at most ``max_payload`` bytes carry a frame of ``frame_len``
    (0: more than :data:`MAX_PARTS`, so it cannot be sent)."""
    room = max_payload - HEADER_BYTES
    if room <= 0:
        raise WireError(f"a datagram of {max_payload} bytes has no room beside the {HEADER_BYTES}-byte header")
    n = max(1, -(-frame_len // room))
    return n if n <= MAX_PARTS else 0


def split(pfx: bytes, frame: memoryview, number: int, max_payload: int) -> Iterator[tuple[bytes, memoryview]]:
    """(header, chunk) pairs, one per datagram, for a frame too long for one datagram:
    ``number`` (mod 65536) names the frame, the parts are numbered in order. Empty when the
    frame needs more than :data:`MAX_PARTS` datagrams."""
    n = parts(len(frame), max_payload)
    room = max_payload - HEADER_BYTES
    number &= 0xFFFF
    for i in range(n):
        yield pfx + bytes((number >> 8, number & 0xFF, i, n)), frame[i * room:(i + 1) * room]


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

    def add(self, datagram: memoryview, n: int) -> memoryview | None:
        """Take one authentic datagram of ``n`` bytes that is a part (its header says
        ``parts`` > 1); returns the whole frame when this was its last part, else None.
        The frame returned is valid until the next call."""
        number = (datagram[PREFIX_BYTES] << 8) | datagram[PREFIX_BYTES + 1]
        part, total = datagram[PREFIX_BYTES + 2], datagram[PREFIX_BYTES + 3]
        if part == 0:
            self._reset(failed=True)
            self.number = number
        elif number != self.number or part != self.next_part:
            self._reset(failed=True)
            return None
        chunk = n - HEADER_BYTES
        if total < 2 or part >= total or self.size + chunk > self.limit:
            self._reset(failed=True)
            return None
        self.buf[self.size:self.size + chunk] = datagram[HEADER_BYTES:n]
        self.size += chunk
        self.next_part = part + 1
        if self.next_part < total:
            return None
        frame = memoryview(self.buf)[:self.size]
        self._reset(failed=False)
        return frame
