"""Who may read an ordinary user's metrics: that user only.

Root's exporters and Prometheus listen on loopback without credentials, as a system service
does (the machine's metrics are its administrator's). An ordinary user's (rootless) listen on
the same loopback, which every user of the machine reaches, so they ask for a secret only
that user can read: a random token in ``$XDG_STATE_HOME/testbed/metrics.token`` (mode 0600,
in a private directory), made on first use.

- the exporters (the links' and a run's) answer ``/metrics`` only with
  ``Authorization: Bearer TOKEN`` (:mod:`collectors.serve`); others get 401;
- the user's Prometheus scrapes them with that token (``credentials_file``) and asks for HTTP
  basic auth itself (``--web.config.file``): user ``testbed``, the token as password, stored
  as a bcrypt hash, as Prometheus requires;
- testbed's own calls (``monitor up``'s readiness, ``monitor status``) send it; so do the
  user's tools (``curl -u testbed:$(cat ~/.local/state/testbed/metrics.token) ...``).

Why a token and not the user's own network namespace: Prometheus, Grafana and the user's
browser live in the host's namespace, and a token costs one header compare per scrape
(benchmarks/exporter.py).
"""

from __future__ import annotations

import base64
import os
import secrets
import stat
from pathlib import Path

from testbed.common import rootless
from testbed.common.errors import StateError
from testbed.common.files import private_dir, read_text

USER = "testbed"
"""The basic-auth user name of a rootless user's Prometheus."""
TOKEN_ENV = "TESTBED_METRICS_TOKEN_FILE"


def required() -> bool:
    """Metrics of an ordinary user (rootless, or about to be): they ask for the token."""
    return rootless.active() or os.geteuid() != 0


def user_state_dir() -> Path:
    """``$XDG_STATE_HOME/testbed`` (``~/.local/state/testbed``): what outlives the holder."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state") / "testbed"


def token_path() -> Path:
    return Path(os.environ.get(TOKEN_ENV) or user_state_dir() / "metrics.token")


def token() -> str:
    """The user's token, made (0600, in a private directory) when there is none yet."""
    path = token_path()
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return read_token(path)
    with os.fdopen(fd, "w") as f:
        value = secrets.token_urlsafe(32)
        f.write(value + "\n")
    return value


def read_token(path: Path) -> str:
    """A token file, refused unless it is the user's own regular file that no one else can read."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise StateError(f"{path} is not a private file of yours (mode {stat.S_IMODE(st.st_mode):o}, "
                         f"uid {st.st_uid})", f"remove it; testbed makes a new one ({TOKEN_ENV} names another)")
    value = read_text(path, "key", "metrics token").strip()
    if len(value) < 16 or not value.isascii() or any(c.isspace() for c in value):
        raise StateError(f"{path} holds no token", "remove it; testbed makes a new one")
    return value


def exporter_args() -> list[str]:
    """``python -m collectors``'s arguments that make it the user's own (none as root)."""
    if not required():
        return []
    token()  # made now, by the user's own command, before the exporter reads it
    return ["--token-file", str(token_path())]


def headers() -> dict[str, str]:
    """What testbed's own requests to the user's Prometheus carry (none as root)."""
    if not required():
        return {}
    basic = base64.b64encode(f"{USER}:{token()}".encode()).decode()
    return {"Authorization": f"Basic {basic}"}


def web_config() -> dict:
    """Prometheus's ``--web.config.file`` for the user: basic auth, the token as password."""
    import bcrypt

    hashed = bcrypt.hashpw(token().encode(), bcrypt.gensalt(rounds=10)).decode()
    return {"basic_auth_users": {USER: hashed}}


def listener_uid(host: str, port: int) -> int | None:
    """The uid owning the TCP socket that listens on ``host:port`` of this network
    namespace (``/proc/net/tcp``, ``tcp6``; uids as this user namespace sees them), or None
    when nothing listens there. Before the token goes to an exporter whose target file
    outlived it, the port may be another user's now."""
    import ipaddress

    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read(4 << 20).splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 8 or cols[3] != "0A":  # LISTEN
                continue
            local, _, hexport = cols[1].partition(":")
            if int(hexport, 16) != port:
                continue
            raw = bytes.fromhex(local)
            # the kernel prints each 32-bit word in host (little-endian) order
            ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
            mapped = getattr(ip, "ipv4_mapped", None)
            if addr in (ip, mapped) or ip.is_unspecified:  # its address, v4-mapped, or any
                return int(cols[7])
    return None
