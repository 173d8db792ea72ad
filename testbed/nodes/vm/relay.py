"""Run a command inside a VM worker's guest (no shell ever sees it).

``python -m testbed.nodes.vm.relay NETNS --dir VMDIR [--node NAME] [--hang-timeout S] [--mount DIR]... [--cwd DIR] [--op exec|stop|ping] -- CMD...``

Joins the node's network namespace NETNS on the host (where QEMU forwards the guest
agent's port to 127.0.0.1), connects to the agent of the VM whose state directory is
VMDIR (its token and port are there) and relays: this process's environment, stdin and
SIGTERM/SIGINT/SIGHUP go to the command; its stdout, stderr and exit status come back
(a command killed by signal N ends this process by N too). If this process dies, the
agent kills the command (the connection's end is the signal), so ``TESTBED_DIE_WITH_PARENT``
works as with :mod:`testbed.nodes.nsexec`.

A guest that hangs (its QEMU stopped, its kernel wedged) keeps the connection open and
silent: with ``--hang-timeout S`` the agent sends a heartbeat every few seconds while the
command runs, and after S seconds without a single frame this process gives up with one
line naming the node (``--node``) and, when the host can tell, why (QEMU stopped or gone),
exit status 255 like a lost connection. 0 waits for ever.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from testbed.nodes.vm import agent as wire
from testbed.common.errors import TestbedError
from testbed.common.files import read_json, read_text
from testbed.nodes.nsexec import _die_with_parent, die_like
from testbed.nodes.vm.qemu import HANG_ENV, qemu_trouble

EXIT_LOST = 255


def _fail(msg: str, code: int = 1) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def connect(netns_name: str, vmdir: Path, timeout: float | None = 10.0) -> tuple[socket.socket, str]:
    """A connection to the agent (made inside NETNS, on the namespace thread) and the token."""
    from testbed.net import netns

    cfg = read_json(vmdir / "agent.json", "json", "VM agent file")
    token = read_text(Path(cfg["token_file"]), "key", "VM agent token").strip()
    return netns.call_in(netns_name, socket.create_connection, ("127.0.0.1", int(cfg["port"])), timeout), token


def request(netns_name: str, vmdir: Path, op: str, timeout: float = 10.0) -> str:
    """One short request (``ping``, ``stop``); its answer, or OSError/RuntimeError."""
    sock, token = connect(netns_name, vmdir, timeout)
    with sock:
        wire.send(sock, wire.REQUEST, json.dumps({"token": token, "op": op}).encode())
        frame = wire.recv(sock)
    if frame is None:
        raise ConnectionError("the agent closed the connection")
    kind, data = frame
    if kind == wire.ERROR:
        raise RuntimeError(data.decode(errors="replace"))
    return data.decode()


def heartbeat_every(hang: float) -> float:
    """How often the agent is asked for a heartbeat, for a hang timeout of ``hang`` s."""
    return max(0.1, min(2.0, hang / 5))


def run(netns_name: str, vmdir: Path, argv: list[str], mounts: list[str], cwd: str | None,
        node: str | None = None, hang: float = 0.0) -> int:
    try:
        sock, token = connect(netns_name, vmdir)
    except (OSError, ValueError, KeyError, TestbedError) as e:
        return _fail(f"cannot reach the agent of the VM in {netns_name}: {e}", EXIT_LOST)
    sock.settimeout(None)
    env = {k: v for k, v in os.environ.items() if k != "TESTBED_DIE_WITH_PARENT"}
    req: dict[str, object] = {"token": token, "op": "exec", "argv": argv, "env": env, "mounts": mounts, "cwd": cwd}
    if hang > 0:
        req["heartbeat"] = heartbeat_every(hang)
    wire.send(sock, wire.REQUEST, json.dumps(req).encode())
    lock = threading.Lock()

    def forward(signum, frame):
        try:
            wire.send(sock, wire.SIGNAL, str(signum).encode(), lock)
        except OSError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)

    def stdin():
        try:
            while True:
                data = os.read(0, 65536)
                if not data:
                    break
                wire.send(sock, wire.STDIN, data, lock)
            wire.send(sock, wire.STDIN_EOF, b"", lock)
        except OSError:
            pass

    threading.Thread(target=stdin, daemon=True).start()
    return _relay_output(sock, netns_name, node or netns_name, hang)


def _relay_output(sock: socket.socket, netns_name: str, node: str, hang: float) -> int:
    """The command's output and exit status, from the agent's frames."""
    while True:
        try:
            frame = wire.recv(sock, idle=hang if hang > 0 else None)
        except TimeoutError:
            return _fail(_hung(netns_name, node, hang), EXIT_LOST)
        except (OSError, ValueError):
            frame = None
        if frame is None:
            return _fail(f"lost the connection to the VM in {netns_name} (did the VM stop?)", EXIT_LOST)
        kind, data = frame
        if kind == wire.STDOUT:
            os.write(1, data)
        elif kind == wire.STDERR:
            os.write(2, data)
        elif kind == wire.ERROR:
            return _fail(data.decode(errors="replace"), 127)
        elif kind == wire.EXIT:
            rc = int(data)
            return die_like(-rc) if rc < 0 else rc


def _hung(netns_name: str, node: str, hang: float) -> str:
    """One line: the guest of ``node`` stopped answering, and why when the host can tell."""
    why = qemu_trouble(netns_name)
    return (f"node {node}: its VM is not answering: no word from its guest agent for {hang:g} s"
            f"{f' and {why}' if why else ''}; gave up the command there ({HANG_ENV}=SECONDS waits longer)")


def main(argv: list[str]) -> int:

    if "--" not in argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m testbed.nodes.vm.relay")
    p.add_argument("netns")
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--node")
    p.add_argument("--hang-timeout", type=float, default=0.0)
    p.add_argument("--mount", action="append", default=[])
    p.add_argument("--cwd")
    p.add_argument("--op", choices=("exec", "stop", "ping"), default="exec")
    a = p.parse_args(argv[:cut])
    cmd = argv[cut + 1:]
    gone = _die_with_parent()
    if gone is not None:
        return gone
    if a.op != "exec":
        try:
            print(request(a.netns, a.dir, a.op))
            return 0
        except (OSError, RuntimeError, ValueError, KeyError, TestbedError) as e:
            return _fail(f"{a.op}: {e}")
    if not cmd:
        return _fail("give the command after --", 2)
    return run(a.netns, a.dir, cmd, a.mount, a.cwd, a.node, a.hang_timeout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
