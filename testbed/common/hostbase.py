"""Where an ordinary user's rootless namespaces live on one node of a Slurm job, and the
removal of those a job left behind.

On a cluster the nodes share the home directory (NFS) and often have no per-node
``$XDG_RUNTIME_DIR``, so BASE (:mod:`testbed.common.rootless`) of a command on a node of a
job is a folder of that node and job, ``~/.local/state/testbed/host-NODE-jobID``: two
nodes never share one holder (``holder.pid``, ``holder.lock``), two jobs never share one.

The job's end kills the holder with every process of the job, and with it the namespaces
and the state on its tmpfs; the folder itself (``holder.lock``, ``holder.pid``, an empty
``ns/``) stays, one per node and job. :func:`prune` removes those that nothing uses any
more: an agent starting on a node removes that node's, and ``testbed down`` also those of
jobs Slurm says have ended, on any node. A folder is removed only when it is a directory
of this user's own (never through a link) and nobody holds its ``holder.lock`` (every
command working inside holds it); besides, either its holder is not running on this node
(this node's), or its job has ended (another node's, whose processes cannot be seen here).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from testbed.common import slurmenv
from testbed.common.digits import ascii_int

NAME_RE = re.compile(r"^host-(?P<node>[A-Za-z0-9_-]+)-job(?P<job>[0-9]{1,12})$")
ENDED_STATES = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                "OUT_OF_MEMORY", "REVOKED"}
"""Job states (squeue's ``%T``) after which no process of the job runs on its nodes (in
COMPLETING some may still); any other state counts as live."""
SQUEUE_TIMEOUT_S = 10.0


def states_root() -> Path:
    """Where BASE is without a runtime directory: ``~/.local/state/testbed``."""
    return Path.home() / ".local" / "state" / "testbed"


MAX_NAME = 64
"""Characters of a node's name in a folder's name (Slurm's and Linux's names are shorter)."""


def safe_name(name: str) -> str:
    """``name`` as a path component: letters, digits, ``_`` and ``-`` only, at most
    ``MAX_NAME`` of them (a variable's value is input: ``SLURMD_NODENAME`` may be anything)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name[:MAX_NAME].split(".")[0]) or "unnamed"


def node_name() -> str:
    """This node's name: Slurm's (``SLURMD_NODENAME``, set in a job's steps and batch
    script; several slurmd on one machine share its hostname), else the hostname."""
    return safe_name(os.environ.get(slurmenv.NODENAME) or os.uname().nodename)


def job_base(on_node: bool = False) -> Path | None:
    """BASE of a command on a node of a Slurm job, ``host-NODE-jobID``; None outside a job,
    or where the node is not known (``salloc``'s shell on a login machine) and the caller
    is not ``on_node`` (a host agent, a step: its hostname is the node's). A Slurm variable
    that is not what Slurm sets counts as unset (:func:`testbed.common.slurmenv.or_none`):
    the command that needs the job refuses it by name."""
    job = slurmenv.or_none(slurmenv.job_id)
    if job is None or not (on_node or os.environ.get(slurmenv.NODENAME)):
        return None
    return states_root() / f"host-{node_name()}-job{job}"


def host_base() -> Path:
    """A host agent's BASE outside a Slurm job: ``host-HOSTNAME`` (a home directory shared
    by SSH hosts must not give two of them one holder)."""
    return states_root() / f"host-{safe_name(os.uname().nodename)}"


def ended_jobs(jobs: Iterable[int]) -> set[int]:
    """Of ``jobs``, those Slurm says have ended (finished, or no longer known to it: purged);
    none when ``squeue`` cannot tell (not installed, no controller)."""
    jobs = set(jobs)
    if not jobs:
        return set()
    try:
        r = subprocess.run(["squeue", "--me", "-h", "-t", "all", "-o", "%A %T"], capture_output=True, text=True,
                           timeout=SQUEUE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if r.returncode != 0:
        return set()
    live = set()
    for line in r.stdout.splitlines():
        fields = line.split()
        job = ascii_int(fields[0], slurmenv.JOB_ID_DIGITS) if len(fields) == 2 else None
        if job is not None and fields[1] not in ENDED_STATES:
            live.add(job)  # %A: each array task's and het component's own id, as SLURM_JOB_ID
    return jobs - live


def _unused(path: Path) -> bool:
    """Nobody holds ``path/holder.lock`` (a missing lock: nobody ever did, or was removed)."""
    try:
        fd = os.open(path / "holder.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def prune(running: Callable[[Path], bool], root: Path | None = None, node: str | None = None,
          job: str | None = None, ask_slurm: bool = False,
          ended: Callable[[Iterable[int]], set[int]] = ended_jobs) -> list[Path]:
    """Remove the ``host-NODE-jobID`` folders of ``root`` (default :func:`states_root`) that
    nothing uses (module docstring): this node's (``node``, default :func:`node_name`) but
    the current job's (``job``, default ``$SLURM_JOB_ID``) and those whose holder is
    ``running`` here (:func:`testbed.common.rootless.holder_pid`); with ``ask_slurm``, also
    those of any node whose job has ended. The folders removed; a folder that cannot be
    removed is left (a later prune tries again)."""
    root = root or states_root()
    node = safe_name(node) if node is not None else node_name()
    if job is None:
        current = slurmenv.or_none(slurmenv.job_id)
        job = "" if current is None else str(current)
    try:
        st = os.lstat(root)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return []
        names = os.listdir(root)
    except OSError:
        return []
    mine: list[tuple[Path, int]] = []
    others: list[tuple[Path, int]] = []
    for name in names:
        m = NAME_RE.match(name)
        if m is None or m["job"] == job:
            continue
        (mine if m["node"] == node else others).append((root / name, int(m["job"])))
    gone = ended({j for _, j in others}) if ask_slurm and others else set()
    removed = []
    for path, j in mine + [(p, j) for p, j in others if j in gone]:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or not _unused(path):
            continue
        if (path, j) in mine and running(path):
            continue
        try:
            shutil.rmtree(path)  # never follows a link (it removes the link, or refuses one at the top)
        except OSError:
            continue
        removed.append(path)
    return removed
