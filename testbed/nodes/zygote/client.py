"""A rank's start through the run's zygote (:mod:`testbed.nodes.zygote.launcher`), from inside its node.

``python -m testbed.nodes.zygote.client MODULE ARGS...``
    What :mod:`testbed.nodes.nsexec` execs for a rank of a netns worker when ``testbed run``
    started a zygote, in place of ``python -m MODULE ARGS``. Already in the node's network
    and mount namespaces, its cgroup and working directory, with the rank's environment, it
    connects to the zygote's socket (``$TESTBED_ZYGOTE_SOCKET``, in the private run
    directory), checks that its listener is the run's own process and the user's
    (SO_PEERCRED: a socket another user put in its place gets nothing), and hands over, by SCM_RIGHTS, its stdin, stdout and stderr, its working
    directory and its user, mount and network namespaces, with MODULE, ARGS, the environment
    and its umask. The zygote (torch imported once for the whole run) forks the rank into
    all of that. This process stays as the rank's stand-in for the launcher: it forwards
    SIGTERM, SIGINT, SIGHUP and SIGCONT to the rank and ends as the rank ended (its exit
    code, or the signal that killed it); when it dies, the zygote kills the rank.

Whenever the zygote cannot take the rank before it forks it (no socket, a different
Python, another import path, an environment that torch reads at import, a namespace it
cannot enter), this process execs ``python -P -m MODULE ARGS`` itself, as the rank started
before the zygote existed, after one line on stderr saying why. Imports only what the
socket needs: it costs about as much as an empty Python.

The protocol, one JSON object per SOCK_SEQPACKET message: the request (with 7 fds) ->
``{"pid"}`` or ``{"refused": why}``; then ``{"signal"}`` from here, ``{"status"}`` (the raw
wait status) from the zygote once the rank has ended.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

RUN_PID_ENV = "TESTBED_DIE_WITH_PARENT"
"""The run's pid (testbed.nodes.nsexec's name, not imported: this client stays small)."""
SOCKET_ENV = "TESTBED_ZYGOTE_SOCKET"
"""The zygote's socket (set by the launcher; removed here, so the rank never sees it)."""
NAMESPACES = ("user", "mnt", "net")
STDIO_FDS = 3
REQUEST_FDS = STDIO_FDS + 1 + len(NAMESPACES)
"""stdin, stdout, stderr, the working directory, then one fd per namespace."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCONT)
MAX_MESSAGE = 1 << 20
ACCEPT_WAIT_S = 300.0
"""How long to wait for the zygote's answer (it imports torch first) before starting alone."""


def address(path: str) -> tuple[str, int | None]:
    """A name to bind or connect ``path`` by, and a directory fd to close after: a Unix
    socket's name is at most 107 bytes, so a longer path goes through /proc/self/fd."""
    if len(os.fsencode(path)) < 100:
        return path, None
    fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    where, fd = address(path)
    try:
        s.connect(where)
    except BaseException:
        s.close()
        raise
    finally:
        if fd is not None:
            os.close(fd)
    return s


def send(sock: socket.socket, msg: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def recv(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """The next message and the fds it carried (close-on-exec); (None, []) at end of file.
    ValueError for a message that is not one (cut short, not a JSON object)."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, REQUEST_FDS + 1, socket.MSG_CMSG_CLOEXEC)
    if not data and not fds:
        return None, []
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ValueError("a message cut short")
        msg = json.loads(data)
        if not isinstance(msg, dict):
            raise ValueError("a message that is not a JSON object")
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    return msg, fds


def request(module: str, args: list[str]) -> dict:
    """What the zygote needs to know besides the fds (and checks against itself)."""
    mask = os.umask(0)
    os.umask(mask)
    return {"module": module, "argv": args, "env": dict(os.environ), "umask": mask, "python": sys.executable,
            "version": sys.version, "path": sys.path}


def _note(text: str) -> None:
    try:
        print(f"testbed: {text}", file=sys.stderr, flush=True)
    except OSError:
        pass  # a full disk: the rank matters more than this line


class _Forward:
    """The signals that reach this process, passed on to the rank (and remembered)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.got: list[int] = []
        self.old = {s: signal.signal(s, self) for s in FORWARDED}

    def __call__(self, sig, frame) -> None:
        self.got.append(sig)
        try:
            send(self.sock, {"signal": sig})
        except OSError:
            pass  # the zygote is gone: the rank with it; the status (or EOF) comes next

    def restore(self) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)


def through_zygote(path: str, module: str, args: list[str]) -> int | None:
    """The rank's raw wait status once it ended, or None: start it here instead."""
    try:
        sock = connect(path)
    except OSError as e:
        _note(f"started without the zygote: cannot reach {path}: {e.strerror}")
        return None
    with sock:
        stranger = _stranger(sock)
        if stranger:
            _note(f"started without the zygote: {path} {stranger}")
            return None
        fds = [0, 1, 2, os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
        try:
            fds += [os.open(f"/proc/self/ns/{n}", os.O_RDONLY | os.O_CLOEXEC) for n in NAMESPACES]
            send(sock, request(module, args), fds)
        except OSError as e:
            _note(f"started without the zygote: sending the request: {e.strerror}")
            return None
        finally:
            for fd in fds[STDIO_FDS:]:
                os.close(fd)
        forward = _Forward(sock)  # from here a signal is the rank's, even before it runs
        try:
            pid = _accepted(sock)
        except (OSError, ValueError) as e:  # nothing runs: the zygote forks only before it says so
            forward.restore()
            if forward.got:
                return _signalled(forward.got[0])
            _note(f"started without the zygote: {getattr(e, 'strerror', None) or e}")
            return None
        return _status(sock, pid)


def _stranger(sock: socket.socket) -> str | None:
    """Why the socket's listener is not the run's (None: it is): a process of another user,
    or another process than the one that started this rank (``$TESTBED_DIE_WITH_PARENT``,
    the run's own, which bound and listens on the zygote's socket). Nothing is handed over
    to a stranger: not the rank's environment, not its descriptors."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid != os.getuid():
        return f"is served by uid {uid}, not by you"
    run = os.environ.get(RUN_PID_ENV, "")
    if run.isascii() and run.isdigit() and len(run) < 12 and pid != int(run):
        return f"is served by pid {pid}, not by the run's own process (pid {run})"
    return None


def _accepted(sock: socket.socket) -> int:
    """The rank's pid once the zygote forked it; ValueError (why) when it will not."""
    sock.settimeout(ACCEPT_WAIT_S)
    msg, _ = recv(sock)
    if msg is None or "pid" not in msg:
        raise ValueError("the zygote closed the connection" if msg is None
                         else f"the zygote refused: {msg.get('refused', msg)}")
    sock.settimeout(None)
    return int(msg["pid"])


def _status(sock: socket.socket, pid: int) -> int:
    """The rank's wait status, as the zygote reports it once the rank has ended."""
    while True:
        try:
            msg, _ = recv(sock)
        except (OSError, ValueError) as e:
            msg = None
            _note(f"lost the zygote's connection: {e}")
        if msg is None:  # the zygote died (the rank was killed with it), or this end failed:
            _note(f"the zygote went away while the rank (process {pid}) ran")  # closing it kills the rank
            return _signalled(signal.SIGKILL)
        if "status" in msg:
            return int(msg["status"])


def _signalled(sig: int) -> int:
    return sig & 0x7F  # a wait status: killed by ``sig``


def end_like(status: int) -> int:
    """Exit as the rank did: its exit code, or killed by its signal (``nsexec.die_like``)."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code
    sig = -code
    sys.stdout.flush()
    sys.stderr.flush()
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    return 128 + sig


def exec_python(module: str, args: list[str]) -> int:
    """``python -P -m MODULE ARGS`` with this interpreter's own options (as started)."""
    orig = list(getattr(sys, "orig_argv", []))
    options = orig[1:orig.index("-m")] if "-m" in orig else ["-P"]
    argv = [sys.executable, *options, "-m", module, *args]
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        print(f"error: cannot start {argv[0]}: {e.strerror}", file=sys.stderr)
    return 127


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m testbed.nodes.zygote.client MODULE [ARGS...]", file=sys.stderr)
        return 2
    module, args = argv[0], argv[1:]
    path = os.environ.pop(SOCKET_ENV, None)
    if path:
        status = through_zygote(path, module, args)
        if status is not None:
            return end_like(status)
    return exec_python(module, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
