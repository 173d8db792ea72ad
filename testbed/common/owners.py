"""Who may rename what lies under a directory testbed writes in: every folder above it.

A folder protects its entries only from those who cannot write it. Its owner can always
(``chmod``), everyone can where all may write it, and in a sticky one (``/tmp``) its owner
and each entry's owner can rename that entry. Another user who may rename a folder above a
run directory may swap the whole run directory for one of theirs mid-run: the ranks' logs
written through their links, the records into their folder, the zygote's socket theirs.
So a path is safe for the user when **every folder above it belongs to the user or to
root, and each that all may write is sticky** (:func:`check_above`); group write is
trusted as the file system trusts it (a project's shared folder). The walk opens each
folder from ``/`` down by descriptor (``O_PATH | O_NOFOLLOW``), so what it judges is what
the path names, and a folder swapped meanwhile is a link it refuses.

Inside an ordinary user's rootless namespaces the user is uid 0 and every other owner,
root's and another user's alike, is the overflow uid: a ``stat`` there cannot tell ``/tmp``
from a sticky folder of Mallory's. So :func:`testbed.common.rootless.enter` forks an
**oracle** before it joins them (:func:`start_oracle`): a process that stays outside, holds
nothing of the command's, and answers the real owner and mode of a folder handed to it by
descriptor over a socket pair (SCM_RIGHTS). It ends when the last process holding the
pair's other end does: not with the command that entered, whose child inside still cleans up
(and asks) after a `kill -9` of it; it ignores the terminal's signals for the same reason. Without an oracle inside a
user namespace (a program of the user's own, started there), an owner that is the overflow
uid counts as root's for a folder that only its owner may write and is refused for one
that all may write (whose it is cannot be told).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import stat
import struct
import threading
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.outside import keep_only

_FACTS = struct.Struct("qqq")
"""The oracle's answer: uid, mode, and the user's own uid as the host knows it."""
_oracle: socket.socket | None = None
_lock = threading.Lock()


class UnsafeDirectory(TestbedError):
    """A directory testbed would write into belongs to, or is writable by, someone else."""


def in_user_namespace() -> bool:
    """True when this process is not in the initial user namespace (its uid map is not the
    identity over all ids)."""
    try:
        with open("/proc/self/uid_map", "rb") as f:
            first = f.read(4096).split(b"\n", 1)[0].split()
    except OSError:
        return False
    return first != [b"0", b"0", b"4294967295"]


@functools.cache
def overflow_uid() -> int:
    """The uid every owner not mapped into this user namespace shows as."""
    try:
        with open("/proc/sys/kernel/overflowuid") as f:
            return int(f.read(16))
    except (OSError, ValueError):
        return 65534


def who(uid: int) -> str:
    """``uid N``, said plainly where it is an owner outside the user's rootless namespaces."""
    if uid == overflow_uid() and in_user_namespace():
        return f"uid {uid} (root or another user: owners outside your rootless namespaces look alike)"
    return f"uid {uid}"


# --------------------------------------------------------------------------- the oracle
def start_oracle() -> None:
    """Fork the oracle (before the caller joins a user namespace); this process and its
    children ask it through :data:`_oracle`. The oracle keeps no other descriptor of ours
    (a lock held by a copy of ours would outlive the command)."""
    global _oracle
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.fork() != 0:
        theirs.close()
        _oracle = mine
        return
    try:  # it ends when every asker has closed its end, not with the command that entered: that
        # command's child inside goes on cleaning up after a `kill -9` of its parent, and asks
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        keep_only(theirs.fileno())
        _answer(theirs)
    finally:
        os._exit(0)


def forget_oracle() -> None:
    """This process no longer asks (the command that entered, once its child does the work:
    the oracle then ends with that child)."""
    global _oracle
    if _oracle is not None:
        _oracle.close()
        _oracle = None


def _answer(conn: socket.socket) -> None:
    """Each message carries one descriptor; the answer is its owner and mode as the host
    sees them. Ends when every asker has closed its end."""
    me = os.getuid()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(conn, 16, 1)
        except OSError:
            return
        if not data and not fds:
            return
        reply = b""
        for fd in fds:
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                reply = _FACTS.pack(st.st_uid, st.st_mode, me)
            os.close(fd)
        try:
            conn.send(reply)
        except OSError:
            return


def facts(fd: int) -> tuple[int, int, int]:
    """(owner, mode, the user's uid) of the open file ``fd``, as the host sees them: through
    the oracle where this process has one, else its own ``fstat``."""
    if _oracle is not None:
        with _lock:
            try:
                socket.send_fds(_oracle, [b"?"], [fd])
                reply = _oracle.recv(64)
            except OSError:
                reply = b""
        if len(reply) == _FACTS.size:
            uid, mode, me = _FACTS.unpack(reply)
            return uid, mode, me
        raise UnsafeDirectory("cannot tell who owns the folders above where testbed writes: the process that "
                              "answers it outside your rootless namespaces has gone", "run the command again")
    st = os.fstat(fd)
    return st.st_uid, st.st_mode, os.geteuid()


# --------------------------------------------------------------------------- the walk
def check_above(path: Path, flag: str = "--out") -> None:
    """:class:`UnsafeDirectory` unless no user but this one and root may rename anything
    on the way to ``path``: every existing folder above it (module docstring). Folders not
    made yet are not judged (the caller makes them: they are the user's)."""
    real = Path(os.path.realpath(path))
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here = Path("/")
        _judge(here, fd, flag)
        for name in real.parent.parts[1:]:
            try:
                nfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                return
            except OSError as e:
                raise UnsafeDirectory(f"{here / name} is not a folder testbed can judge ({e.strerror}): it changed "
                                      "while testbed looked at it", f"{flag} a directory inside one of your own") \
                    from None
            os.close(fd)
            fd, here = nfd, here / name
            _judge(here, fd, flag)
    finally:
        os.close(fd)


def _judge(folder: Path, fd: int, flag: str) -> None:
    uid, mode, me = facts(fd)
    hint = f"{flag} a directory whose every folder above is yours or root's"
    unknown = _oracle is None and uid == overflow_uid() and in_user_namespace()
    if uid not in (me, 0) and not unknown:
        raise UnsafeDirectory(f"{folder} belongs to {who(uid)}, who may rename anything in it, so what testbed "
                              "writes below it could be swapped", hint)
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise UnsafeDirectory(f"{folder} is writable by all and not sticky (mode {stat.S_IMODE(mode):o}), so "
                              "anyone may rename what is in it", hint)
    if unknown and mode & stat.S_IWOTH:
        raise UnsafeDirectory(f"{folder} belongs to {who(uid)} and all may write it: whose it is cannot be told "
                              "from here", f"run it through the `testbed` command, or {hint}")


def make_dirs(path: Path, flag: str, mode: int = 0o755) -> Path:
    """``path`` and its missing parents made (``mkdir -p``), once the folders above it are
    judged safe (:func:`check_above`), and judged again once made: a cache testbed fills."""
    check_above(path, flag)
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    check_above(path, flag)
    return path
