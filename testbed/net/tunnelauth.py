"""The user-space tunnel's datagram authentication: the link's key, each datagram's MAC, and
the receiver's replay window (the wire format itself: :mod:`testbed.net.tunnelwire`).

Both forwarders of a link get its 16-byte **token** out of band (on their stdin). Neither
ever sends it: each derives the link's **key** from it (:func:`link_key`, HKDF-SHA256 with
this module's label), and every datagram ends with a 16-byte tag, HMAC-SHA256 of the key over
everything before the tag (header and payload), truncated to 128 bits as IPsec's
HMAC-SHA-256-128 is. The header the tag covers names the **sender** (8 random bytes drawn by
each forwarder when it starts) and carries the sender's **counter** (64 bits, one more for
each datagram it sends, starting at the wall clock in nanoseconds so that a forwarder
restarted with the same token starts above anything it sent before). The receiver keeps,
for its peer, the highest counter it accepted and a window of the 2048 counters below it
(:class:`ReplayWindow`, as IPsec's and WireGuard's): a datagram whose counter it has seen, or
that is older than the window, is a replay and is dropped. A datagram that names the
receiver itself as its sender is one of its own sent back to it (a reflection) and is
dropped too, so one key serves both directions.

What this gives: whoever sees datagrams, but not the token (another user who took the port
of a forwarder that exited, an observer of the underlay), can neither forge a datagram nor
replay or reflect one. What it does not: nothing is encrypted (frames are readable on the
underlay), and whoever has the token (it sits in the private ledger) has the key.

HMAC-SHA256 rather than keyed BLAKE2b: on the development VM (a CPU with SHA extensions)
OpenSSL's SHA-256 hashes 1.46 GB/s against 0.54 GB/s for hashlib's BLAKE2b (60 kB
datagrams, one core), and 1.7 against 0.7 us for a 100-byte one.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import time
from collections.abc import Iterator

TAG_BYTES = 16
"""The MAC's length at the end of every datagram (HMAC-SHA256 truncated to 128 bits)."""
SENDER_BYTES = 8
COUNTER_BYTES = 8
WINDOW = 2048
"""How many counters below the highest accepted the receiver remembers."""
LABEL = b"testbed user-space tunnel v2: datagram MAC key"


def link_key(token: bytes) -> bytes:
    """The link's 32-byte MAC key from its token (HKDF-SHA256, RFC 5869: extract with
    :data:`LABEL` as the salt, one block of expand)."""
    prk = hmac.digest(LABEL, token, "sha256")
    return hmac.digest(prk, b"mac\x01", "sha256")


def new_sender() -> bytes:
    """A forwarder's name in its datagrams' headers, drawn when it starts."""
    return os.urandom(SENDER_BYTES)


class Mac:
    """Tags for one link's datagrams: HMAC-SHA256 (RFC 2104) truncated to :data:`TAG_BYTES`.

    Built from two SHA-256 states with the key's inner and outer pads already absorbed, copied
    for each datagram: the same tag as :func:`hmac.digest`, without the ``hmac`` module's
    Python layer, which cost more than the hashing itself for small datagrams."""

    def __init__(self, token: bytes) -> None:
        key = link_key(token).ljust(64, b"\0")  # SHA-256's block
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def tag(self, head: bytes | memoryview, body: bytes | memoryview = b"") -> bytes:
        """The tag of a datagram whose tagged part is ``head`` followed by ``body``."""
        inner = self._inner.copy()
        inner.update(head)
        inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:TAG_BYTES]

    def verify(self, datagram: memoryview, end: int) -> bool:
        """The tag after ``datagram[:end]`` is that part's (compared in constant time)."""
        return hmac.compare_digest(self.tag(datagram[:end]), datagram[end:end + TAG_BYTES])


def counter(start: int | None = None) -> Iterator[int]:
    """A sender's datagram counters: strictly increasing from the wall clock in nanoseconds
    (or ``start``), safe to draw from several threads (``itertools.count`` advances under the
    interpreter's lock)."""
    return itertools.count(time.time_ns() if start is None else start)


class ReplayWindow:
    """The counters accepted from the peer: the highest, and a bitmap of the :data:`WINDOW`
    below it (bit i: ``top - i`` was accepted). Used by one thread (the receiving one)."""

    def __init__(self, size: int = WINDOW) -> None:
        self.size = size
        self.mask = (1 << size) - 1
        self.top = -1
        self.bits = 0

    def fresh(self, counter: int) -> bool:
        """Not seen, and not older than the window (check before the MAC, then :meth:`accept`)."""
        if counter > self.top:
            return True
        back = self.top - counter
        return back < self.size and not (self.bits >> back) & 1

    def accept(self, counter: int) -> None:
        """Remember ``counter`` (one that was :meth:`fresh` and whose tag was right)."""
        if counter > self.top:
            shift = counter - self.top
            self.bits = ((self.bits << shift) | 1) & self.mask if shift < self.size else 1
            self.top = counter
        else:
            self.bits |= 1 << (self.top - counter)
