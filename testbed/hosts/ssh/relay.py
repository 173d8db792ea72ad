"""Run a command in a node on another host, as if it were local (the remote counterpart of
:mod:`testbed.nodes.nsexec`).

``python -m testbed.hosts.ssh.relay --host JSON --testbed NAME --node NODE -- CMD [ARGS...]``

Connects to the host over SSH (host key verified, :mod:`testbed.hosts.ssh.client`), runs
``testbed _host exec NAME NODE -- CMD...`` there, and relays stdin, stdout, stderr and
the exit status. SIGTERM, SIGINT or SIGHUP here closes the connection: the remote side
(PR_SET_PDEATHSIG) then stops the command. With ``TESTBED_DIE_WITH_PARENT`` this process
dies with its parent, and the connection with it, so a killed ``testbed run`` stops its
remote ranks too.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from testbed.common.errors import TestbedError
from testbed.common.version import __version__
from testbed.hosts.ssh.client import connect, remote_line
from testbed.model.topology import TopologyError, host_from_json
from testbed.nodes.nsexec import _die_with_parent


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m testbed.hosts.ssh.relay")
    p.add_argument("--host", required=True)
    p.add_argument("--testbed", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--remote-opt", action="append", default=[],
                   help="an option for `testbed _host exec` there (--python, --run=ID, --env=K=V, --mount=DIR)")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    a.cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not a.cmd:
        p.error("no command")
    if any(not o.startswith(("--python", "--run=", "--env=", "--mount=")) or o == "--" for o in a.remote_opt):
        p.error(f"bad --remote-opt in {a.remote_opt!r}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    if (code := _die_with_parent()) is not None:
        return code
    try:
        host = host_from_json(a.host)
    except TopologyError as e:
        print(f"error: bad --host: {e}", file=sys.stderr)
        return 2
    try:
        client = connect(host)
    except TestbedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 255
    chan = client.get_transport().open_session()
    _close_on_signals(client)
    chan.exec_command(remote_line([host.testbed, "_host", f"--controller={__version__}", "exec", a.testbed, a.node,
                                   *a.remote_opt, "--", *a.cmd]))
    status = _relay(chan)
    client.close()
    if status == -1:
        print(f"error: lost the connection to host {host.name}", file=sys.stderr)
        return 255
    return status


def _close_on_signals(client) -> None:
    """SIGTERM, SIGINT or SIGHUP close the connection: the remote side's parent (sshd's
    session) ends, and it stops the command."""
    def stop(signum, frame):
        client.close()
        os._exit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, stop)


def _relay(chan) -> int:
    """Our stdin to the channel, its stdout and stderr to ours; returns its exit status."""
    threading.Thread(target=_pump_stdin, args=(chan,), daemon=True).start()
    t_err = threading.Thread(target=_pump_stderr, args=(chan,), daemon=True)
    t_err.start()
    while True:
        data = chan.recv(65536)
        if not data:
            break
        try:
            os.write(1, data)
        except BrokenPipeError:
            break
    t_err.join(5)
    return chan.recv_exit_status()


def _pump_stdin(chan) -> None:
    try:
        while True:
            data = os.read(0, 65536)
            if not data:
                break
            chan.sendall(data)
    except OSError:
        pass
    try:
        chan.shutdown_write()
    except Exception:
        pass


def _pump_stderr(chan) -> None:
    while True:
        data = chan.recv_stderr(65536)
        if not data:
            break
        os.write(2, data)


if __name__ == "__main__":
    sys.exit(main())
