"""SSH to the hosts of a multi-host testbed (paramiko), host keys always verified.

A host's key is checked against its ``known_hosts`` file (default ``~/.ssh/known_hosts``,
then ``/etc/ssh/ssh_known_hosts``) with paramiko's RejectPolicy: an unknown key is refused
unless the topology opts in with ``accept_new_host_key: true`` (then it is added, as
OpenSSH's ``accept-new`` does), and a key that *changed* is refused always. (Fabric's
default would auto-add every key; we never use it.)

Remote commands are argv lists; each word is quoted with :func:`shlex.quote` and the line
starts with ``exec``, so the remote shell only ever sees words it will not interpret and
the command replaces the shell (a remote process whose SSH connection dies is then the
direct child of sshd's session and learns of it through PR_SET_PDEATHSIG).

A host that stops answering (pulled cable, frozen, firewalled: packets vanish, nothing
resets the connection) is noticed within ``TESTBED_HOST_TIMEOUT`` seconds (default 30):
keepalives are sent every few seconds and the kernel drops a connection whose data stays
unacknowledged that long (TCP_USER_TIMEOUT). The process then remembers the host as silent
for as long again, so that what follows (a rollback, a teardown, the next counter read)
fails at once naming it instead of waiting on it once more.
"""

from __future__ import annotations

import errno
import json
import os
import select
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import Sequence

from testbed.common import rootless
from testbed.common.digits import is_ascii_int
from testbed.common.errors import StateError, TestbedError
from testbed.common.files import check_regular
from testbed.common.version import __version__
from testbed.model.topology import Host

CONNECT_TIMEOUT = 15.0
HOST_TIMEOUT_ENV, HOST_TIMEOUT_DEFAULT_S = "TESTBED_HOST_TIMEOUT", 30.0

_SILENT: dict[tuple[str, int], tuple[float, str]] = {}
"""(address, port) -> (when it was found silent, why), for this process."""


def host_timeout() -> float:
    """Seconds a host may leave our data unacknowledged before it is taken for gone."""
    raw = os.environ.get(HOST_TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw.strip() else HOST_TIMEOUT_DEFAULT_S
    except ValueError:
        value = 0.0
    if not 1 <= value < 86400:
        raise TestbedError(f"{HOST_TIMEOUT_ENV}={raw!r} is not a number of seconds between 1 and 86400",
                           f"e.g. {HOST_TIMEOUT_ENV}=60 on a slow or lossy underlay")
    return value


def silent(host: Host, why: str) -> None:
    """Remember that ``host`` stopped answering (see the module's docstring)."""
    _SILENT[(host.address, host.port)] = (time.monotonic(), why)


def _still_silent(host: Host) -> str | None:
    seen = _SILENT.get((host.address, host.port))
    if seen is None or time.monotonic() - seen[0] > host_timeout():
        _SILENT.pop((host.address, host.port), None)
        return None
    return seen[1]


def stopped_answering(host: Host, why: str) -> str:
    return f"host {host.name} ({host.address}) stopped answering: {why}"


class _Watched(socket.socket):
    """A TCP socket that remembers why it failed (paramiko's reader turns errors into EOF)."""

    error: OSError | None = None

    def _note(self, e: OSError) -> None:
        if e.errno is not None:  # not one of paramiko's polling timeouts
            self.error = e

    def recv(self, *args):
        try:
            return super().recv(*args)
        except OSError as e:
            self._note(e)
            raise

    def send(self, *args):
        try:
            return super().send(*args)
        except OSError as e:
            self._note(e)
            raise


def _dial(host: Host) -> _Watched:
    last: OSError = OSError(f"no address for {host.address}")
    for family, kind, proto, _, addr in socket.getaddrinfo(host.address, host.port, type=socket.SOCK_STREAM):
        sock = _Watched(family, kind, proto)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(addr)
            return sock
        except OSError as e:
            sock.close()
            last = e
    raise last


def _watch_silence(client) -> None:
    """Keepalives, and a connection whose data stays unacknowledged for the host timeout is
    dropped by the kernel (the transport then ends and every channel with it)."""
    limit = host_timeout()
    transport = client.get_transport()
    transport.set_keepalive(max(1, min(5, int(limit / 3))))
    sock = transport.sock
    if isinstance(sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(limit * 1000))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(limit / 3)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, int(limit / 3)))


def remote_line(argv: Sequence[str]) -> str:
    """The one line the remote shell gets: ``exec`` and every word quoted."""
    if not argv:
        raise ValueError("empty command")
    return "exec " + " ".join(shlex.quote(str(a)) for a in argv)


def _known_hosts(host: Host) -> Path:
    return Path(os.path.expanduser(host.known_hosts or "~/.ssh/known_hosts"))


def _key_name(host: Host) -> str:
    """How known_hosts names the host (OpenSSH: ``[addr]:port`` unless the port is 22)."""
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


def connect(host: Host):
    """An authenticated paramiko SSHClient to ``host``; a TestbedError naming the host
    and what to do when the key is unknown or changed, login fails or it is unreachable."""
    try:
        import paramiko
    except ImportError:
        raise TestbedError(f"host {host.name}: reaching other hosts needs paramiko",
                           "pip install 'testbed[ssh]' (or: pip install paramiko)") from None
    where = f"host {host.name} ({host.user}@{host.address}:{host.port})"
    if (why := _still_silent(host)) is not None:
        raise StateError(stopped_answering(host, why), "once it answers again, run the command again")
    kh = _known_hosts(host)
    client = paramiko.SSHClient()
    try:
        for f, kind, what in ((kh, "known_hosts", "known_hosts file"),
                              (Path("/etc/ssh/ssh_known_hosts"), "known_hosts", "known_hosts file")):
            if f.exists():
                check_regular(f, kind, f"{where}: {what}")
        if host.key and os.path.exists(os.path.expanduser(host.key)):
            check_regular(Path(os.path.expanduser(host.key)), "key", f"{where}: key file")
        if kh.exists():
            client.load_host_keys(str(kh))  # also where an accepted new key is saved
        elif host.known_hosts is not None and not host.accept_new_host_key:
            raise StateError(f"{where}: known_hosts file {kh} does not exist",
                             f"create it with the host's key (ssh-keyscan -p {host.port} {host.address} > {kh}, "
                             "then compare the fingerprint with the host's own), or fix known_hosts:")
        elif host.known_hosts is None:
            try:
                client.load_system_host_keys()  # ~/.ssh/known_hosts when it exists
            except OSError:
                pass
        system = Path("/etc/ssh/ssh_known_hosts")
        if host.known_hosts is None and system.exists():
            client.get_host_keys().load(str(system))  # read-only: load_host_keys would save there
    except (OSError, paramiko.SSHException) as e:
        raise StateError(f"{where}: cannot read known_hosts {kh}: {e}") from None
    if host.accept_new_host_key:
        kh.parent.mkdir(parents=True, exist_ok=True)
        if not kh.exists():
            kh.touch(mode=0o600)
            client.load_host_keys(str(kh))
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # saved to kh: load_host_keys set it
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    key = os.path.expanduser(host.key) if host.key else None
    if key is not None and not os.path.isfile(key):
        raise StateError(f"{where}: key file {key} does not exist", "fix hosts[].key: in the topology")
    try:
        client.connect(host.address, port=host.port, username=host.user, key_filename=key, sock=_dial(host),
                       look_for_keys=key is None, allow_agent=key is None, timeout=CONNECT_TIMEOUT,
                       banner_timeout=CONNECT_TIMEOUT, auth_timeout=CONNECT_TIMEOUT)
    except paramiko.BadHostKeyException as e:
        client.close()
        raise StateError(
            f"{where}: its host key has CHANGED: it offers {e.key.get_name()} {e.key.fingerprint}, "
            f"but {kh} has {e.expected_key.fingerprint}; refusing to connect (this could be an attack)",
            f"if the host was really reinstalled, remove the old key (ssh-keygen -f {kh} -R '{_key_name(host)}') "
            "and add the new one after checking its fingerprint") from None
    except paramiko.AuthenticationException as e:
        client.close()
        raise StateError(f"{where}: login refused ({e})",
                         "give hosts[].key: a private key whose public half is in the host's authorized_keys") from None
    except paramiko.SSHException as e:
        client.close()
        if "not found in known_hosts" in str(e):
            raise StateError(f"{where}: its host key is not in {kh}; refusing an unknown host",
                             f"add it after checking its fingerprint (ssh-keyscan -p {host.port} {host.address} >> {kh}), "
                             "or set accept_new_host_key: true on the host to trust it on first use") from None
        raise StateError(f"{where}: SSH failed: {e}") from None
    except (OSError, socket.timeout, EOFError) as e:
        client.close()
        if isinstance(e, (socket.timeout, TimeoutError)):
            silent(host, f"no answer to a connection within {CONNECT_TIMEOUT:g} s")
        raise StateError(f"{where}: unreachable: {e or type(e).__name__}",
                         "check address:, port: and that sshd runs there") from None
    _watch_silence(client)
    return client


def run(client, argv: Sequence[str], stdin: bytes = b"", timeout: float | None = 600.0) -> tuple[int, bytes, bytes]:
    """Run ``argv`` on the host (no shell interpretation); returns (status, stdout, stderr).

    Status -1: the connection died or ``timeout`` passed before the command ended."""
    import paramiko

    transport = client.get_transport()
    if transport is None or not transport.is_active():
        return -1, b"", b""
    try:
        chan = transport.open_session(timeout=CONNECT_TIMEOUT)
    except (paramiko.SSHException, OSError, EOFError):
        return -1, b"", b""
    out, err = bytearray(), bytearray()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        chan.exec_command(remote_line(argv))
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        while True:
            got = False
            if chan.recv_ready():
                out += chan.recv(65536)
                got = True
            if chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
                got = True
            if got:
                continue
            if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                return chan.recv_exit_status(), bytes(out), bytes(err)
            if chan.closed or not client.get_transport().is_active():
                return -1, bytes(out), bytes(err)
            if deadline is not None and time.monotonic() > deadline:
                return -1, bytes(out), bytes(err)
            select.select([chan], [], [], 0.02)
    finally:
        chan.close()


class Remote:
    """One host's ``testbed _host`` commands, over one SSH connection (opened lazily)."""

    def __init__(self, host: Host):
        self.host = host
        self._client = None
        self._lock = threading.Lock()

    def client(self):
        with self._lock:
            if self._client is None:
                self._client = connect(self.host)
            return self._client

    def open_sftp(self):
        """An SFTP session with the host, for a run's files. An ordinary user's run
        directories there are in their rootless namespaces (a private tmpfs), which sshd's
        SFTP subsystem does not see: theirs is ``testbed _host sftp``, the host's SFTP
        server started inside them."""
        import paramiko

        client = self.client()
        if not rootless.active():
            return client.open_sftp()
        chan = client.get_transport().open_session(timeout=CONNECT_TIMEOUT)
        chan.exec_command(remote_line([self.host.testbed, "_host", f"--controller={__version__}", "sftp"]))
        return paramiko.SFTPClient(chan)

    def call(self, op: str, *args: str, payload: object = None, timeout: float | None = 600.0) -> dict:
        """``testbed _host OP ARGS`` there with ``payload`` as JSON on stdin; its JSON
        answer, or its error re-raised as a TestbedError naming the host."""
        argv = [self.host.testbed, "_host", f"--controller={__version__}", op, *args]
        data = json.dumps(payload).encode() if payload is not None else b""
        status, out, err = run(self.client(), argv, data, timeout)
        try:
            answer = json.loads(out.decode() or "null")
        except (UnicodeDecodeError, json.JSONDecodeError):
            answer = None
        if status == 0 and isinstance(answer, dict):
            return answer
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            raise TestbedError(f"host {self.host.name}: {answer['error']}", answer.get("hint"))
        tail = (err or out).decode(errors="replace").strip()[-600:]
        if status == 127 or "not found" in tail and self.host.testbed in tail:
            raise StateError(f"host {self.host.name}: the testbed program {self.host.testbed!r} is not there",
                             "install testbed on that host (the same version) or set hosts[].testbed: to its path")
        if status == -1 and (lost := self._lost()) is not None:
            raise StateError(f"{stopped_answering(self.host, lost)} (while `testbed _host {op}` ran there)",
                             "once it answers again, run the command again")
        what = f"did not end within {timeout or 0:g} s" if status == -1 else f"exit {status}"
        raise TestbedError(f"host {self.host.name}: `testbed _host {op}` failed ({what}): {tail or 'no output'}")

    def failure(self, doing: str, error: BaseException) -> TestbedError:
        """The error to raise for ``error`` met while ``doing`` something there: the host
        stopped answering, or what went wrong."""
        lost = self._lost()
        if lost is not None:
            return StateError(f"{stopped_answering(self.host, lost)} (while {doing})",
                              "once it answers again, run the command again")
        return TestbedError(f"host {self.host.name}: {doing} failed: {error}")

    def _lost(self) -> str | None:
        """Why the connection ended, if it did (the host is then remembered as silent)."""
        with self._lock:
            client = self._client
        transport = client.get_transport() if client is not None else None
        if transport is not None and transport.is_active():
            return None
        with self._lock:
            if self._client is client:
                self._client = None
        cause = getattr(transport.sock, "error", None) if transport is not None else None
        why = f"the connection was lost ({cause.strerror if cause is not None else 'closed by the host'})"
        if cause is not None and cause.errno == errno.ETIMEDOUT:
            why = f"nothing was acknowledged for {host_timeout():g} s, so the connection was dropped"
        silent(self.host, why)
        if client is not None:
            client.close()
        return why

    def require_root(self) -> None:
        """Refuse a login that is not root there (before running testbed with it)."""
        status, out, err = run(self.client(), ["id", "-u"], timeout=60)
        uid = out.decode(errors="replace").strip()
        if status != 0 or not is_ascii_int(uid, 10):
            raise StateError(f"host {self.host.name}: `id -u` failed: {(err or out).decode(errors='replace')[-300:]}")
        if uid != "0":
            raise StateError(f"host {self.host.name}: user {self.host.user} is uid {uid} there, not root",
                             "testbed makes namespaces and qdiscs there: log in as root (hosts[].user: root)")

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
