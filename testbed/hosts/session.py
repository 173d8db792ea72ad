"""One long-lived ``testbed _host serve NAME`` per host and testbed, for the requests a
controller repeats (the run's 1 Hz counter reads, ``link show``, each step of a trace on a
cross-host link): each is one JSON line each way on an SSH channel kept open, instead of a
new session and a Python start on that host per request (:mod:`testbed.engine.hostserve`;
the lag of both is measured by ``benchmarks/remote_lag.py``)."""

from __future__ import annotations

import socket
import threading

from testbed.hosts.answer import parse_answer
from testbed.common import lines
from testbed.common.errors import TestbedError
from testbed.common.version import __version__
from testbed.hosts.ssh.client import Remote, remote_line


class AgentSession:
    """Requests to testbed ``name``'s agent on ``remote``'s host, one at a time."""

    def __init__(self, remote: Remote, name: str):
        self.remote, self.name = remote, name
        self._chan = None
        self._reader = None
        self._lock = threading.Lock()

    def ask(self, op: str, payload: object = None, timeout: float = 60.0) -> dict:
        """The agent's answer to ``op``; its error re-raised naming the host; a host that
        stopped answering (or an agent that ended) as :meth:`Remote.failure` says."""
        import paramiko

        line = lines.encode({"op": op, "payload": payload})
        with self._lock:
            try:
                chan = self._open()
                chan.settimeout(timeout)
                chan.sendall(line)
                try:
                    got = lines.read_line(self._reader)
                except EOFError as e:
                    raise EOFError(f"the agent ended ({self._ended()})" if str(e) == lines.ENDED else str(e)) \
                        from None
            except (OSError, EOFError, paramiko.SSHException) as e:  # socket.timeout is an OSError
                self._drop()
                if isinstance(e, socket.timeout):
                    raise TestbedError(f"host {self.remote.host.name}: `testbed _host serve` gave no answer to "
                                       f"{op} within {timeout:g} s") from None
                raise self.remote.failure(f"asking its agent for {op}", e) from None
        return parse_answer(self.remote.host.name, op, got)

    def _open(self):
        if self._chan is None:
            host = self.remote.host
            chan = self.remote.client().get_transport().open_session(timeout=15)
            chan.exec_command(remote_line([host.testbed, "_host", f"--controller={__version__}", "serve", self.name]))
            self._chan, self._reader = chan, chan.makefile("rb")
        return self._chan

    def _ended(self) -> str:
        chan = self._chan
        if chan is None or not chan.exit_status_ready():
            return "no exit status"
        err = chan.recv_stderr(4096).decode(errors="replace").strip() if chan.recv_stderr_ready() else ""
        return f"exit {chan.recv_exit_status()}" + (f": {err[-300:]}" if err else "")

    def _drop(self) -> None:
        if self._chan is not None:
            try:
                self._chan.close()
            except Exception:
                pass
        self._chan = self._reader = None

    def close(self) -> None:
        with self._lock:
            self._drop()
