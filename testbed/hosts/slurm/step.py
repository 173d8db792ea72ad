"""One job step on a node of the Slurm job: the ``srun`` argv and its life
(:mod:`testbed.hosts.slurm.host`, :mod:`testbed.hosts.slurm.files`)."""

from __future__ import annotations

import signal
import subprocess
from typing import Sequence

from testbed.common import outside, rootless, slurmenv
from testbed.common.errors import StateError
from testbed.common.version import __version__
from testbed.model.hosts import Host

SRUN = "srun"
EXPORT = "PATH,HOME,USER,LANG,LC_ALL,TZ"
"""The controller's variables a step gets (besides Slurm's own)."""
STOP_WAIT_S = 10.0


def step_argv(host: Host, argv: Sequence[str]) -> list[str]:
    """``srun`` argv that runs ``argv`` (no shell) as a step of the host's job on its node."""
    job = host.slurm_job or slurmenv.job_id()
    if job is None:
        raise StateError(f"host {host.name} is node {host.slurm} of a Slurm job, and no job is known",
                         "run it inside the allocation `testbed up` ran in (salloc / sbatch)")
    return [SRUN, f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host.slurm}",
            "--chdir=/", "--quiet", f"--export={EXPORT}", "--", *argv]


def host_argv(host: Host, op: str, *args: str) -> list[str]:
    """``testbed _host OP ARGS`` on the node, as a step."""
    return step_argv(host, [host.testbed, "_host", f"--controller={__version__}", op, *args])


def start(argv: list[str], detach: bool = False, **kw) -> subprocess.Popen:
    """``srun`` in a session of its own: a Ctrl-C typed at the controller reaches the controller
    only, which ends its steps itself (:func:`stop`). An ordinary user's command works in
    their rootless namespaces, where they are uid 0 and slurmctld would refuse the step, so
    there ``srun`` is started by the spawner outside (:mod:`testbed.common.outside`);
    ``detach``: it outlives this command (a step that holds a share)."""
    try:
        if outside.socket_path() is not None and rootless.active():
            return outside.popen(argv, detach=detach, **kw)  # type: ignore[return-value]
        return subprocess.Popen(argv, start_new_session=True, **kw)
    except FileNotFoundError:
        raise StateError(f"{SRUN} is not installed here", "run testbed where Slurm's client commands are") from None
    except OSError as e:
        raise StateError(f"cannot start {SRUN}: {e}") from None


def stop(proc: subprocess.Popen) -> None:
    """End a step's ``srun``: SIGTERM (it cancels the step), SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
