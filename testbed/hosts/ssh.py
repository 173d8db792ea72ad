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
"""

from __future__ import annotations

import json
import os
import select
import shlex
import socket
import threading
from pathlib import Path
from typing import Sequence

from testbed.common.errors import StateError, TestbedError
from testbed.common.files import check_regular
from testbed.model.topology import Host

CONNECT_TIMEOUT = 15.0


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
        client.connect(host.address, port=host.port, username=host.user, key_filename=key,
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
        raise StateError(f"{where}: unreachable: {e or type(e).__name__}",
                         "check address:, port: and that sshd runs there") from None
    client.get_transport().set_keepalive(5)
    return client


def run(client, argv: Sequence[str], stdin: bytes = b"", timeout: float | None = 600.0) -> tuple[int, bytes, bytes]:
    """Run ``argv`` on the host (no shell interpretation); returns (status, stdout, stderr).

    Status -1: the connection died or ``timeout`` passed before the command ended."""
    import time

    chan = client.get_transport().open_session(timeout=CONNECT_TIMEOUT)
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

    def call(self, op: str, *args: str, payload: object = None, timeout: float | None = 600.0) -> dict:
        """``testbed _host OP ARGS`` there with ``payload`` as JSON on stdin; its JSON
        answer, or its error re-raised as a TestbedError naming the host."""
        argv = [self.host.testbed, "_host", op, *args]
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
        what = "timed out or lost the connection" if status == -1 else f"exit {status}"
        raise TestbedError(f"host {self.host.name}: `testbed _host {op}` failed ({what}): {tail or 'no output'}")

    def require_root(self) -> None:
        """Refuse a login that is not root there (before running testbed with it)."""
        status, out, err = run(self.client(), ["id", "-u"], timeout=60)
        uid = out.decode(errors="replace").strip()
        if status != 0 or not uid.isdigit():
            raise StateError(f"host {self.host.name}: `id -u` failed: {(err or out).decode(errors='replace')[-300:]}")
        if uid != "0":
            raise StateError(f"host {self.host.name}: user {self.host.user} is uid {uid} there, not root",
                             "testbed makes namespaces and qdiscs there: log in as root (hosts[].user: root)")

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
