"""A run's zygote, the launcher's side: one fork server per run that has imported torch, so
that the ranks of netns workers on this host start without importing it each.

Without it every rank's ``python -m workloads.train`` imports torch (about 2.5 s of CPU on
the 2-core development machine: a 32-rank run spent most of its 131 s of CPU on it). With
it, :class:`testbed.runs.launch.Launcher` starts the zygote
(:mod:`testbed.nodes.zygote.server`) before the ranks, and each rank's command, unchanged
up to the final Python (``nsexec NETNS --cwd DIR --cgroup PATH -- python -P -m ...``), runs
the small client :mod:`testbed.nodes.zygote.client` in place of the workload: inside the
node it hands its namespaces, cgroup, directory, stdio and environment to the zygote, which
forks the rank into them. Whatever fails before the fork, the client starts the rank
itself as before; so a run never depends on the zygote.

Used only for built-in workloads (``workloads.*`` but the user's code's runner) and at
least :data:`MIN_RANKS` ranks of netns workers on this host; the user's code, containers,
VMs and other hosts keep the plain start. ``TESTBED_ZYGOTE=0`` in ``testbed run``'s
environment turns it off.

The zygote gets the environment every rank shares (the variables torch and its libraries
read when they load, OMP_NUM_THREADS and TORCH_FR_BUFFER_SIZE among them, have one value per
run); each rank gets its own environment back after the fork. The listening socket is
bound here, in the run directory (private to the user, held open by the launcher), before
the zygote starts, so ranks that connect while it still imports wait in the backlog; each
client checks that the socket's listener is the run's own process and the user's before it
hands anything over (:mod:`testbed.nodes.zygote.client`). Its log is ``zygote.log`` there.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from testbed.common import procs
from testbed.common.outdir import OutDir
from testbed.nodes.zygote.client import SOCKET_ENV, address

ENV = "TESTBED_ZYGOTE"
"""``0`` (or ``no``, ``off``, ``false``) in the launcher's environment: no zygote."""
CLIENT = "testbed.nodes.zygote.client"
SERVER = "testbed.nodes.zygote.server"
MIN_RANKS = 2
"""A single rank gains nothing: it would wait for the zygote's import instead of its own."""
BACKLOG = 256
STOP_GRACE_S = 3.0


def enabled(env: dict | None = None) -> bool:
    value = (os.environ if env is None else env).get(ENV, "1").strip().lower()
    return value not in ("0", "no", "off", "false")


def serves(module: str) -> bool:
    """The workload modules a zygote runs: testbed's own (the user's code starts as before)."""
    return module.startswith("workloads.") and module != "workloads.userscript"


def common_env(envs: Sequence[dict[str, str]]) -> dict[str, str]:
    """The variables every environment has with the same value."""
    if not envs:
        return {}
    first, rest = envs[0], envs[1:]
    return {k: v for k, v in first.items() if all(e.get(k) == v for e in rest)}


class Zygote:
    """One run's zygote: :meth:`client` rewrites a rank's command, :meth:`start` starts the
    server for those ranks, :meth:`stop` ends it (and any rank still forked from it)."""

    def __init__(self, run_dir: Path, module: str):
        self.module = module
        self.socket = str(run_dir.resolve() / "zygote.sock")
        self.log = run_dir / "zygote.log"
        self.proc: subprocess.Popen | None = None
        self._logged = 0

    def progressed(self) -> bool:
        """Its log grew since last asked (it finished its imports, forked or reaped a rank):
        the ranks' start is under way, which the launcher's no-progress timeout counts (a
        rank that imported torch itself made its progress meanwhile too)."""
        try:
            size = self.log.stat().st_size
        except OSError:
            return False
        grew, self._logged = size != self._logged, size
        return grew

    def client(self, argv: Sequence[str], env: dict[str, str]) -> list[str]:
        """The rank's argv (MODULE ARGS) through the client; ``env`` learns the socket."""
        env[SOCKET_ENV] = self.socket
        return [CLIENT, *argv]

    def start(self, envs: Sequence[dict[str, str]], die_with: dict[str, str], held: OutDir | None = None) -> None:
        """Bind the socket and start the server with what ``envs`` (the clients' rank
        environments) share, plus ``die_with`` (TESTBED_DIE_WITH_PARENT). ``held``: the run
        directory, held open by the launcher: the socket and the log are made in that very
        directory, whatever its path names by now. A zygote that cannot start leaves no
        socket: its clients start their ranks themselves."""
        env = common_env(envs)
        env.pop(SOCKET_ENV, None)
        env.update(die_with)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if held is not None:
                where, dirfd = f"/proc/self/fd/{held.fd}/{os.path.basename(self.socket)}", None
            else:
                where, dirfd = address(self.socket)
            try:
                listener.bind(where)  # its peers see this process (SO_PEERCRED): the clients check it
            finally:
                if dirfd is not None:
                    os.close(dirfd)
            listener.listen(BACKLOG)
            with held.open_log(self.log.name) if held is not None else open(self.log, "wb") as f:
                self.proc = subprocess.Popen(procs.python_argv(SERVER, "--fd", str(listener.fileno()), self.module),
                                             env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                             pass_fds=(listener.fileno(),), start_new_session=True)
        except OSError:
            self._unlink()
        finally:
            listener.close()

    def stop(self) -> None:
        """SIGTERM (it kills its ranks and exits), SIGKILL after a grace period; the socket goes."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._unlink()

    def _unlink(self) -> None:
        try:
            os.unlink(self.socket)
        except OSError:
            pass
