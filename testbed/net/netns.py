"""Network namespaces without forking.

pyroute2 forks a helper process for every namespace it creates or opens a socket in
(~10 ms each). Here one helper *thread* does the namespace switch instead: ``unshare``
and ``setns`` of the network namespace act on the calling thread only, and a netlink
socket stays bound to the namespace it was opened in, so the thread opens the socket and
hands its file descriptor to pyroute2's ``IPRoute(fileno=...)`` for use from any thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from testbed.common import rootless
from testbed.common.errors import KernelError

NETNS_DIR = Path("/run/netns")
"""Where namespace handles live as root; rootless, under the user's private tmpfs
(:mod:`testbed.common.rootless`), seen only inside the user's mount namespace."""
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
MNT_DETACH = 2
NETLINK_ROUTE = 0

_libc = ctypes.CDLL(None, use_errno=True)
_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="testbed-netns")


def _oserror(what: str, name: str, err: int) -> KernelError:
    hint = "run as root (or with CAP_NET_ADMIN and CAP_SYS_ADMIN)" if err in (errno.EPERM, errno.EACCES) else None
    return KernelError(f"{what} '{name}' failed: {os.strerror(err)}", hint)


def netns_dir() -> Path:
    return rootless.private_root() / "netns" if rootless.active() else NETNS_DIR


def path(name: str) -> Path:
    return netns_dir() / name


def exists(name: str) -> bool:
    return path(name).exists()


def list_all() -> list[str]:
    try:
        return sorted(p.name for p in netns_dir().iterdir())
    except FileNotFoundError:
        return []


def _netlink_socket_fd() -> int:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
    return s.detach()


def _create_in_thread(name: str) -> int:
    if _libc.unshare(CLONE_NEWNET) != 0:
        raise _oserror("creating network namespace", name, ctypes.get_errno())
    _bind(name, "thread-self", "mounting network namespace")
    return _netlink_socket_fd()


def _bind(name: str, pid, what: str) -> None:
    """Bind-mount the network namespace of ``pid`` at DIR/NAME (pyroute2's attach)."""
    from pyroute2 import netns as _pr_netns  # here: a rank's launcher enters a namespace without it

    try:
        _pr_netns.attach(str(path(name)), pid)
    except FileExistsError:
        raise KernelError(f"network namespace '{name}' already exists",
                          f"something else created it; remove it with `ip netns del {name}` if it is stale") from None
    except OSError as e:
        try:
            os.unlink(path(name))
        except OSError:
            pass
        raise _oserror(what, name, e.errno or errno.EIO) from None


def _setns(name: str) -> None:
    """Move the calling thread into network namespace ``name``."""
    try:
        fd = os.open(path(name), os.O_RDONLY)
    except FileNotFoundError:
        raise KernelError(f"network namespace '{name}' does not exist", "is the testbed up? see `testbed status`") from None
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise _oserror("entering network namespace", name, ctypes.get_errno())
    finally:
        os.close(fd)


def _open_in_thread(name: str) -> int:
    _setns(name)
    return _netlink_socket_fd()


def _sysctl_in_thread(name: str, key: str, value: str) -> None:
    _setns(name)
    # /proc/sys/net resolves to the network namespace of the thread that opens it.
    p = Path("/proc/sys", *key.split("."))
    try:
        f = open(p, "w")
    except FileNotFoundError:
        raise KernelError(f"[{name}] sysctl {key}: no such key in this kernel",
                          "check the name with `sysctl -a | grep ...`, or drop it from sysctls:") from None
    try:
        with f:
            f.write(value)
    except OSError as e:
        hint = ("a congestion control must be built in and listed in the host's "
                "net.ipv4.tcp_allowed_congestion_control to be used inside a namespace"
                if key.endswith("congestion_control") else "check the value the kernel accepts for this key")
        raise KernelError(f"[{name}] sysctl {key}={value}: {os.strerror(e.errno or errno.EIO)}", hint) from None


def set_sysctl(name: str, key: str, value: str) -> None:
    """Write a network sysctl inside namespace ``name`` (no shell, no sysctl binary)."""
    _thread.submit(_sysctl_in_thread, name, key, value).result()


def create(name: str) -> int:
    """Create namespace ``name``; return a netlink (route) socket fd inside it."""
    return _thread.submit(_create_in_thread, name).result()


def attach(name: str, pid: int) -> None:
    """Name the network namespace of process ``pid`` (a container's init) ``name``.

    A bind mount, as ``ip netns attach`` makes: the name keeps the namespace itself, not
    the pid, so a pid reused after the container died can never be mistaken for it."""
    _bind(name, pid, f"naming the network namespace of pid {pid} as")


def _call_in_thread(name: str, fn, args):
    _setns(name)
    return fn(*args)


def call_in(name: str, fn, *args):
    """``fn(*args)`` on the namespace thread inside namespace ``name``: what it opens (a
    socket, a tap through /dev/net/tun) belongs to that namespace. Its exceptions propagate."""
    return _thread.submit(_call_in_thread, name, fn, args).result()


def open_netlink(name: str) -> int:
    """A netlink (route) socket fd inside existing namespace ``name``."""
    return _thread.submit(_open_in_thread, name).result()


def remove(name: str) -> bool:
    """Unmount and delete; False when it was already gone."""
    p = path(name)
    if not p.exists():
        return False
    _libc.umount2(str(p).encode(), MNT_DETACH)
    try:
        p.unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise _oserror("removing network namespace", name, e.errno or errno.EIO) from None
    return True


def inode(name: str) -> int | None:
    try:
        return os.stat(path(name)).st_ino
    except FileNotFoundError:
        return None


def pids_in(names: list[str]) -> dict[int, str]:
    """Processes whose network namespace is one of ``names`` (pid -> namespace name)."""
    by_inode = {ino: n for n in names if (ino := inode(n)) is not None}
    out: dict[int, str] = {}
    if not by_inode:
        return out
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            ino = os.stat(f"/proc/{entry.name}/ns/net").st_ino
        except OSError:
            continue
        if ino in by_inode:
            out[int(entry.name)] = by_inode[ino]
    return out


def kill_processes(names: list[str], grace: float = 2.0, exclude: AbstractSet[int] = frozenset()) -> list[int]:
    """Stop every process inside the namespaces (but ``exclude``): SIGTERM, then SIGKILL
    what remains after ``grace`` (:func:`testbed.common.procs.terminate`)."""
    from testbed.common import procs

    return procs.terminate([p for p in pids_in(names) if p not in exclude], grace)


def stop_processes(names: list[str], what: str) -> list[int]:
    """:func:`kill_processes` for teardown: a TestbedError naming (pid, command, state)
    every process SIGKILL did not end (frozen, stuck in the kernel), so ``down`` never
    reports removed a namespace something still runs in."""
    from testbed.common import procs

    return procs.stop(list(pids_in(names)), what, grace=2.0)


def enter(name: str) -> None:
    """Move the *calling process* into namespace ``name``, as ``ip netns exec`` does.

    Also gives the process a private mount namespace with ``/sys`` remounted, so that
    ``/sys/class/net`` shows the namespace's interfaces. Call only while single-threaded.
    """
    _setns(name)
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise _oserror("creating mount namespace for", name, ctypes.get_errno())
    if _libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None) != 0:
        raise _oserror("making / a slave mount for", name, ctypes.get_errno())
    _libc.umount2(b"/sys", MNT_DETACH)
    if _libc.mount(name.encode(), b"/sys", b"sysfs", 0, None) != 0:
        raise _oserror("mounting /sys for", name, ctypes.get_errno())
