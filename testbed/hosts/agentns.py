"""What a controller starts on another host as an ordinary user (``testbed _host``, the Slurm
file step) works in that user's rootless namespaces there: the share's namespaces, veths and
tunnel forwarders live in the user's holder on that host, and its state directory is the
one in the holder's private tmpfs (:mod:`testbed.common.rootless`).

Entered before any thread starts; the agent stays in the host's network namespace, where
its tunnels' UDP sockets and its exporter belong. BASE is the host's own
(:func:`testbed.common.rootless.use_host_base`: a home directory shared by the nodes of a
cluster must not give two nodes one holder). The process that enters waits for the one
inside and gets SIGTERM when its own parent (sshd's session, Slurm's step) ends.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Callable

from testbed.common import procs, rootless
from testbed.common.errors import StateError
from testbed.common.signals import ignore_interrupts
from testbed.plan.ledger import Ledger


def enter() -> bool:
    """Join the user's rootless namespaces on this host if this is an ordinary user's agent
    (root's works in the host's own); whether it did. RootlessError when it cannot."""
    if not rootless.needed():
        return False
    procs.die_with_parent(signal.SIGTERM)
    rootless.use_host_base()
    rootless.prune_job_bases()  # this node's folders of ended jobs
    rootless.enter(spawner=False)
    return True


def leave(entered: bool) -> None:
    """At the agent's end: the holder stops when no testbed is left up on this host."""
    if entered:
        rootless.release(busy=bool(Ledger.all_names()))


HOLD_POLL_S = 0.5


def hold(name: str, on_end: Callable[[], object] | None = None) -> int:
    """``testbed _host apply NAME --hold``: after answering, stay while the share is up here.
    A Slurm step ends every process it started when its first one exits, so the share's
    processes (tunnel forwarders, the exporter, an ordinary user's namespace holder) live as
    long as this: until ``down`` removed the share (its ledger), or the job ended.

    The job's end (``scancel``, its time limit) sends SIGTERM to every process of every
    step, then SIGKILL ``KillWait`` later (30 s by default): on SIGTERM or SIGHUP this
    removes the share first with ``on_end`` (``testbed down`` of the share, as root: its
    namespaces and ledger are no process, and would outlive the job), and returns 0 if that
    went well. An ordinary user's share goes with their holder anyway."""
    os.close(0)  # the request was read; nothing more comes
    ended: list[int] = []
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)  # a signal ends the wait below at once
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: ended.append(signum))
    missing = 0
    while missing < 2 and not ended:  # gone at two looks in a row: the share was removed
        if select.select([wake_r], [], [], HOLD_POLL_S)[0]:
            os.read(wake_r, 512)  # emptied, so that it waits again
        missing = 0 if Ledger(name).exists() else missing + 1
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:  # a forwarder `down` stopped: no zombie
                pass
        except ChildProcessError:
            pass
    if not ended or on_end is None or not Ledger(name).exists():  # `down` removed it already
        return 0
    ignore_interrupts((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))  # the teardown must finish
    try:
        on_end()
    except Exception as e:  # the job is ending: say why, nobody else will
        sys.stderr.write(f"error: removing testbed '{name}' at the job's end (signal {ended[0]}): {e}\n")
        return 1
    return 0


SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/lib/ssh/sftp-server",
                "/usr/libexec/sftp-server")


def sftp() -> int:
    """``testbed _host sftp``: become the host's SFTP server on this connection, where this
    agent works (an ordinary user's rootless namespaces, whose run directories sshd's own
    SFTP subsystem cannot see: they are on the holder's private tmpfs)."""
    for server in SFTP_SERVERS:
        if os.access(server, os.X_OK):
            os.execv(server, [server])
    raise StateError("no SFTP server on this host (looked for " + ", ".join(SFTP_SERVERS) + ")",
                     "install openssh-server (its sftp-server) on this host")
