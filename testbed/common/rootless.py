"""Rootless mode: an ordinary user's testbeds, in namespaces the user owns.

One holder process per user (:mod:`testbed.common.holder`) owns

- a **user namespace** with the user mapped to root inside (so namespaces, veths, bridges
  and qdiscs can be made, as rootlesskit and podman do);
- a **mount namespace** with a private tmpfs on ``BASE/ns``, holding the state directory
  (``BASE/ns/state``) and the network namespace handles (``BASE/ns/netns``);
- a **PID namespace** whose init it is.

``BASE`` is ``$XDG_RUNTIME_DIR/testbed`` (or ``~/.local/state/testbed`` where that is
missing). Each command of the user enters the user and mount namespaces and has its
children start in the PID namespace (:func:`enter`, before any thread starts); it stays in
the host's network namespace, so an exporter it starts is reachable by a Prometheus on the
host. Hence:

- another user, and root, see none of it: different state, different handles, and the
  namespaces are owned by the user's user namespace;
- when the holder dies (even ``kill -9``), the kernel kills every process started inside;
  once the last command has exited the mount namespace goes, with it the tmpfs and every
  namespace handle, and with those every namespace, veth and qdisc.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from testbed.common import hostbase, outside, owners, procs
from testbed.common.errors import TestbedError
from testbed.common.files import private_dir
from testbed.common.owners import in_user_namespace

ENV = "TESTBED_ROOTLESS_DIR"
"""Set by :func:`enter` to BASE; inherited by what the command starts."""
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
HOLDER_MODULE = "testbed.common.holder"
START_TIMEOUT_S = 15.0
PR_SET_PDEATHSIG = 1
ORPHAN_WAIT_S = 5.0
STRAY_GRACE_S = 2.0
_libc = ctypes.CDLL(None, use_errno=True)


class RootlessError(TestbedError):
    """Rootless mode cannot work here (or not for this request); the message says why."""


def base_dir() -> Path:
    """BASE: ``$TESTBED_ROOTLESS_DIR`` once entered; on a node of a Slurm job (a batch script,
    ``srun testbed ...``) that node's and job's own, ``~/.local/state/testbed/host-NODE-jobID``
    (:mod:`testbed.common.hostbase`: the nodes share the home directory, and often have no
    runtime directory of their own); else ``$XDG_RUNTIME_DIR/testbed`` when that is a
    directory of ours, else ``~/.local/state/testbed``."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return hostbase.job_base() or _runtime_base() or hostbase.states_root()


def _runtime_base() -> Path | None:
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        try:
            st = os.stat(xdg)
            if st.st_uid == os.geteuid() and os.path.isdir(xdg):
                return Path(xdg) / "testbed"
        except OSError:
            pass
    return None


def prune_job_bases(ask_slurm: bool = False) -> None:
    """Remove the ``host-NODE-jobID`` folders ended Slurm jobs left (:func:`hostbase.prune`):
    this node's whose holder is not running, and with ``ask_slurm`` any node's whose job
    Slurm says has ended."""
    hostbase.prune(lambda base: holder_pid(base) is not None, ask_slurm=ask_slurm)


def use_host_base() -> None:
    """For a host agent (``testbed _host``, another host's share): BASE is, inside a Slurm job,
    the node's and job's own (as :func:`base_dir`): each job's share lives in its own holder,
    started by the job's step and ended with the job, never with another job of the user on
    that node. Else ``$XDG_RUNTIME_DIR/testbed`` (which is the host's own), else a folder of
    this host's own, ``~/.local/state/testbed/host-HOSTNAME``: the hosts may share the home
    directory (NFS), and two must never share one holder or one state directory."""
    if not os.environ.get(ENV):
        os.environ[ENV] = str(hostbase.job_base(on_node=True) or _runtime_base() or hostbase.host_base())


def private_root() -> Path:
    """The holder's tmpfs (seen only inside its mount namespace)."""
    return base_dir() / "ns"


def active() -> bool:
    """This process works in a user's rootless namespaces (entered by it or an ancestor)."""
    return bool(os.environ.get(ENV)) and in_user_namespace()


def needed() -> bool:
    """An ordinary user's command that has not entered its rootless namespaces yet."""
    return os.geteuid() != 0 and not active()


def outer_uid() -> int:
    """This user's uid as the host knows it (inside the user namespace, getuid() says 0)."""
    try:
        with open("/proc/self/uid_map", "rb") as f:
            fields = f.read(4096).split()
        return int(fields[1]) if fields[:1] == [b"0"] else os.getuid()
    except (OSError, IndexError, ValueError):
        return os.getuid()


# --------------------------------------------------------------------------- the holder
def _pid_file(base: Path) -> Path:
    return base / "holder.pid"


def holder_pid(base: Path | None = None) -> int | None:
    """The running holder's pid (as this host sees it), or None. The pid file is checked
    against the process: ours, alive, a testbed holder for this BASE."""
    base = base or base_dir()
    try:
        with open(_pid_file(base), "rb") as f:
            text = f.read(32).decode("ascii", "replace").strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return None
    except OSError:
        return None
    argv = procs.argv_of(pid)
    return pid if procs.running(pid) and HOLDER_MODULE in argv and str(base) in argv else None


enter_failure: TestbedError | None = None
"""Why :func:`enter` failed, for `testbed doctor` (which goes on without the namespaces)."""
_stop_w: int | None = None
"""Inside: the pipe end on which :func:`release` asks the parent to stop the holder."""
_session_fd: int | None = None
"""This command's shared lock on BASE/holder.lock, held while it works inside: the holder
is stopped only by a command that finds no other inside (:func:`release`)."""


def ensure_holder(base: Path) -> int:
    """The holder's pid, starting one when none runs (one per user and BASE)."""
    global _session_fd
    private_dir(base)
    private_dir(base / "ns")
    if _session_fd is None:
        _session_fd = os.open(base / "holder.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(_session_fd, fcntl.LOCK_SH)  # held while this command works inside, beside others
    pid = holder_pid(base)
    if pid is not None:
        return pid
    fcntl.flock(_session_fd, fcntl.LOCK_EX)  # none runs: one command starts it, the others wait
    try:
        return _holder(base)
    finally:
        fcntl.flock(_session_fd, fcntl.LOCK_SH)


def _holder(base: Path) -> int:
    pid = holder_pid(base)
    if pid is not None:
        return pid
    proc = subprocess.Popen(procs.python_argv(HOLDER_MODULE, str(base)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, cwd="/")
    try:
        out, err = proc.communicate(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RootlessError("the rootless namespace holder did not start in time") from None
    line = out.decode(errors="replace").strip().splitlines()[-1:] or [""]
    if proc.returncode != 0 or not line[0].startswith("ready "):
        why = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        blockers = userns_blockers()
        hint = "; ".join(f"{b[0]}: {b[1]}" for b in blockers) if blockers else \
            "this machine refuses user namespaces to ordinary users (a chroot, a container or a security policy)"
        raise RootlessError(f"cannot make a user namespace for rootless testbeds ({why[0][:300]})",
                            f"{hint}; or run as root (sudo $(command -v testbed) ...)")
    return int(line[0].split()[1])


USERNS_SYSCTLS = (
    ("user.max_user_namespaces", lambda v: v.isdigit() and int(v) > 0,
     "an administrator runs `sysctl -w user.max_user_namespaces=15000`"),
    ("kernel.unprivileged_userns_clone", lambda v: v == "1",
     "an administrator runs `sysctl -w kernel.unprivileged_userns_clone=1` (Debian's switch)"),
    ("kernel.apparmor_restrict_unprivileged_userns", lambda v: v == "0",
     "an administrator runs `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or gives the testbed "
     "python an AppArmor profile with `userns,` (Ubuntu 24.04)"),
)
"""The switches that keep ordinary users from making user namespaces: (sysctl, fine, fix)."""


def userns_blockers() -> list[tuple[str, str]]:
    """(``sysctl = value``, how to lift it) for each switch set against unprivileged user
    namespaces here; a switch this kernel does not have is no blocker."""
    out = []
    for key, fine, fix in USERNS_SYSCTLS:
        try:
            with open("/proc/sys/" + key.replace(".", "/"), "rb") as f:
                value = f.read(64).decode(errors="replace").strip()
        except OSError:
            continue
        if not fine(value):
            out.append((f"{key} = {value}", fix))
    return out


def enter(spawner: bool | None = None) -> None:
    """Join the user's rootless namespaces, starting the holder when none runs. Call before
    any thread starts.

    The user and mount namespaces are entered here; the PID namespace only by a child (a
    process cannot start threads once its children's PID namespace differs from its own),
    so this process forks: the child returns and does the command, inside all three; this
    process waits for it, passes on SIGTERM/SIGHUP, exits with its status, and stops the
    holder when the child found nothing left inside (:func:`release`). The child gets
    SIGTERM if its parent dies (``kill -9`` of the command the user started).

    ``spawner`` (default: inside a Slurm job): first fork a process that stays outside and
    starts what must run as the user's own uid there, ``srun`` (:mod:`testbed.common.outside`)."""
    global _stop_w
    base = base_dir()
    try:
        pid = ensure_holder(base)
        pidfd = os.pidfd_open(pid)  # the holder itself, whatever its pid is later
    except OSError as e:
        raise RootlessError(f"cannot start the rootless namespaces in {base}: {e.strerror or e}",
                            f"check that {base} is a directory of yours, or set XDG_RUNTIME_DIR; or run as root") \
            from None
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    if spawner if spawner is not None else bool(os.environ.get("SLURM_JOB_ID")):
        os.environ[outside.ENV] = outside.start(base)
    owners.start_oracle()  # who owns a folder, as the host sees it (testbed.common.owners)
    _setns(pid, ("user", "mnt", "pid"))
    os.environ[ENV] = str(base)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        os.close(r)
        os.close(pidfd)
        _stop_w = w
        try:
            os.chdir(cwd)
        except OSError:
            os.chdir("/")
        return
    os.close(w)
    owners.forget_oracle()  # the child asks it; it ends with the child
    code = _wait_for(child)
    if os.read(r, 1) == b"s":  # the lock stays exclusive (the child's, on our shared file) until we exit
        _stop(pidfd)
    os._exit(code)


def _setns(pid: int, kinds: tuple[str, ...]) -> None:
    fds = []
    try:
        for kind in kinds:
            fds.append((kind, os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)))
        for kind, fd in fds:
            if _libc.setns(fd, 0) != 0:
                err = ctypes.get_errno()
                raise RootlessError(f"cannot enter the rootless {kind} namespace of holder {pid}: {os.strerror(err)}",
                                    "run the command again; `testbed doctor` says what this machine lacks")
    except FileNotFoundError:
        raise RootlessError(f"the rootless namespace holder {pid} exited", "run the command again") from None
    finally:
        for _, fd in fds:
            os.close(fd)


def _wait_for(child: int) -> int:
    """The parent's part: forward termination, keep Ctrl-C for the child (the terminal sends
    it to both), return the child's exit status as a shell would."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status = procs.wait_forwarding(child, (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT))
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _stop(pidfd: int, timeout: float = 5.0) -> None:
    """Stop the holder (the kernel then kills what is left in its PID namespace)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except ProcessLookupError:
            break
        poll = select.poll()
        poll.register(pidfd, select.POLLIN)
        if poll.poll(timeout * 1000):
            break
    os.close(pidfd)


def release(busy: bool) -> bool:
    """At the end of a command inside: ask for the holder to be stopped when nothing is left
    (``busy`` False: no testbed is up; no other command inside; no process in the PID
    namespace but the holder and this one), so an idle user leaves nothing behind. What a
    testbed's node started and moved out of its namespaces is ended first (:func:`_end_strays`):
    it is no reason to keep the holder, and would outlive `down` otherwise."""
    global _stop_w
    if _stop_w is None or _session_fd is None:
        return False
    w, _stop_w = _stop_w, None
    try:
        try:
            fcntl.flock(_session_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # another command works inside
        orphaned = _reader_gone(w)  # our parent, the command the user started, was killed
        busy = busy or bool(_node_namespaces())  # a testbed of another state directory is up
        stuck = [] if busy else _end_strays()
        deadline = time.monotonic() + (ORPHAN_WAIT_S if orphaned else 0.0)
        while not busy and _others_inside(stuck) and time.monotonic() < deadline:
            time.sleep(0.05)  # orphaned: what it stopped on the way out (an exporter) is still exiting
        if busy or _others_inside(stuck):
            fcntl.flock(_session_fd, fcntl.LOCK_SH)
            return False
        if orphaned:  # nobody is left to stop it but us
            os.kill(1, signal.SIGTERM)  # the holder; the kernel then ends this process too: nothing is left to do
            time.sleep(ORPHAN_WAIT_S)
        os.write(w, b"s")
        return True
    finally:
        os.close(w)


def _reader_gone(w: int) -> bool:
    """The read end of pipe ``w`` is closed (its reader, our parent, died)."""
    poll = select.poll()
    poll.register(w, select.POLLOUT)
    return any(ev & select.POLLERR for _, ev in poll.poll(0))


def _others_inside(but: Sequence[int] = ()) -> list[int]:
    """Live processes of the PID namespace (its /proc) but its init, this one and ``but``."""
    return [int(e.name) for e in os.scandir("/proc")
            if e.name.isdigit() and int(e.name) not in (1, os.getpid(), *but) and procs.running(int(e.name))]


def _netns_inode(pid: int | str) -> int | None:
    return _inode(f"/proc/{pid}/ns/net")


def _node_namespaces() -> set[int]:
    """The network namespaces of the user's testbeds that are up (their handles, on the tmpfs)."""
    try:
        entries = list(os.scandir(private_root() / "netns"))
    except OSError:
        return set()
    return {ino for e in entries if (ino := _inode(e.path)) is not None}


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _end_strays() -> list[int]:
    """With no testbed up and no other command inside: end every process in a network
    namespace other than ours (the host's, where testbed's own processes run). Each was
    started in a node and moved to a namespace of its own (``unshare -n``, ``unshare -Urn``):
    the nodes' namespaces are gone, and a process in one cannot get back into ours (the
    user namespace owns neither the host's network namespace nor any way back into it).
    Says, one line each, what did not end (stuck in the kernel); returns those pids. The
    holder stops anyway: the kernel kills them with the PID namespace."""
    mine = _netns_inode("self")
    strays = [p for p in _others_inside() if _netns_inode(p) not in (mine, None)]
    if not strays:
        return []
    try:
        procs.terminate(strays, grace=STRAY_GRACE_S)
    except OSError:  # one we may not signal: named below, and the holder stops all the same
        pass
    stuck = [p for p in strays if procs.running(p)]
    for p in stuck:
        print(f"could not end {procs.describe(p)}, started in a testbed and moved to a network namespace of its "
              "own (stuck in the kernel?); it ends with your rootless namespaces", file=sys.stderr)
    return stuck
