"""Checks on single values of a parsed topology document, shared by its sections.

Each raises :class:`TopologyError` naming the YAML path of the value (``nodes.w0``,
``hosts[1].name``) and, where one helps, how to fix it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Iterable

from testbed.common.errors import TopologyError, shown

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
MAX_NODE_NAME = 63
MAX_TESTBED_NAME = 32

RESERVED_NAMES = ("targets", "monitors")
"""Folders of the state directory itself: no testbed may be called so."""


def mapping(value: Any, path: str, what: str) -> dict:
    """``value`` as a mapping with string keys; ``what`` says what it should hold."""
    if not isinstance(value, dict):
        raise TopologyError(path, f"expected a mapping ({what}), got {type(value).__name__}")
    for k in value:
        if not isinstance(k, str):
            raise TopologyError(path, f"key {k!r} is not a string", "quote it in the YAML file")
    return value


def unknown_keys(d: dict, allowed: Iterable[str], path: str) -> None:
    """Refuse the first key of ``d`` that is not ``allowed``, listing those that are."""
    allowed = tuple(allowed)
    for k in d:
        if k not in allowed:
            raise TopologyError(f"{path}.{k}" if path else str(k), f"unknown key '{k}'",
                                f"allowed keys here: {', '.join(allowed)}")


def check_name(value: Any, path: str, maxlen: int, what: str) -> str:
    """A node, host or testbed name: letters, digits, '-' and '_', at most ``maxlen``."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or len(value) > maxlen:
        raise TopologyError(path, f"invalid {what} {shown(value)}",
                            f"use 1-{maxlen} letters, digits, '-' or '_', starting with a letter or digit")
    return value


def check_testbed_name(value: Any, path: str = "name") -> str:
    """A testbed name, from YAML or the command line: one rule for both."""
    check_name(value, path, MAX_TESTBED_NAME, "testbed name")
    if value in RESERVED_NAMES:
        raise TopologyError(path, f"testbed name {value!r} is reserved (a folder of the state directory)",
                            "choose another name")
    return value


def ipv4(value: Any) -> str | None:
    """The IPv4 address ``value`` spells, normalised; None if it is none."""
    if not isinstance(value, str):
        return None
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        return None
