"""What a rank forked by the zygote (:mod:`testbed.nodes.zygote.server`) does: become the
process its client stands for, then run the workload as ``python -m`` would.

:func:`become` runs in the forked child before any of the rank's code: it puts the child
where the client is, in this order: the client's cgroups (joined from the zygote's mount
namespace, where the cgroup file system is mounted), its user namespace (only when it is
not the zygote's), network and mount namespaces (the mount namespace last: it carries the
node's /sys and changes the root and the working directory), the client's working
directory and umask, a session of its own (the launcher's signals reach it through the
client), death with the zygote (PR_SET_PDEATHSIG), the client's stdin, stdout and stderr,
and its environment. Each step that fails refuses the rank before it ran anything: the
zygote tells the client, which starts the rank itself.

:func:`run` then runs the module and ends the process with the code ``python -m`` would
have: 0, the code of SystemExit (a message printed and 1 for one that is not a number), 1
with the traceback printed for an exception, death by SIGINT for KeyboardInterrupt; the
rank's non-daemon threads are joined and its atexit functions run first, as at the end of
an interpreter.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from testbed.common import cgroups
from testbed.nodes.zygote.client import NAMESPACES, STDIO_FDS

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


class Refused(Exception):
    """The rank cannot become its client's process; the message says why."""


def _errno() -> str:
    return os.strerror(ctypes.get_errno())


def cgroup_moves(mine: str, theirs: str, unified: str = "/sys/fs/cgroup") -> list[str]:
    """The cgroup.procs files to write this process's pid to so that it is where ``theirs``
    (a /proc/PID/cgroup) is, given ``mine``: one per hierarchy that differs (cgroup v2's
    line, its hierarchy mounted at ``unified``, or the v1 hierarchies, named ones included)."""
    here: dict[str, str] = {}
    for line in mine.splitlines():
        if line.count(":") >= 2:
            _, controllers, path = line.split(":", 2)
            here[controllers] = path
    out = []
    for line in theirs.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if here.get(controllers) == path:
            continue
        base = unified if controllers == "" else f"/sys/fs/cgroup/{controllers.replace('name=', '')}"
        out.append(os.path.join(base, path.lstrip("/"), "cgroup.procs"))
    return out


def join_cgroups(peer: int) -> None:
    try:
        with open(f"/proc/{peer}/cgroup") as f:
            theirs = f.read()
        with open("/proc/self/cgroup") as f:
            mine = f.read()
    except OSError as e:
        raise Refused(f"reading the client's cgroups: {e.strerror}") from None
    unified = cgroups.mount_point()
    for procs in cgroup_moves(mine, theirs, str(unified) if unified is not None else "/sys/fs/cgroup"):
        try:
            fd = os.open(procs, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError as e:
            raise Refused(f"joining the client's cgroup ({procs}): {e.strerror}") from None


def enter_namespaces(fds: dict[str, int]) -> None:
    """setns into each of the client's namespaces that is not ours already: user, net, mnt."""
    for name in ("user", "net", "mnt"):
        fd = fds[name]
        if os.fstat(fd).st_ino == os.stat(f"/proc/self/ns/{name}").st_ino:
            continue
        if _libc.setns(fd, 0) != 0:
            raise Refused(f"entering the client's {name} namespace: {_errno()}")


def _reset_signals() -> None:
    """The dispositions and mask a new Python starts with."""
    signal.set_wakeup_fd(-1)
    for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGCONT):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def become(req: dict, fds: list[int], peer: int, zygote: int) -> None:
    """Turn this forked child into the client's process (see the module's docstring);
    Refused, before any of the rank's code ran, when a step fails."""
    _reset_signals()
    join_cgroups(peer)
    enter_namespaces(dict(zip(NAMESPACES, fds[STDIO_FDS + 1:])))
    try:
        os.fchdir(fds[STDIO_FDS])
    except OSError as e:
        raise Refused(f"changing to the client's working directory: {e.strerror}") from None
    os.umask(int(req["umask"]))
    os.setsid()
    if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise Refused(f"PR_SET_PDEATHSIG: {_errno()}")
    if os.getppid() != zygote:
        raise Refused("the zygote went away")
    os.environ.clear()  # putenv and unsetenv too: the C libraries read the same
    os.environ.update({str(k): str(v) for k, v in req["env"].items()})
    for i in range(STDIO_FDS):
        os.dup2(fds[i], i)
    for fd in fds:
        if fd > 2:
            os.close(fd)


def run(module: str, args: list[str]) -> int:
    """Run ``module`` as ``__main__`` with ``args``, then end as ``python -m`` ends; returns
    only the code to exit with should the end not end the process."""
    import runpy

    sys.argv = [module, *args]  # runpy puts the module's file first
    interrupted = False
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = exit_code(e.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 128 + signal.SIGINT, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    return finish(code, interrupted)


def exit_code(code) -> int:
    """The exit status of ``SystemExit(code)`` (printing a message that is not a number)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def finish(code: int, interrupted: bool = False) -> int:
    """End as an interpreter ends: join non-daemon threads, run atexit, flush, exit."""
    import atexit

    if "threading" in sys.modules:
        try:
            sys.modules["threading"]._shutdown()
        except BaseException:
            pass
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)
    return code  # pragma: no cover
