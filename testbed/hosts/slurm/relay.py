"""Run a rank's step on a node of the Slurm job, bound to the launcher's life (the Slurm
counterpart of :mod:`testbed.hosts.ssh.relay`).

``python -m testbed.hosts.slurm.relay srun ARGS... -- testbed _host exec NAME NODE -- CMD...``

With ``TESTBED_DIE_WITH_PARENT`` this process asks for SIGTERM when its parent dies, then
becomes ``srun`` (exec keeps that request): a killed ``testbed run`` makes ``srun`` cancel
the step, which ends the rank on its node. ``srun`` relays stdin, stdout, stderr and the
exit status; SIGTERM or SIGINT to it is forwarded to the step's task.
"""

from __future__ import annotations

import os
import signal
import sys

from testbed.common import outside, rootless
from testbed.nodes.nsexec import DIE_WITH_PARENT, PR_SET_PDEATHSIG, _libc


def main(argv: list[str]) -> int:
    if not argv or os.path.basename(argv[0]) != "srun":
        print("usage: python -m testbed.hosts.slurm.relay srun ARGS...", file=sys.stderr)
        return 2
    want = os.environ.pop(DIE_WITH_PARENT, None)
    if want is not None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if str(os.getppid()) != want:
            print(f"error: the process that started this one ({want}) is gone", file=sys.stderr)
            return 137
    if outside.socket_path() is not None and rootless.active():
        return _outside(argv)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"error: cannot run {argv[0]}: {e.strerror}", file=sys.stderr)
        return 127


def _outside(argv: list[str]) -> int:
    """In an ordinary user's rootless namespaces: ``srun`` started outside them
    (:mod:`testbed.common.outside`) on this process's stdin, stdout and stderr; what would
    have reached it (SIGTERM, SIGINT, SIGHUP) is passed on, and its status is ours."""
    try:
        proc = outside.popen(argv, stdin=0, stdout=1, stderr=2)
    except OSError as e:
        print(f"error: cannot run {argv[0]}: {e}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: proc.send_signal(signum))
    code = proc.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
