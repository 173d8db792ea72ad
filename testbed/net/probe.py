"""What this kernel can do, probed in a throwaway namespace (nothing outside it is touched)."""

from __future__ import annotations

import functools
import os

from pyroute2.netlink.exceptions import NetlinkError

from testbed.net import netns
from testbed.net.rtnl import Rtnl


@functools.lru_cache(maxsize=None)
def probe() -> dict[str, tuple[bool, str]]:
    """feature -> (available, detail). Needs root; raises KernelError otherwise."""
    name = f"testbed-probe-{os.getpid()}"
    res: dict[str, tuple[bool, str]] = {}
    rt = Rtnl.create_netns(name)
    try:
        res["netns"] = (True, "network namespaces work")
        try:
            rt.ipr.link("add", ifname="pa", kind="veth", peer={"ifname": "pb"})
            rt.ipr.link("set", index=rt.index("pa"), state="up")
            res["veth"] = (True, "veth pairs work")
        except NetlinkError as e:
            res["veth"] = (False, f"veth: {os.strerror(e.code)}")
        try:
            rt.ipr.link("add", ifname="pbr", kind="bridge")
            res["bridge"] = (True, "Linux bridge works")
        except NetlinkError as e:
            res["bridge"] = (False, f"bridge: {os.strerror(e.code)}")
        if res["veth"][0]:
            qdiscs = {
                "htb": dict(handle=0x10000, default=1),
                "tbf": dict(rate=1_000_000, burst=15000, latency=50000),
                "netem": dict(delay=1000),
            }
            for i, (kind, kw) in enumerate(qdiscs.items()):
                try:  # a fresh veth per qdisc kind: nothing to delete between probes
                    rt.ipr.link("add", ifname=f"q{i}", kind="veth", peer={"ifname": f"r{i}"})
                    rt.ipr.tc("add", kind, index=rt.index(f"q{i}"), **kw)
                    res[kind] = (True, f"qdisc {kind} available")
                except NetlinkError as e:
                    res[kind] = (False, f"qdisc {kind}: {os.strerror(e.code)} (kernel module sch_{kind} missing?)")
                except Exception as e:  # pyroute2 argument errors etc.: report, do not crash doctor
                    res[kind] = (False, f"qdisc {kind}: probe failed: {e!r}")
    finally:
        rt.close()
        netns.remove(name)
    return res


def netem_missing() -> str | None:
    """Why this kernel cannot run netem (delay, jitter, loss), or None when it can."""
    ok, detail = probe()["netem"]
    return None if ok else detail
