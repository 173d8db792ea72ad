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
building uses :mod:`testbed.net.tc`; both send through :mod:`testbed.net.nlbatch`.
"""

from __future__ import annotations

import functools
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from pyroute2.netlink.nlsocket import NetlinkRequest
from pyroute2.netlink.rtnl import RTM_NEWNEIGH
from pyroute2.netlink.rtnl.ndmsg import ndmsg

from testbed.model.topology import Link, Shape, check_shape
from testbed.net import tc
from testbed.net.nlbatch import Datagram, Refused, ShapeBatch
from testbed.net.rtnl import Rtnl

NUD_PERMANENT = 0x80
"""A neighbour entry the kernel never expires nor counts toward its table's garbage collection."""


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
    return [tc.encode(command, k, **kw) for command, k, kw in reqs], kind


def neighbour_message(index: int, address: str, mac: str) -> bytes:
    """A permanent IPv4 neighbour entry on interface ``index`` (RTM_NEWNEIGH, create or
    replace, acknowledged), as pyroute2's ``IPRoute.neigh("replace", ...)`` encodes it
    (sequence number 0: :meth:`ShapeBatch.send` stamps it). pyroute2 encodes one template;
    each entry is a copy with its index, address and MAC written in: a 256-worker ``up``
    makes 65,280 of them, about 2.3 s of pyroute2's encoder (``Testbed.up`` of a 256-worker
    star: 4.5 s before, 2.1-2.2 s after)."""
    template, at_index, at_dst, at_mac = _neighbour_template()
    data = bytearray(template)
    struct.pack_into("=i", data, at_index, index)
    data[at_dst:at_dst + 4] = socket.inet_aton(address)
    data[at_mac:at_mac + 6] = bytes.fromhex(mac.replace(":", ""))
    return bytes(data)


def encode_neighbour(index: int, address: str, mac: str) -> bytes:
    """:func:`neighbour_message` through pyroute2's encoder each time (its template, and
    what it is checked against)."""
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


@functools.lru_cache(maxsize=1)
def _neighbour_template() -> tuple[bytes, int, int, int]:
    """A neighbour message from pyroute2 and where its index, NDA_DST and NDA_LLADDR values
    lie: after ``struct nlmsghdr`` (16 bytes), ``struct ndmsg`` (family, 3 bytes of padding,
    ifindex, ...: 12 bytes), then its attributes, each (length, type) then the value."""
    data = encode_neighbour(0, "0.0.0.0", "00:00:00:00:00:00")
    at: dict[int, int] = {}
    off = 16 + 12
    while off + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        at[kind] = off + 4
        off += (length + 3) & ~3
    return data, 16 + 4, at[_NDA_DST], at[_NDA_LLADDR]


_NDA_DST, _NDA_LLADDR = 1, 2  # <linux/neighbour.h>


def add_neighbours(rtnl: Rtnl, ifname: str, entries: Sequence[tuple[str, str]]) -> None:
    """Permanent neighbour (ARP) entries ``(IPv4 address, MAC)`` on ``ifname`` in ``rtnl``'s
    namespace, in batched datagrams (:func:`send_messages`)."""
    idx = rtnl.index(ifname)
    rtnl.send([neighbour_message(idx, address, mac) for address, mac in entries],
                  lambda i: f"adding the neighbour {entries[i][0]} ({entries[i][1]}) on {ifname}")



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
        self.learn(ep for ep, _, _ in changes)  # one dump per namespace for all (not one per endpoint: 300 took 32 s)
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
