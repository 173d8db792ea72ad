"""A worker's network sysctls (``sysctls:`` on a worker or under ``defaults:``)."""

from __future__ import annotations

import re
from typing import Any

from testbed.common.errors import TopologyError
from testbed.model.fields import mapping

SYSCTL_KEY_RE = re.compile(r"^net\.[a-z0-9_]+(\.[a-z0-9_-]+)+$")
SYSCTL_VALUE_RE = re.compile(r"^[A-Za-z0-9_. :/-]{1,256}$")


def parse_sysctls(value: Any, path: str) -> dict[str, str]:
    """``{net.ipv4.tcp_congestion_control: reno}`` -> validated str -> str.

    Only ``net.*`` keys: those are per network namespace. Anything else (``kernel.*``,
    ``vm.*``) would change the host, not the node.
    """
    if value is None:
        return {}
    d = mapping(value, path, "sysctl key -> value, e.g. net.ipv4.tcp_congestion_control: reno")
    out = {}
    for k, v in d.items():
        if not isinstance(k, str) or not SYSCTL_KEY_RE.fullmatch(k):
            raise TopologyError(f"{path}", f"{k!r} is not a network sysctl key",
                                "only net.* keys are per node (they live in the node's network namespace), "
                                "e.g. net.ipv4.tcp_congestion_control")
        if isinstance(v, bool) or not isinstance(v, (str, int)) or not SYSCTL_VALUE_RE.fullmatch(str(v)):
            raise TopologyError(f"{path}.{k}", f"invalid value {v!r}",
                                "give a number or a word (letters, digits, '._-: /'), as `sysctl -w` would take it")
        out[k] = str(v)
    return out
