"""Encoded netlink requests sent in few datagrams per namespace, every answer read.

Through pyroute2's request path each request is a round trip through its asyncio loop,
about 1 ms; here already encoded requests (pyroute2's own encoders, :func:`testbed.net.tc.encode`,
:func:`testbed.net.tcbatch.neighbour_message`) go to the kernel in one ``send``, and one
acknowledgement per request is read back (at most :data:`CHUNK` requests and
:data:`CHUNK_BYTES` to a datagram). Used to build links' shaping
(:func:`testbed.net.tc.apply`), to change it (:mod:`testbed.net.tcbatch`) and for
neighbour entries.
"""

from __future__ import annotations

import errno
import itertools
import os
import resource
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from testbed.common.errors import KernelError
from testbed.net import netns

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, pid
_SEQ_OFFSET = 8
NLMSG_ERROR = 2  # <linux/netlink.h>: an acknowledgement (error 0) or a refusal
NETEM_MISSING_HINT = ("load the netem module (`modprobe sch_netem`, package linux-modules-extra on some "
                      "distributions) or drop delay/jitter/loss")


HINTS = {
    errno.EPERM: "run as root (or with CAP_NET_ADMIN)",
    errno.EEXIST: "a stale object from an earlier run? `testbed down --all` removes testbed leftovers",
    errno.EOPNOTSUPP: "this kernel lacks the feature; `testbed doctor` lists what is available",
}
"""What to do about a refused netlink request, by its errno."""


def send_messages(ns: str, messages: Sequence[bytes], name: Callable[[int], str],
                  batch: ShapeBatch | None = None) -> None:
    """Encoded requests to namespace ``ns``, every answer read (:meth:`ShapeBatch.send`);
    the first refusal raised naming what it was for (``name`` of the message's index).
    A worker's permanent neighbour entries, one per other worker, were one netlink round
    trip each through pyroute2: 16 s of a 256-worker ``up`` (65,280 entries). ``batch``:
    one whose socket in ``ns`` stays open for the next call (else one is opened and closed)."""
    own = batch is None
    batch = batch or ShapeBatch()
    try:
        batch.send({ns: Datagram.of(messages, range(len(messages)))}, name)
    finally:
        if own:
            batch.close()


CHUNK = 128
"""Requests to a datagram. The kernel queues one acknowledgement per request while it
processes a datagram, before any is read: with the default receive buffer
(``net.core.rmem_default`` 212992) 256 fit and the 257th is lost (ENOBUFS)."""
CHUNK_BYTES = 128 * 1024
"""Bytes to a datagram: the kernel refuses one longer than the socket's send buffer
(``net.core.wmem_default`` 212992) with EMSGSIZE. An HTB class change is about 2.1 kB (its
rate tables), so 128 of them would not fit; 300 changes in one namespace did not, in one
datagram (``tests/kernel/test_tcbatch.py``)."""


class ShapeBatch:
    """Netlink sockets kept open per namespace; :meth:`send` applies encoded requests."""

    def __init__(self, timeout: float = 5.0):
        self.timeout = timeout
        self._socks: dict[str, socket.socket] = {}
        self._seq = itertools.count(1)
        self.timing: tuple[float, float] = (0.0, 0.0)
        """The last :meth:`send`'s seconds: sending its datagrams, then waiting for the acks."""

    def open(self, namespaces) -> None:
        """Open a socket in each namespace now (not at the first step)."""
        namespaces = [ns for ns in dict.fromkeys(namespaces) if ns not in self._socks]
        if not namespaces:
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = len(self._socks) + len(namespaces) + 256
        if soft != resource.RLIM_INFINITY and need > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard),
                                                        hard))
        for ns in namespaces:
            s = socket.socket(fileno=netns.open_netlink(ns))
            s.settimeout(self.timeout)
            self._socks[ns] = s

    def send(self, datagrams: dict[str, Datagram], name: Callable[[int], str]) -> None:
        """Send every namespace's requests and read their acknowledgements, at most
        :data:`CHUNK` requests and :data:`CHUNK_BYTES` to a datagram, each datagram's
        answers read before the next is sent (``timing``: the seconds the sends took, then
        the seconds waiting for answers).
        The first refusal is raised as a :class:`Refused` naming what it was for (``name`` of
        the message's owner), after every answer has been read (the others did apply); its
        ``owners`` lists the owner of every refused message."""
        self.open(datagrams)
        refused: list[tuple[str, int, int]] = []  # (namespace, owner, errno)
        sending = waiting = 0.0
        for ns, dg in datagrams.items():
            for part in dg.parts(CHUNK, CHUNK_BYTES):
                start = time.monotonic()
                seqs = self._send(ns, part)
                sent = time.monotonic()
                self._answers(ns, seqs, refused)
                sending, waiting = sending + sent - start, waiting + time.monotonic() - sent
        self.timing = (sending, waiting)
        if refused:
            first = _error(refused[0][0], name(refused[0][1]), refused[0][2])
            first.owners = [owner for _, owner, _ in refused]
            raise first

    def _send(self, ns: str, dg: Datagram) -> dict[int, int]:
        """``dg`` with fresh sequence numbers stamped, sent; sequence number -> owner."""
        buf = bytearray(dg.data)
        seqs: dict[int, int] = {}
        for off, owner in zip(dg.offsets, dg.owners):
            seq = next(self._seq) & 0xFFFFFFFF or next(self._seq)
            struct.pack_into("=I", buf, off + _SEQ_OFFSET, seq)
            seqs[seq] = owner
        try:
            self._socks[ns].send(buf)
        except OSError as e:
            raise KernelError(f"[{ns}] sending {len(seqs)} netlink request(s) failed: {e.strerror or e}") from None
        return seqs

    def _answers(self, ns: str, seqs: dict[int, int], refused: list[tuple[str, int, int]]) -> None:
        """Read until every request of ``seqs`` is answered; each refusal added to ``refused``."""
        s = self._socks[ns]
        while seqs:
            try:
                data = s.recv(1 << 16)
            except OSError as e:  # a timeout included
                raise KernelError(f"[{ns}] no answer to {len(seqs)} netlink request(s): {e.strerror or e}") from None
            off = 0
            while off + _HEADER.size <= len(data):
                length, mtype, _, seq, _ = _HEADER.unpack_from(data, off)
                if length < _HEADER.size:
                    break
                if mtype == NLMSG_ERROR and seq in seqs:
                    owner = seqs.pop(seq)
                    code = -struct.unpack_from("=i", data, off + _HEADER.size)[0]
                    if code:
                        refused.append((ns, owner, code))
                off += (length + 3) & ~3

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks.clear()


class Refused(KernelError):
    failed: list[str] = []
    """What every refused change was for (:meth:`LinkChanger.apply`)."""
    owners: list[int] = []
    """The owners of the refused messages (:meth:`ShapeBatch.send`)."""


def _error(ns: str, what: str, code: int) -> Refused:
    if "netem" in what and code in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL):
        return Refused(f"[{ns}] {what}: this kernel has no netem qdisc (sch_netem)", NETEM_MISSING_HINT)
    return Refused(f"[{ns}] {what} failed: {os.strerror(code)} (errno {code})", HINTS.get(code))


@dataclass(frozen=True)
class Datagram:
    """A namespace's encoded requests, concatenated: what one ``send`` carries. ``offsets``:
    where each message starts (its sequence number is stamped at send); ``owners``: the
    index of the change each message belongs to."""

    data: bytes
    offsets: tuple[int, ...]
    owners: tuple[int, ...]

    @classmethod
    def of(cls, messages: Sequence[bytes], owners: Iterable[int]) -> Datagram:
        """``messages`` concatenated, each owned by the matching entry of ``owners``."""
        offsets = tuple(itertools.accumulate((len(m) for m in messages[:-1]), initial=0))
        return cls(b"".join(messages), offsets, tuple(owners))

    def parts(self, n: int, size: int) -> Iterator[Datagram]:
        """This datagram as datagrams of at most ``n`` requests and ``size`` bytes each (a
        request longer than ``size`` alone); itself when it is within both."""
        if len(self.offsets) <= n and len(self.data) <= size:
            yield self
            return
        ends = (*self.offsets[1:], len(self.data))
        first = 0
        for i in range(1, len(self.offsets) + 1):
            if i == len(self.offsets) or i - first == n or ends[i] - self.offsets[first] > size:
                start, stop = self.offsets[first], ends[i - 1]
                yield Datagram(self.data[start:stop], tuple(o - start for o in self.offsets[first:i]),
                               self.owners[first:i])
                first = i

