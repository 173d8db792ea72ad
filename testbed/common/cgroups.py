"""A cgroup (v2) per testbed, as root: what `down` ends, wherever it moved.

A process started in a node (``testbed exec``, the ranks of ``testbed run``, what they
start) joins its testbed's cgroup before it enters the node (:mod:`testbed.nodes.nsexec`),
and everything it forks stays there: a daemon that double-forks, starts a new session or
moves into a new network namespace is still listed in ``cgroup.procs``. ``down`` ends them
(SIGTERM, a grace period, then ``cgroup.kill``) and removes the cgroup.

Where: ``<cgroup2 mount>/testbed/<ID>.<NAME>``, ID the state directory's id, so two state
directories never share one (a name is unique within its state directory). At the top of
the hierarchy, as Docker's cgroupfs driver does, not below the cgroup of whichever command
ran ``up``: ``testbed exec`` from another shell must find it. No controller is enabled in
it: it only holds processes, limits nothing, and a process moved there leaves the cgroup v2
it was in (and its v2 limits; v1 hierarchies are not touched).

Where no cgroup2 is mounted, or it cannot be written (an ordinary user's rootless
namespaces, a read-only mount in a container), nothing is made: ``down`` ends processes by
their network namespace, and rootless by the holder's PID namespace
(:mod:`testbed.common.rootless`).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from pathlib import Path

from testbed.common import procs
from testbed.common.errors import KernelError

TOP = "testbed"
"""The directory below the cgroup2 mount that holds every testbed's cgroup."""
GRACE_S = 2.0
KILL_WAIT_S = 3.0
BUSY_WAIT_S = 5.0
_UNAVAILABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR)


def mount_point() -> Path | None:
    """Where the cgroup2 hierarchy is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified``
    on a hybrid system), None without one. Of several mounts, one of the hierarchy's root
    (a container's own cgroup namespace counts), the shortest path first."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        left, sep, right = line.partition(b" - ")
        fields = left.split()
        if sep and right.split()[:1] == [b"cgroup2"] and len(fields) >= 5:
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])  # \040: a space
            found.append((fields[3] != b"/", len(point), os.fsdecode(point)))
    return Path(min(found)[2]) if found else None


def path_for(testbed: str, state_id: str) -> Path | None:
    """The cgroup of testbed ``testbed`` of the state directory with id ``state_id``
    (None without a cgroup2 mount). Whether it exists is another matter: see :func:`create`."""
    root = mount_point()
    return root / TOP / f"{state_id}.{testbed}" if root is not None else None


def create(path: Path | None) -> bool:
    """Make the cgroup (a leftover of the same state directory and name is taken over);
    False when this machine does not let us (no cgroup2, read-only, not root)."""
    if path is None:
        return False
    for _ in range(5):  # another testbed's down may remove TOP between our two mkdirs
        try:
            path.parent.mkdir(mode=0o755, exist_ok=True)
            path.mkdir(mode=0o755, exist_ok=True)
            return True
        except FileNotFoundError:
            if not path.parent.parent.is_dir():
                return False
        except OSError as e:
            if e.errno in _UNAVAILABLE:
                return False
            raise KernelError(f"cannot make the cgroup {path}: {e.strerror}",
                              "check that the cgroup2 file system is mounted and writable") from None
    return False


def join(path: str) -> bool:
    """Move this process into cgroup ``path`` (its children follow it); False when the
    cgroup does not exist (none was made for the testbed). OSError when it exists but
    cannot be joined."""
    procs_file = os.path.join(path, "cgroup.procs")
    try:
        fd = os.open(procs_file, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    return True


def members(path: Path) -> list[int]:
    """The processes in the cgroup and in any cgroup below it (one a process made there as
    root); [] when it is gone. A process that exited is no longer listed."""
    found: list[int] = []
    for where, _, _ in os.walk(path):
        try:
            with open(os.path.join(where, "cgroup.procs"), "rb") as f:
                found += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            pass
    return found


def end(path: Path, grace: float = GRACE_S, kill_wait: float = KILL_WAIT_S) -> list[int]:
    """End every process in the cgroup: SIGTERM (and SIGCONT), up to ``grace`` seconds to
    exit, then SIGKILL to all at once (``cgroup.kill``, Linux 5.14+; one by one before).
    Returns those still there ``kill_wait`` seconds later (stuck in the kernel)."""
    pids = members(path)
    if not pids:
        return []
    for pid in pids:
        _signal(pid, signal.SIGTERM)
        _signal(pid, signal.SIGCONT)  # a stopped process must run to act on SIGTERM
    if not _wait_empty(path, grace):
        return []
    deadline = time.monotonic() + kill_wait
    while time.monotonic() < deadline:
        if not _kill_all(path):
            return []
        if not _wait_empty(path, 0.2):
            return []
    return members(path)


def _kill_all(path: Path) -> bool:
    """SIGKILL every member; False when there was none."""
    try:
        with open(path / "cgroup.kill", "w") as f:
            f.write("1")
        return bool(members(path))
    except FileNotFoundError:
        if not path.is_dir():
            return False
    pids = members(path)  # before Linux 5.14: one by one (the loop in end() catches forks)
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    return bool(pids)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_empty(path: Path, timeout: float) -> bool:
    """Wait up to ``timeout`` s for the cgroup to empty; True when members remain."""
    deadline = time.monotonic() + timeout
    while members(path):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
    return False


def remove(path: Path, grace: float = GRACE_S, busy_wait: float = BUSY_WAIT_S) -> list[str]:
    """End the cgroup's processes and remove it, with the cgroups below it (and TOP when it
    is left empty); what could not be ended, one ``pid N (command; state S)`` each. Already
    gone is success. A process that joins while ``down`` runs (``testbed run`` starting one
    more process in a node) is ended too: the removal is tried for ``busy_wait`` seconds."""
    deadline = time.monotonic() + busy_wait
    while path.is_dir():
        left = end(path, grace)
        if left:
            return [procs.describe(p) for p in left]
        if _rmdir_tree(path):
            break
        if time.monotonic() >= deadline:
            return [procs.describe(p) for p in members(path)] or [f"cgroup {path} is busy"]
        time.sleep(0.1)
    try:
        path.parent.rmdir()  # the last testbed's: leave nothing of ours behind
    except OSError:
        pass  # another testbed's cgroup is in it (ENOTEMPTY, EBUSY), or it is gone
    return []


def _rmdir_tree(path: Path) -> bool:
    """Remove the (emptied) cgroup and those below it, deepest first; False when one is
    busy (a process joined since it was emptied)."""
    for where, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
        try:
            os.rmdir(where)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise KernelError(f"cannot remove the cgroup {where}: {e.strerror}") from None
            return False
    return True


def of_state(state_id: str) -> dict[str, Path]:
    """The cgroups of one state directory's testbeds that exist now: name -> path."""
    root = mount_point()
    if root is None:
        return {}
    try:
        entries = list(os.scandir(root / TOP))
    except OSError:
        return {}
    prefix = f"{state_id}."
    return {e.name[len(prefix):]: Path(e.path) for e in entries
            if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)}
