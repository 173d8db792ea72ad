"""Shape changes encoded once and sent in one netlink datagram per namespace.

A trace step changes many links at once. Through pyroute2's request path a 64-link step
(128 directions) took 323 ms, about 2.5 ms per change: message encoding, HTB's rate table,
the interface lookup, and a socket per namespace. Here the messages for each shape are
encoded once (with pyroute2's own tc encoders, from the arguments :func:`change_requests`
chooses) and the sockets stay open. A step sends its namespace's messages in one
``send``, then reads one acknowledgement per message. The 128 changes then take a median
1.2 ms (``benchmarks/replay_latency``, "tc alone"). A replay's distinct steps are put
together into their datagrams once, and the links they make are derived and checked
once (:class:`Derived`): rebuilding 128 requests and shapes per step cost about as much
as sending them.

The way running links are changed (HTB ``change-class``, child qdisc ``replace``);
building uses :mod:`testbed.net.tc`.
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
from dataclasses import dataclass, replace

from pyroute2.iproute.linux import get_arguments_processor, get_dump_filter
from pyroute2.netlink import NLMSG_ERROR
from pyroute2.netlink.nlsocket import NetlinkRequest
from pyroute2.netlink.rtnl import RTM_NEWNEIGH, RTM_NEWQDISC, RTM_NEWTCLASS
from pyroute2.netlink.rtnl.ndmsg import ndmsg
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from testbed.common.errors import KernelError
from testbed.model.topology import Link, Shape, check_shape
from testbed.net import netns, tc
from testbed.net.rtnl import Rtnl

_COMMANDS = {"change-class": (RTM_NEWTCLASS, "change"), "replace": (RTM_NEWQDISC, "replace")}
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, pid
_SEQ_OFFSET = 8
NUD_PERMANENT = 0x80
"""A neighbour entry the kernel never expires nor counts toward its table's garbage collection."""


def encode(command: str, kind: str, **kwargs) -> bytes:
    """One tc request as pyroute2's ``IPRoute.tc(command, kind, **kwargs)`` would encode it
    (sequence number 0: :meth:`ShapeBatch.send` stamps it)."""
    msg_type, mode = _COMMANDS[command]
    kwargs = dict(kwargs, kind=kind)
    _, kwargs = get_dump_filter("tc", command, kwargs)
    args = get_arguments_processor("tc", command, kwargs)
    msg = tcmsg()
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = NetlinkRequest.flags[mode]  # request + ack (+ replace, + create)
    msg["header"]["sequence_number"] = 0
    msg["header"]["pid"] = 0
    for f in msg.fields:
        msg[f[0]] = args.get_value(f[0], default=0, mode="field")
    for key, value in args.items():
        nla = type(msg).name2nla(key)
        if msg.valid_nla(nla) and value is not None:
            msg["attrs"].append([nla, value])
    msg.encode()
    return bytes(msg.data)


def change_requests(index: int, shape: Shape, kind: str | None) -> tuple[list[tuple[str, str, dict]], str | None]:
    """What puts ``shape`` on interface ``index`` whose child qdisc is ``kind``, in place:
    (command, kind, arguments) for ``IPRoute.tc``, and the child's kind afterwards. The HTB
    class is changed; a netem or pfifo child is replaced (a netem child stays netem)."""
    reqs = [("change-class", "htb", dict(index=index, **tc._class_kwargs(shape)))]
    if shape.needs_netem or kind == "netem":
        return reqs + [("replace", "netem", dict(index=index, **tc._netem_kwargs(shape)))], "netem"
    if shape.limit is not None or kind == "pfifo":
        return reqs + [("replace", "pfifo", dict(index=index, handle=tc.CHILD, parent=tc.CLASS,
                                                 limit=tc.queue_limit(shape)))], "pfifo"
    return reqs, kind


def change_messages(index: int, shape: Shape, kind: str | None) -> tuple[list[bytes], str | None]:
    """:func:`change_requests`, encoded."""
    reqs, kind = change_requests(index, shape, kind)
    return [encode(command, k, **kw) for command, k, kw in reqs], kind


def neighbour_message(index: int, address: str, mac: str) -> bytes:
    """A permanent IPv4 neighbour entry on interface ``index`` (RTM_NEWNEIGH, create or
    replace, acknowledged), as pyroute2's ``IPRoute.neigh("replace", ...)`` encodes it
    (sequence number 0: :meth:`ShapeBatch.send` stamps it)."""
    msg = ndmsg()
    msg["header"]["type"] = RTM_NEWNEIGH
    msg["header"]["flags"] = NetlinkRequest.flags["replace"]
    msg["header"]["sequence_number"] = 0
    msg["header"]["pid"] = 0
    msg["family"] = socket.AF_INET
    msg["ifindex"] = index
    msg["state"] = NUD_PERMANENT
    msg["attrs"] = [["NDA_DST", address], ["NDA_LLADDR", mac]]
    msg.encode()
    return bytes(msg.data)


def add_neighbours(rtnl: Rtnl, ifname: str, entries: Sequence[tuple[str, str]]) -> None:
    """Permanent neighbour (ARP) entries ``(IPv4 address, MAC)`` on ``ifname`` in ``rtnl``'s
    namespace, in batched datagrams (:func:`send_messages`)."""
    idx = rtnl.index(ifname)
    send_messages(rtnl.ns, [neighbour_message(idx, address, mac) for address, mac in entries],
                  lambda i: f"adding the neighbour {entries[i][0]} ({entries[i][1]}) on {ifname}")


def send_messages(ns: str, messages: Sequence[bytes], name: Callable[[int], str], chunk: int = 128) -> None:
    """Encoded requests to namespace ``ns``, ``chunk`` to a datagram, every answer read;
    the first refusal raised naming what it was for (``name`` of the message's index).
    A worker's permanent neighbour entries, one per other worker, were one netlink round
    trip each through pyroute2: 16 s of a 256-worker ``up`` (65,280 entries). The kernel
    queues one acknowledgement per message while the datagram is processed, before any is
    read: with the default receive buffer (``net.core.rmem_default`` 212992) 256 fit and the
    257th is lost (ENOBUFS), so a datagram carries at most ``chunk`` (128)."""
    batch = ShapeBatch()
    try:
        for start in range(0, len(messages), chunk):
            part = messages[start:start + chunk]
            batch.send({ns: Datagram.of(part, range(start, start + len(part)))}, name)
    finally:
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
        return Refused(f"[{ns}] {what}: this kernel has no netem qdisc (sch_netem)", tc.NETEM_MISSING_HINT)
    return Refused(f"[{ns}] {what} failed: {os.strerror(code)} (errno {code})",
                       "run as root (or with CAP_NET_ADMIN)" if code == errno.EPERM else None)


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


@dataclass(frozen=True)
class _Prepared:
    """A whole call's datagrams, and the child kinds after it; ``keep`` holds the endpoints
    and shapes whose identities are its key, so that no other object can take their ids."""

    datagrams: dict[str, Datagram]
    after: dict[tuple[str, str], str | None]
    keep: tuple


_PREPARED_MAX = 64
"""Calls kept ready to send (a replay's distinct steps); more: the oldest half is dropped."""


class LinkChanger:
    """Changes running links' egress shapes; keeps what it learnt between calls.

    Each interface's index and child qdisc kind are read from the kernel once (one dump per
    namespace), each (interface, shape, kind) is encoded once, a call's datagrams are put
    together once per distinct call (the same endpoint and shape objects in the same order,
    as a replay's ``set_links`` passes them: :class:`Derived`), and the sockets stay open,
    so a replay's later steps cost only the datagrams. A one-off ``link set`` uses a fresh
    one."""

    def __init__(self):
        self.batch = ShapeBatch()
        self._index: dict[tuple[str, str], int] = {}
        self._kind: dict[tuple[str, str], str | None] = {}
        self._encoded: dict[tuple, tuple[list[bytes], str | None]] = {}
        self._prepared: dict[tuple[int, ...], _Prepared] = {}
        self.memo: tuple | None = None
        """The caller's across steps: ``Testbed.set_links`` keeps the state it last wrote here."""
        self.derived = Derived()
        """The caller's across steps: ``Testbed.set_links`` derives the changed links here."""

    def learn(self, endpoints) -> None:
        """Read the indexes and child kinds of ``endpoints`` (objects with ns, ifname) not yet known."""
        by_ns: dict[str, list] = {}
        for ep in endpoints:
            if (ep.ns, ep.ifname) not in self._index:
                by_ns.setdefault(ep.ns, []).append(ep)
        for ns, eps in by_ns.items():
            with Rtnl.open(ns) as rt:
                rt.load_indexes()
                children = {q["index"]: q.get_attr("TCA_KIND")
                            for q in rt.call("reading qdiscs", "get_qdiscs") if q["parent"] == tc.CLASS}
                for ep in eps:
                    idx = rt.index(ep.ifname)
                    self._index[(ns, ep.ifname)] = idx
                    self._kind[(ns, ep.ifname)] = children.get(idx)
        self.batch.open(by_ns)

    def requests(self, ep, shape: Shape) -> tuple[list[bytes], str | None]:
        """The messages that put ``shape`` on ``ep``'s egress, and the child kind after them."""
        key = (ep.ns, ep.ifname)
        if key not in self._index:
            self.learn([ep])
        enc = (key, shape, self._kind[key])
        if enc not in self._encoded:
            self._encoded[enc] = change_messages(self._index[key], shape, self._kind[key])
        return self._encoded[enc]

    def prepare(self, changes: Sequence[tuple]) -> _Prepared:
        """The datagrams of ``changes`` ((endpoint, shape, what) triples), put together once
        per distinct call: keyed by the identities of its endpoints and shapes."""
        key = tuple(id(x) for ep, shape, _ in changes for x in (ep, shape))
        ready = self._prepared.get(key)
        if ready is not None:
            return ready
        msgs: dict[str, list[tuple[bytes, int]]] = {}
        after = {}
        for i, (ep, shape, _) in enumerate(changes):
            encoded, kind = self.requests(ep, shape)
            msgs.setdefault(ep.ns, []).extend((m, i) for m in encoded)
            after[(ep.ns, ep.ifname)] = kind
        datagrams = {}
        for ns, ms in msgs.items():
            datagrams[ns] = Datagram.of([m for m, _ in ms], [i for _, i in ms])
        self.batch.open(datagrams)
        ready = _Prepared(datagrams, after, tuple((ep, shape) for ep, shape, _ in changes))
        if len(self._prepared) >= _PREPARED_MAX:
            for old in list(self._prepared)[:_PREPARED_MAX // 2]:
                del self._prepared[old]
        self._prepared[key] = ready
        return ready

    def apply(self, changes) -> None:
        """``changes``: (endpoint, shape, what) triples, sent together. A refusal raises
        :class:`Refused` whose ``failed`` holds the ``what`` of each change that failed."""
        changes = list(changes)
        ready = self.prepare(changes)
        try:
            self.batch.send(ready.datagrams, lambda i: f"{changes[i][2]} on {changes[i][0].ifname}")
        except BaseException as e:
            self.forget()
            if isinstance(e, Refused):
                e.failed = sorted({changes[i][2] for i in e.owners})
            raise
        if any(self._kind[k] != kind for k, kind in ready.after.items()):
            self._kind.update(ready.after)
            self._prepared.clear()  # put together for the kinds before

    def forget(self) -> None:
        """After a failure: read indexes and kinds from the kernel again on next use."""
        self._index.clear()
        self._kind.clear()
        self._prepared.clear()

    def close(self) -> None:
        self.batch.close()


class Derived:
    """Links with a change applied, kept across a replay's steps (``LinkChanger.derived``).

    Each (shape, change) is derived and checked once, and equal results are one object, so
    the next step finds them by identity: hashing 128 shapes by value, or deriving them
    again, cost as much as sending the step. Within one testbed a link's other fields are
    fixed by its index (only shapes change), so a link is one object per index and pair of
    shapes. The tables are emptied when they grow past ``limit`` entries."""

    def __init__(self, limit: int = 200_000):
        self.limit = limit
        self._clear()

    def _clear(self) -> None:
        self._changes: dict[tuple, int] = {}
        self._shapes: dict[tuple[int, int], tuple[Shape, Shape]] = {}
        self._canon: dict[Shape, Shape] = {}
        self._links: dict[tuple[int, int, int], list] = {}  # [link, its to_dict or None]

    def links(self, links: Iterable[Link], changes: dict, dirs: Sequence[str]) -> dict[int, Link]:
        """Each of ``links`` (by index) with ``changes`` on its ``dirs``; a TopologyError if a
        result breaks the loader's rules (jitter needs delay, the queue within bounds)."""
        if len(self._shapes) + len(self._links) > self.limit:
            self._clear()
        token = self._changes.setdefault(tuple(sorted(changes.items())), len(self._changes))
        out = {}
        for l in links:
            fwd, rev = l.forward, l.reverse
            if "forward" in dirs:
                fwd = self._shape(fwd, token, changes, f"link {l.name} (forward)")
            if "reverse" in dirs:
                rev = self._shape(rev, token, changes, f"link {l.name} (reverse)")
            key = (l.index, id(fwd), id(rev))
            known = self._links.get(key)
            if known is None:  # the link kept holds its shapes: the ids in the key stay theirs
                new = l if fwd is l.forward and rev is l.reverse else replace(l, forward=fwd, reverse=rev)
                known = self._links[key] = [new, None]
            out[l.index] = known[0]
        return out

    def to_dict(self, link: Link) -> dict:
        """``link.to_dict()`` of a link :meth:`links` returned, made once (not to be changed)."""
        known = self._links.get((link.index, id(link.forward), id(link.reverse)))
        if known is None or known[0] is not link:
            return link.to_dict()
        if known[1] is None:
            known[1] = link.to_dict()
        return known[1]

    def _shape(self, shape: Shape, token: int, changes: dict, path: str) -> Shape:
        known = self._shapes.get((id(shape), token))
        if known is None or known[0] is not shape:
            new = check_shape(replace(shape, **changes), path)
            # the entry holds ``shape``: its id in the key stays its own
            known = self._shapes[(id(shape), token)] = (shape, self._canon.setdefault(new, new))
        return known[1]
