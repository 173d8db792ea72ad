"""Link shaping with tc: HTB for the rate, an optional netem child for delay/jitter/loss.

Per egress interface::

    qdisc htb 1: default 1
      class 1:1  rate R ceil R burst B cburst B quantum 60000
        qdisc netem 10: delay D jitter J loss L limit N     (only when asked for)
        or qdisc pfifo 10: limit N                          (only when a limit is given)

B = max(15000 bytes, 1 ms of R): measured on these machines, TCP goodput then reaches
0.956 x R (the TCP/IP/Ethernet header overhead at MTU 1500) from 10 Mbit/s to 10 Gbit/s;
HTB's default of about one packet loses a further ~2.4 % at 1 Gbit/s. The netem queue is
sized to twice the bandwidth-delay product, since its default of 1000 packets caps long
fat links. Rates are changed in place (``change`` on the class), never by deleting the
qdisc, so counters and running flows survive.
"""

from __future__ import annotations

import functools
import struct

from pyroute2.iproute.linux import get_arguments_processor, get_dump_filter
from pyroute2.netlink.nlsocket import NetlinkRequest
from pyroute2.netlink.rtnl import RTM_NEWQDISC, RTM_NEWTCLASS
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from testbed.model.topology import Shape
from testbed.net.nlbatch import NETEM_MISSING_HINT as NETEM_MISSING_HINT  # where callers look for it
from testbed.net.rtnl import Rtnl

ROOT = 0x10000  # 1:
CLASS = 0x10001  # 1:1
CHILD = 0xA0000  # 10:
TC_H_ROOT = 0xFFFFFFFF
QUANTUM = 60000
MTU_BYTES = 1514
_COMMANDS = {"add": (RTM_NEWQDISC, "create"), "add-class": (RTM_NEWTCLASS, "create"),
             "change-class": (RTM_NEWTCLASS, "change"), "replace": (RTM_NEWQDISC, "replace")}


def burst_bytes(shape: Shape) -> int:
    return max(15000, shape.rate.bytes_per_second // 1000)


def queue_limit(shape: Shape) -> int:
    """Packets the leaf queue holds: the user's limit, else >= 2x the bandwidth-delay product."""
    return shape.queue_packets


def _class_kwargs(shape: Shape) -> dict:
    rate = shape.rate.bytes_per_second
    b = burst_bytes(shape)
    return dict(handle=CLASS, parent=ROOT, rate=rate, ceil=rate, burst=b, cburst=b, quantum=QUANTUM)


def _netem_kwargs(shape: Shape) -> dict:
    return dict(handle=CHILD, parent=CLASS, delay=shape.delay.us, jitter=shape.jitter.us,
                loss=shape.loss.percent, limit=queue_limit(shape))


def apply(rtnl: Rtnl, ifname: str, shape: Shape) -> None:
    """Install shaping on a fresh interface's egress: its two or three requests in one
    datagram (:meth:`Rtnl.send`), not a round trip each."""
    idx = rtnl.index(ifname)
    reqs = [(f"adding htb on {ifname}", "add", "htb", dict(index=idx, handle=ROOT, default=1)),
            (f"adding htb class on {ifname}", "add-class", "htb", dict(index=idx, **_class_kwargs(shape)))]
    if shape.needs_netem:
        reqs.append((f"adding netem on {ifname}", "add", "netem", dict(index=idx, **_netem_kwargs(shape))))
    elif shape.limit is not None:
        reqs.append((f"adding pfifo on {ifname}", "add", "pfifo",
                     dict(index=idx, handle=CHILD, parent=CLASS, limit=shape.limit)))
    rtnl.send([encode(command, kind, **kw) for _, command, kind, kw in reqs], lambda i: reqs[i][0])


def encode(command: str, kind: str, *, index: int, **kwargs) -> bytes:
    """One tc request as pyroute2's ``IPRoute.tc(command, kind, index=index, **kwargs)``
    would encode it (sequence number 0: :meth:`testbed.net.nlbatch.ShapeBatch.send` stamps
    it). pyroute2's encoder takes about 0.25 ms a message (HTB's rate tables), so each
    (command, kind, arguments) is encoded once and the interface's index written into a copy:
    a topology's links share a few shapes."""
    data = bytearray(_encoded(command, kind, tuple(sorted(kwargs.items()))))
    _INDEX.pack_into(data, _INDEX_OFFSET, index)
    return bytes(data)


_INDEX = struct.Struct("=i")
_INDEX_OFFSET = 20
"""Where a tc request holds its interface: after ``struct nlmsghdr`` (16 bytes), ``struct
tcmsg``'s family and padding (4 bytes), then ``tcm_ifindex``."""


@functools.lru_cache(maxsize=4096)
def _encoded(command: str, kind: str, items: tuple) -> bytes:
    return encode_uncached(command, kind, index=0, **dict(items))


def encode_uncached(command: str, kind: str, **kwargs) -> bytes:
    """:func:`encode` through pyroute2 each time (what the cache is checked against)."""
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



def egress_stats(rtnl: Rtnl) -> dict[int, dict]:
    """Root-qdisc counters of every interface in the namespace: ifindex -> counters."""
    out: dict[int, dict] = {}
    for q in rtnl.call("reading qdisc counters", "get_qdiscs"):
        if q["parent"] != TC_H_ROOT or q.get_attr("TCA_KIND") != "htb":
            continue
        s2 = q.get_attr("TCA_STATS2")
        basic = s2.get_attr("TCA_STATS_BASIC") if s2 else None
        queue = s2.get_attr("TCA_STATS_QUEUE") if s2 else None
        out[q["index"]] = {
            "bytes": basic["bytes"] if basic else 0,
            "packets": basic["packets"] if basic else 0,
            "drops": queue["drops"] if queue else 0,
            "overlimits": queue["overlimits"] if queue else 0,
            "backlog_bytes": queue["backlog"] if queue else 0,
            "qlen": queue["qlen"] if queue else 0,
        }
    return out
