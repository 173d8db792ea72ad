"""Prometheus file-based service discovery: one JSON file per exporter.

Every exporter testbed starts announces itself by writing a target file, replaced
atomically so Prometheus never reads half of one, and removed when the exporter stops::

    [{"targets": ["127.0.0.1:40517"], "labels": {"exporter": "links"}}]

Testbed and run exporters write into ``targets_dir()`` (``<state dir>/targets``, on tmpfs
with the testbeds they describe); `testbed monitor up` points Prometheus at that directory
and at ``<monitor dir>/targets`` (for targets added by hand).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import hostport


def targets_dir() -> Path:
    from testbed.ledger import state_root

    return state_root() / "targets"


def watchers_dir() -> Path:
    """Where each running `testbed monitor` leaves a note (its pid, URL and scrape interval)."""
    return targets_dir().parent / "monitors"


def watchers() -> list[dict]:
    """The running monitors whose Prometheus reads ``targets_dir()``."""
    out = []
    try:
        files = list(watchers_dir().glob("*.json"))
    except OSError:
        return out
    for f in files:
        try:
            w = json.loads(f.read_text())
            with open(f"/proc/{int(w['pid'])}/cmdline", "rb") as c:
                if w["marker"].encode() in c.read().split(b"\0"):
                    out.append(w)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def write_target(path: Path, host: str, port: int, labels: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    addr = hostport(host, port)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps([{"targets": [addr], "labels": labels}]) + "\n")
    os.replace(tmp, path)


def read_target(path: Path) -> str | None:
    """The address a target file announces, or None when there is none (yet)."""
    try:
        return json.loads(path.read_text())[0]["targets"][0]
    except (OSError, ValueError, LookupError, TypeError):
        return None
