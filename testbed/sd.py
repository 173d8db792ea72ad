"""Prometheus file-based service discovery (one JSON file per exporter) and listen addresses.

Every exporter testbed starts announces itself by writing a target file, replaced
atomically so Prometheus never reads half of one, and removed when the exporter stops::

    [{"targets": ["127.0.0.1:40517"], "labels": {"exporter": "links"}}]

Testbed and run exporters write into ``targets_dir()`` (``<state dir>/targets``, on tmpfs
with the testbeds they describe); `testbed monitor up` points Prometheus at that directory
and at ``<monitor dir>/targets`` (for targets added by hand).
"""

from __future__ import annotations

import json
from pathlib import Path

from .ledger import state_root


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` too; an empty host means 127.0.0.1) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def hostport(host: str, port: int) -> str:
    """``host:port`` for a URL or a target file; an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_error(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (e.g. "Address already in use"), or None."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def targets_dir() -> Path:
    return state_root() / "targets"


def testbed_target(name: str) -> Path:
    """The target file of testbed ``name``'s link exporter."""
    return targets_dir() / f"testbed-{name}.json"


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
    from .files import write_json

    write_json(path, [{"targets": [hostport(host, port)], "labels": labels}], indent=None)


def read_target(path: Path) -> str | None:
    """The address a target file announces, or None when there is none (yet)."""
    try:
        return json.loads(path.read_text())[0]["targets"][0]
    except (OSError, ValueError, LookupError, TypeError):
        return None
