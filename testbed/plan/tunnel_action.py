"""One end of a ``tunnel`` link (:class:`testbed.plan.links.Tunnel`): the forwarder that copies
frames between the link's tunnel-side veth end and a UDP socket on this host's underlay
(:mod:`testbed.net.tunnel`, ``docs/tunnel.md``).

The forwarder is a host process: started here with its UDP socket bound in the host's
network namespace (where the agent or the command runs), it then enters the node's (or the
switches') network namespace for its packet socket. The link's token reaches it on its stdin,
never on its command line (which every user can read in ``/proc``). It is found again by
its ``--tunnel-id=`` argument; it also goes with its namespace (teardown stops every process
in a namespace the testbed made), and in rootless mode with the user's namespaces.
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from testbed.common import procs
from testbed.common.errors import TestbedError
from testbed.common.files import tail_text
from testbed.plan.actions import _MarkedProcess
from testbed.plan.base import ApplyContext, register
from testbed.plan.ledger import Ledger

TUNNEL_MARKER = re.compile(r"--tunnel-id=[0-9a-f]{32}")
START_TIMEOUT_S = 30.0
GSO_MAX_SIZE = 60000
"""The link ends' ``gso_max_size``: a GSO frame, its vnet header and the tunnel's header and tag
fit one UDP datagram (``docs/tunnel.md``, "Datagram size")."""


@register
@dataclass(frozen=True)
class StartTunnel(_MarkedProcess):
    """A tunnel forwarder for link ``link``'s end in ``ns`` (its veth end ``ifname``), its UDP
    socket on ``local``:``port``, connected to the peer forwarder on ``remote``:``peer_port``."""

    ns: str = ""
    ifname: str = ""
    local: str = ""
    port: int = 0
    remote: str = ""
    peer_port: int = 0
    token: str = ""
    """The link's token in hex (the same at both ends); kept in the private ledger."""
    link: int = -1
    FORM: ClassVar[re.Pattern] = TUNNEL_MARKER
    NOUN: ClassVar[str] = "tunnel forwarder"
    WRITTEN: ClassVar[str] = "--tunnel-id=<32 hex digits>"

    def describe(self) -> str:  # never the token
        return (f"[{self.ns}] tunnel forwarder on {self.ifname}: udp {self.local}:{self.port} -> "
                f"{self.remote}:{self.peer_port}  (links[{self.link}])")

    def apply(self, ctx: ApplyContext) -> None:
        from testbed.net import netns

        if not self.valid():
            raise TestbedError(f"tunnel marker {self.marker!r} is not {self.WRITTEN}")
        log = Ledger(ctx.testbed).dir / f"tunnel-{self.link}-{self.ifname}.log"
        argv = procs.python_argv("testbed.net.tunnel", "--ifname", self.ifname, "--bind", f"{self.local}:{self.port}",
                                 "--peer", f"{self.remote}:{self.peer_port}", "--netns", str(netns.path(self.ns)),
                                 self.marker)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd,
                                    start_new_session=True, cwd="/")
        finally:
            os.close(fd)
        try:
            assert proc.stdin is not None
            proc.stdin.write(self.token.encode() + b"\n")
            proc.stdin.close()
            self._await_ready(proc, log)
        except BaseException:
            proc.kill()
            proc.wait()
            raise

    def _await_ready(self, proc: subprocess.Popen, log: Path) -> None:
        """Until the forwarder prints ``ready``; its error (port taken, no such interface) otherwise."""
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        out = b""
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while b"ready\n" not in out:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TestbedError(f"the tunnel forwarder of links[{self.link}] did not start within "
                                       f"{START_TIMEOUT_S:g} s", f"see {log}")
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    proc.wait()
                    raise TestbedError(self._failure(tail_text(log).strip()[-400:]), f"see {log}")
                out += chunk
        finally:
            sel.close()
            proc.stdout.close()

    def _failure(self, why: str) -> str:
        at = f"udp {self.local}:{self.port}"
        if "in use" in why:
            return (f"the tunnel of links[{self.link}] cannot bind {at}: the port is in use (the ports of a "
                    "testbed's tunnels derive from its name and your uid: tunnel.port in the topology moves them)")
        return f"the tunnel forwarder of links[{self.link}] ({at}) failed: {why or 'no output'}"
