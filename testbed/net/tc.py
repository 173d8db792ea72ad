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

import errno

from pyroute2.netlink.exceptions import NetlinkError

from testbed.common.errors import KernelError
from testbed.model.topology import Shape
from testbed.net.rtnl import Rtnl, translate

ROOT = 0x10000  # 1:
CLASS = 0x10001  # 1:1
CHILD = 0xA0000  # 10:
TC_H_ROOT = 0xFFFFFFFF
QUANTUM = 60000
MTU_BYTES = 1514
NETEM_MISSING_HINT = "load the netem module (`modprobe sch_netem`, package linux-modules-extra on some distributions) or drop delay/jitter/loss"


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


def _tc(rtnl: Rtnl, what: str, *args, **kwargs) -> None:
    try:
        rtnl.ipr.tc(*args, **kwargs)
    except NetlinkError as e:
        if args[1] == "netem" and e.code in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL):
            raise KernelError(f"[{rtnl.ns}] {what}: this kernel has no netem qdisc (sch_netem)", NETEM_MISSING_HINT) from None
        raise translate(e, what, rtnl.ns) from None


def apply(rtnl: Rtnl, ifname: str, shape: Shape) -> None:
    """Install shaping on a fresh interface's egress."""
    idx = rtnl.index(ifname)
    _tc(rtnl, f"adding htb on {ifname}", "add", "htb", index=idx, handle=ROOT, default=1)
    _tc(rtnl, f"adding htb class on {ifname}", "add-class", "htb", index=idx, **_class_kwargs(shape))
    if shape.needs_netem:
        _tc(rtnl, f"adding netem on {ifname}", "add", "netem", index=idx, **_netem_kwargs(shape))
    elif shape.limit is not None:
        _tc(rtnl, f"adding pfifo on {ifname}", "add", "pfifo", index=idx, handle=CHILD, parent=CLASS, limit=shape.limit)


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
