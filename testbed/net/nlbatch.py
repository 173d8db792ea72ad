"""Encoded netlink requests sent in one datagram per namespace, every answer read.

Through pyroute2's request path each request is a round trip through its asyncio loop,
about 1 ms; here already encoded requests (pyroute2's own encoders, :func:`testbed.net.tc.encode`,
:func:`testbed.net.tcbatch.neighbour_message`) go to the kernel in one ``send``, and one
acknowledgement per request is read back. Used to build links' shaping
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
from collections.abc import Callable, Iterable, Sequence
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


def send_messages(ns: str, messages: Sequence[bytes], name: Callable[[int], str], chunk: int = 128,
                  batch: ShapeBatch | None = None) -> None:
    """Encoded requests to namespace ``ns``, ``chunk`` to a datagram, every answer read;
    the first refusal raised naming what it was for (``name`` of the message's index).
    A worker's permanent neighbour entries, one per other worker, were one netlink round
    trip each through pyroute2: 16 s of a 256-worker ``up`` (65,280 entries). The kernel
    queues one acknowledgement per message while the datagram is processed, before any is
    read: with the default receive buffer (``net.core.rmem_default`` 212992) 256 fit and the
    257th is lost (ENOBUFS), so a datagram carries at most ``chunk`` (128). ``batch``: one
    whose socket in ``ns`` stays open for the next call (else one is opened and closed)."""
    own = batch is None
    batch = batch or ShapeBatch()
    try:
        for start in range(0, len(messages), chunk):
            part = messages[start:start + chunk]
            batch.send({ns: Datagram.of(part, range(start, start + len(part)))}, name)
    finally:
        if own:
            batch.close()


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
        """Send every namespace's datagram, then wait for all acknowledgements (``timing``:
        the seconds the sends took, then the kernel's answers after them). The first
        refusal is raised as a :class:`Refused` naming what it was for (``name`` of the
        message's owner), after every answer has been read (the others did apply); its
        ``owners`` lists the owner of every refused message."""
        self.open(datagrams)
        start = time.monotonic()
        waiting: dict[str, dict[int, int]] = {}
        for ns, dg in datagrams.items():
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
            waiting[ns] = seqs
        sent = time.monotonic()
        first: Refused | None = None
        owners: list[int] = []
        for ns, seqs in waiting.items():
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
                            owners.append(owner)
                            first = first or _error(ns, name(owner), code)
                    off += (length + 3) & ~3
        self.timing = (sent - start, time.monotonic() - sent)
        if first is not None:
            first.owners = owners
            raise first

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

