"""Prometheus file-based service discovery (one JSON file per exporter) and listen addresses.

Every exporter testbed starts announces itself by writing a target file, replaced
atomically so Prometheus never reads half of one, and removed when the exporter stops::

    [{"targets": ["127.0.0.1:40517"], "labels": {"exporter": "links"}}]

Testbed and run exporters write into ``targets_dir()`` (``<state dir>/targets``, on tmpfs
with the testbeds they describe); `testbed monitor up` points Prometheus at that directory
and at ``<monitor dir>/targets`` (for targets added by hand).
"""

from __future__ import annotations

import socket
from pathlib import Path

from testbed.common.digits import ascii_int
from testbed.common.errors import TestbedError
from testbed.common.files import read_json


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` too; an empty host means 127.0.0.1) -> (host, port)."""
    host, sep, text = value.rpartition(":")
    port = ascii_int(text, 5)
    if not sep or port is None or port > 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", port


def hostport(host: str, port: int) -> str:
    """``host:port`` for a URL or a target file; an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_error(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (e.g. "Address already in use"), or None."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def targets_dir() -> Path:
    from testbed.common.state import state_root  # here: the link exporter announces itself without it

    return state_root() / "targets"


def testbed_target(name: str) -> Path:
    """The target file of testbed ``name``'s link exporter."""
    return targets_dir() / f"testbed-{name}.json"


def watchers_dir() -> Path:
    """Where each running `testbed monitor` leaves a note (its pid, URL and scrape interval)."""
    return targets_dir().parent / "monitors"


def watchers() -> list[dict]:
    """The running monitors whose Prometheus reads ``targets_dir()``."""
    out: list[dict] = []
    try:
        files = list(watchers_dir().glob("*.json"))
    except OSError:
        return out
    for f in files:
        try:
            w = read_json(f, "json", "watcher file")
            with open(f"/proc/{int(w['pid'])}/cmdline", "rb") as c:
                if w["marker"].encode() in c.read().split(b"\0"):
                    out.append(w)
        except (OSError, ValueError, KeyError, TypeError, TestbedError):
            continue
    return out


def write_target(path: Path, host: str, port: int, labels: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    from testbed.common.files import write_json

    write_json(path, [{"targets": [hostport(host, port)], "labels": labels}], indent=None)


def read_target(path: Path) -> str | None:
    """The address a target file announces, or None when there is none (yet)."""
    try:
        return read_json(path, "json", "target file")[0]["targets"][0]
    except (OSError, ValueError, LookupError, TypeError, TestbedError):
        return None


def check_listen(value: str, flag: str, example: str, any_port: bool = True) -> tuple[str, int]:
    """A HOST:PORT a process testbed starts will listen on, checked before it starts.

    Errors name ``flag`` and say what is wrong: the format, a host that does not resolve,
    or an address that cannot be bound now (e.g. in use). Port 0 (any free port) only
    when ``any_port``."""
    try:
        host, port = parse_listen(value)
    except ValueError:
        port = -1
    if port < 0 or (port == 0 and not any_port):
        raise TestbedError(f"{flag} {value!r} is not HOST:PORT" + ("" if any_port else " with a port"),
                           f"write e.g. {flag} {example}")
    try:
        socket.getaddrinfo(host, port)
    except OSError:
        raise TestbedError(f"{flag} {value!r}: host {host!r} does not resolve",
                           f"give an address of this host, e.g. {flag} {example}") from None
    if port and (why := bind_error(host, port)):
        raise TestbedError(f"{flag} {value}: cannot listen there: {why}",
                           f"choose another address, e.g. {flag} {example}")
    return host, port
