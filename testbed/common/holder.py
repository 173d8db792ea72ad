"""The rootless namespace holder: ``python -m testbed.common.holder BASE`` (started by
:func:`testbed.common.rootless.ensure_holder`, one per user).

Makes a user namespace (this user mapped to root inside), a mount namespace with a private
tmpfs on ``BASE/ns`` (``state/`` and ``netns/`` in it) and a PID namespace, forks the PID
namespace's init, which mounts that namespace's /proc; writes the init's pid to
``BASE/holder.pid``, prints ``ready PID`` and exits. The init reaps orphans and sleeps until
SIGTERM; when it exits, the kernel kills every process left in the PID namespace.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

from testbed.common.files import atomic_write
from testbed.common.rootless import CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 1 << 18
TMPFS_OPTIONS = b"mode=0700,size=64m,nr_inodes=65536"
"""Ledgers, state and run bookkeeping only (run directories live on the user's disk)."""
_libc = ctypes.CDLL(None, use_errno=True)


def _fail(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def make_namespaces(base: Path) -> None:
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER) != 0:
        _fail("unshare(CLONE_NEWUSER)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1\n")
    _write("/proc/self/gid_map", f"0 {gid} 1\n")
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWPID) != 0:
        _fail("unshare(CLONE_NEWNS|CLONE_NEWPID)")
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        _fail("making / private")
    ns = str(base / "ns").encode()
    if _libc.mount(b"testbed", ns, b"tmpfs", MS_NOSUID | MS_NODEV, TMPFS_OPTIONS) != 0:
        _fail(f"mounting a tmpfs on {base / 'ns'}")
    os.mkdir(base / "ns" / "state", 0o700)
    os.mkdir(base / "ns" / "netns", 0o755)


def init() -> None:
    """PID 1 of the namespace: reap what is orphaned into it, exit on SIGTERM/SIGINT."""
    os.setsid()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        signal.pause()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not os.path.isabs(argv[0]):
        print("usage: python -m testbed.common.holder BASE", file=sys.stderr)
        return 2
    base = Path(argv[0])
    os.chdir("/")
    try:
        make_namespaces(base)
    except OSError as e:
        print(e.strerror or str(e), file=sys.stderr)
        return 1
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        try:
            _mount_proc()
            os.write(w, b"ok")
        except OSError as e:
            os.write(w, (e.strerror or str(e)).encode()[:400])
            os._exit(1)
        os.close(w)
        try:
            init()
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 512).decode(errors="replace")
    if answer != "ok":
        print(answer or "the namespace's init died", file=sys.stderr)
        return 1
    atomic_write(base / "holder.pid", f"{child}\n")
    print(f"ready {child}", flush=True)
    return 0


def _mount_proc() -> None:
    """/proc of the new PID namespace, for every process in the mount namespace: pids read
    there (a ledger's, /proc scans) are the pids those processes signal."""
    if _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        _fail("mounting /proc for the PID namespace")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
