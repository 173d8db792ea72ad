"""This host's IPv4 routes: which ranges are taken, and the source address towards a peer."""

from __future__ import annotations

import ipaddress
import socket

from pyroute2.iproute.linux import IPRoute


def host_routes() -> list[ipaddress.IPv4Network]:
    out: list[ipaddress.IPv4Network] = []
    with IPRoute() as ipr:
        for r in ipr.get_routes(family=socket.AF_INET):
            dst = r.get_attr("RTA_DST")
            if dst and r["dst_len"] > 0 and r.get_attr("RTA_TABLE") in (254, None):
                out.append(ipaddress.IPv4Network(f"{dst}/{r['dst_len']}", strict=False))
    return out


def route_source(dst: str) -> str | None:
    with IPRoute() as ipr:
        try:
            routes = ipr.route("get", dst=dst)
        except Exception:
            return None
    for r in routes:
        src = r.get_attr("RTA_PREFSRC")
        if src:
            return src
    return None
