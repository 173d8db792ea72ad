"""Run a command inside a node (no shell ever sees it).

``python -m testbed.nodes.nsexec NETNS [--cwd DIR] [--cgroup PATH] -- CMD [ARGS...]``
    A netns worker: like ``ip netns exec``: joins the cgroup PATH when it exists (the
    testbed's, :mod:`testbed.common.cgroups`: what CMD starts is found there by ``down``
    wherever it moves), joins the network namespace, remounts /sys in a private mount
    namespace so /sys/class/net shows the node's interfaces, changes to DIR (when given),
    execs CMD.

``python -m testbed.nodes.nsexec --container PID --netns NETNS [--mount DIR]... [--cwd DIR] -- CMD...``
    A container worker: like ``docker exec``: joins the cgroups and the network, UTS, IPC,
    PID and mount namespaces of the container whose init is PID (after checking that its
    network namespace is the testbed's NETNS, so a reused pid is never entered), mounts
    each host DIR at the same path in a private copy of the container's mount namespace
    (open_tree + move_mount, Linux 5.2+), then forks CMD as a process of the container.
    This process stays outside as its parent: it forwards SIGTERM/SIGINT/SIGHUP/SIGCONT
    and exits with CMD's status; if it dies, CMD is killed (PR_SET_PDEATHSIG).

With ``TESTBED_DIE_WITH_PARENT=PID`` in its environment (PID: the process starting it),
either form is killed when PID dies (PR_SET_PDEATHSIG); ``testbed run`` sets it for ranks.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

from testbed.common.procs import wait_forwarding

_libc = ctypes.CDLL(None, use_errno=True)
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # x86_64 and aarch64 share these (new syscall table)
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE = 1, os.O_CLOEXEC, 0x8000
MOVE_MOUNT_F_EMPTY_PATH, AT_FDCWD = 4, -100
CLONE_NEWNS, MS_REC, MS_SLAVE = 0x00020000, 0x4000, 1 << 19
PR_SET_PDEATHSIG = 1
DIE_WITH_PARENT = "TESTBED_DIE_WITH_PARENT"
"""Set to the starting process's pid (``testbed run`` does, for its ranks): this process,
and what it execs or forks, is killed when that process dies, even by SIGKILL, so the
ranks of a killed run never go on sending through the testbed under the next run."""
NAMESPACES = ("ipc", "uts", "net", "pid", "mnt")  # mnt last: it changes root and cwd


def _fail(msg: str, code: int = 1) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def _exec(argv: list[str]) -> int:
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        return _fail(f"command not found: {argv[0]}", 127)
    except PermissionError:
        return _fail(f"permission denied: {argv[0]}", 126)
    return 1  # pragma: no cover - execvp does not return


def _die_with_parent() -> int | None:
    """PR_SET_PDEATHSIG when asked to (see DIE_WITH_PARENT); an exit code if the parent is
    already gone. The variable is removed, so the command's own children are not bound."""
    want = os.environ.pop(DIE_WITH_PARENT, None)
    if want is None:
        return None
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # it died before prctl took effect (we were re-parented); a parent outside our PID
    # namespace (a rootless command's child starts in the holder's) reads as 0
    if os.getppid() != 0 and str(os.getppid()) != want:
        return _fail(f"the process that started this one ({want}) is gone", 137)
    return None


def _join_cgroups(pid: int) -> None:
    """Put this process into the cgroups of ``pid`` (the container's CPU/memory limits)."""
    with open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            base = "/sys/fs/cgroup"
        else:
            name = controllers.replace("name=", "")
            base = f"/sys/fs/cgroup/{name}"
        procs = os.path.join(base, path.lstrip("/"), "cgroup.procs")
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass  # a hierarchy that is not mounted here (e.g. a named one): nothing to join


def container(pid: int, netns_name: str, mounts: list[str], cwd: str | None, argv: list[str]) -> int:
    from testbed.net import netns

    try:
        want = os.stat(netns.path(netns_name)).st_ino
        have = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError as e:
        return _fail(f"node namespace {netns_name} or process {pid}: {e.strerror}")
    if want != have:
        return _fail(f"process {pid} is not in network namespace {netns_name} (its container was replaced?)")
    trees = []
    for m in mounts:
        fd = _libc.syscall(SYS_OPEN_TREE, AT_FDCWD, m.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
        if fd < 0:
            return _fail(f"cannot take {m} into the container: {os.strerror(ctypes.get_errno())}")
        trees.append((m, fd))
    fds = [(n, os.open(f"/proc/{pid}/ns/{n}", os.O_RDONLY)) for n in NAMESPACES]
    try:
        _join_cgroups(pid)
    except OSError as e:
        return _fail(f"cannot join the cgroups of container process {pid}: {e.strerror}")
    for n, fd in fds:
        if _libc.setns(fd, 0) != 0:
            return _fail(f"entering the {n} namespace of process {pid}: {os.strerror(ctypes.get_errno())}")
        os.close(fd)
    if _libc.unshare(CLONE_NEWNS) != 0 or _libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None) != 0:
        return _fail(f"private mount namespace: {os.strerror(ctypes.get_errno())}")
    for m, fd in trees:
        os.makedirs(m, exist_ok=True)
        if _libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, m.encode(), MOVE_MOUNT_F_EMPTY_PATH) != 0:
            return _fail(f"mounting {m} inside the container: {os.strerror(ctypes.get_errno())}")
        os.close(fd)
    os.chdir(cwd or "/")
    child = os.fork()  # the child is the first to live in the container's PID namespace
    if child == 0:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(137)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        os._exit(_exec(argv))

    status = wait_forwarding(child, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCONT))
    if os.WIFSIGNALED(status):
        return die_like(os.WTERMSIG(status))
    return os.WEXITSTATUS(status)


def die_like(sig: int) -> int:
    """End this process by signal ``sig`` (what the command it stands for died of), so the
    launcher sees the signal; the exit code to return should the signal not end it."""
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be caught anyway
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    return 128 + sig


def _netns_options(opts: list[str]) -> tuple[str, str | None, str | None] | None:
    """(NETNS, --cwd DIR, --cgroup PATH) of the netns form; None when they are not that."""
    if not opts or opts[0].startswith("-") or len(opts) % 2 != 1:
        return None
    given = dict(zip(opts[1::2], opts[2::2]))
    if len(given) != len(opts) // 2 or set(given) - {"--cwd", "--cgroup"}:
        return None
    return opts[0], given.get("--cwd"), given.get("--cgroup")


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: python -m testbed.nodes.nsexec NETNS [--cwd DIR] [--cgroup PATH] -- CMD [ARGS...]\n"
              "       python -m testbed.nodes.nsexec --container PID --netns NETNS [--mount DIR]... [--cwd DIR] -- CMD...",
              file=sys.stderr)
        return 2
    gone = _die_with_parent()
    if gone is not None:
        return gone
    cut = argv.index("--")
    opts, cmd = argv[:cut], argv[cut + 1:]
    if opts and opts[0] == "--container":
        p = argparse.ArgumentParser(prog="python -m testbed.nodes.nsexec")
        p.add_argument("--container", type=int, required=True)
        p.add_argument("--netns", required=True)
        p.add_argument("--mount", action="append", default=[])
        p.add_argument("--cwd")
        a = p.parse_args(opts)
        return container(a.container, a.netns, a.mount, a.cwd, cmd)
    options = _netns_options(opts)
    if options is None:
        return _fail("give one namespace (and optionally --cwd DIR, --cgroup PATH) before --", 2)
    ns, cwd, group = options
    from testbed.common import cgroups
    from testbed.common.errors import TestbedError
    from testbed.net import netns

    try:
        if group is not None:  # before netns.enter: it remounts /sys, and the cgroup file system with it
            cgroups.join(group)
    except OSError as e:
        return _fail(f"cannot join the testbed's cgroup {group}: {e.strerror}")
    try:
        netns.enter(ns)
        if cwd is not None:
            os.chdir(cwd)
    except TestbedError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"--cwd {cwd}: {e.strerror}")
    return _exec(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
