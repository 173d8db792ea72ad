"""Processes started outside the user's rootless namespaces, for a command working inside them.

Inside the rootless user namespace the user is uid 0, and a program that sends its uid to
a service outside gets refused: ``srun`` asks slurmctld for a step of the user's job as uid
0 ("Invalid user id"). So before :func:`testbed.common.rootless.enter` joins the namespaces
it forks a **spawner** that stays outside (:func:`start`): it listens on a Unix socket in
BASE (the user's private directory, 0700; each connection's peer must be this user) and
starts what a command inside asks for (:func:`popen`), with the stdin, stdout and stderr
the asker hands over (SCM_RIGHTS), in a session of its own. Each process has its own
connection: the spawner answers its pid, passes on the signals the asker sends, and writes
its exit status when it ends. When the asker's connection closes (it exited, or was killed)
the spawner ends the process (SIGTERM), unless it was started ``detach``-ed (a Slurm step
that holds a host's share until ``down``). The spawner ends with the command that entered,
ending what it started that is not detached.

Only what the Slurm transport runs goes through it (:mod:`testbed.hosts.slurm.step`); it
gives nothing the user does not have outside (their own uid, no capability).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
from pathlib import Path
from typing import IO, Any

ENV = "TESTBED_OUTSIDE"
"""The spawner's socket path, set for what the command inside starts."""
MAX_MESSAGE = 1 << 20
_SO_PEERCRED = struct.Struct("3i")


def socket_path() -> str | None:
    return os.environ.get(ENV) or None


# --------------------------------------------------------------------------- the spawner
def start(base: Path) -> str:
    """Fork the spawner (before the caller joins any namespace); its socket's path."""
    path = str(base / f"outside-{os.getpid()}.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    owner = os.getpid()
    if os.fork() != 0:
        listener.close()
        return path
    try:  # the spawner: ends with its parent, the command that entered
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        keep_only(listener.fileno())
        _Spawner(listener, owner).serve()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os._exit(0)


def keep_only(fd: int) -> None:
    """Close every descriptor but ``fd`` (the command's locks and pipes are not the
    spawner's to hold); stdin, stdout and stderr become /dev/null."""
    null = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    os.close(null)
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2 and int(name) != fd:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(int(name))


class _Spawner:
    def __init__(self, listener: socket.socket, owner: int):
        self.listener, self.owner = listener, owner
        self.sel = selectors.DefaultSelector()
        self.procs: dict[socket.socket, tuple[subprocess.Popen, bool, int]] = {}
        """Connection -> (process, detached, its pidfd)."""

    def serve(self) -> None:
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        owner_fd = os.pidfd_open(self.owner)
        self.sel.register(owner_fd, selectors.EVENT_READ, None)
        while True:
            for key, _ in self.sel.select():
                if key.data is None:  # the command that entered has ended
                    self._end_all()
                    return
                key.data(key.fileobj)

    def _accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        uid = _SO_PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _SO_PEERCRED.size))[1]
        if uid != os.getuid():
            conn.close()
            return
        fds: list[int] = []
        try:
            msg, fds = _recv(conn)
            if msg is None:
                raise ValueError("no request")
            proc = self._spawn(msg, fds)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            try:
                _send(conn, {"error": f"{type(e).__name__}: {e}"})
            except OSError:
                pass
            conn.close()
            return
        finally:
            for fd in fds:  # the process has its own copies
                os.close(fd)
        pidfd = os.pidfd_open(proc.pid)
        self.procs[conn] = (proc, bool(msg.get("detach")), pidfd)
        _send(conn, {"pid": proc.pid})
        self.sel.register(conn, selectors.EVENT_READ, self._from_asker)
        self.sel.register(pidfd, selectors.EVENT_READ, lambda _fd, c=conn: self._exited(c))

    @staticmethod
    def _spawn(msg: dict, fds: list[int]) -> subprocess.Popen:
        argv = msg["argv"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a list of strings")
        stdin, stdout, stderr = (fds[i] if i is not None else subprocess.DEVNULL for i in msg["std"])
        return subprocess.Popen(argv, env=msg.get("env"), cwd=msg.get("cwd") or "/", start_new_session=True,
                                stdin=stdin, stdout=stdout, stderr=stderr)

    def _from_asker(self, conn: socket.socket) -> None:
        proc, detached, _ = self.procs[conn]
        try:
            msg, fds = _recv(conn)
        except (OSError, ValueError):
            msg, fds = None, []
        for fd in fds:
            os.close(fd)
        if msg is None:  # the asker is gone
            self.sel.unregister(conn)
            conn.close()
            if not detached and proc.poll() is None:
                proc.terminate()
            return
        sig = msg.get("signal")
        if isinstance(sig, int) and proc.poll() is None:
            proc.send_signal(sig)

    def _exited(self, conn: socket.socket) -> None:
        proc, _, pidfd = self.procs.pop(conn)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        code = proc.wait()
        if conn.fileno() >= 0:  # the asker is still there
            try:
                _send(conn, {"exit": code})
            except OSError:
                pass
            self.sel.unregister(conn)
            conn.close()

    def _end_all(self) -> None:
        for proc, detached, _ in self.procs.values():
            if not detached and proc.poll() is None:
                proc.terminate()


# --------------------------------------------------------------------------- the asker
class Process:
    """A process the spawner started: as much of :class:`subprocess.Popen` as the Slurm
    transport uses (``pid`` is the spawner's view of it)."""

    def __init__(self, argv: list[str], conn: socket.socket, pid: int, pipes: dict[str, Any]):
        self.args, self._conn, self.pid = argv, conn, pid
        self.returncode: int | None = None
        self.stdin: IO[bytes] | None = pipes.get("stdin")
        self.stdout: IO[bytes] | None = pipes.get("stdout")
        self.stderr: IO[bytes] | None = pipes.get("stderr")

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._read(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def _read(self, timeout: float | None) -> None:
        self._conn.settimeout(timeout)
        try:
            msg, fds = _recv(self._conn)
        except (BlockingIOError, socket.timeout):
            return
        except (OSError, ValueError):
            msg, fds = None, []
        for fd in fds:
            os.close(fd)
        code = msg.get("exit") if isinstance(msg, dict) else None
        self.returncode = code if isinstance(code, int) else -signal.SIGKILL  # the spawner is gone: so is it

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                _send(self._conn, {"signal": int(sig)})
            except OSError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen(argv: list[str], stdin: Any = None, stdout: Any = None, stderr: Any = None, env: dict | None = None,
          detach: bool = False) -> Process:
    """Start ``argv`` outside the namespaces (``stdin``/``stdout``/``stderr``: None for
    /dev/null, ``subprocess.PIPE``, a file object, a socket or a descriptor)."""
    path = socket_path()
    if path is None:
        raise OSError("no spawner outside the rootless namespaces (not entered, or not in a Slurm job)")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(path)
    pipes: dict[str, Any] = {}
    fds: list[int] = []
    std: list[int | None] = []
    close_after: list[int] = []
    for name, v in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
        if v is None:
            std.append(None)
            continue
        if v == subprocess.PIPE:
            r, w = os.pipe()
            ours, theirs = (w, r) if name == "stdin" else (r, w)
            pipes[name] = os.fdopen(ours, "wb" if name == "stdin" else "rb")
            close_after.append(theirs)
            fd = theirs
        else:
            fd = v if isinstance(v, int) else v.fileno()
        std.append(len(fds))
        fds.append(fd)
    try:
        _send(conn, {"argv": list(argv), "env": dict(os.environ if env is None else env), "std": std,
                     "detach": detach, "cwd": "/"}, fds)
    finally:
        for fd in close_after:
            os.close(fd)
    conn.settimeout(30.0)
    msg, got = _recv(conn)
    for fd in got:
        os.close(fd)
    if not isinstance(msg, dict) or not isinstance(msg.get("pid"), int):
        conn.close()
        raise OSError(f"the spawner outside could not start {argv[0]}: "
                      f"{msg.get('error') if isinstance(msg, dict) else 'no answer'}")
    return Process(list(argv), conn, msg["pid"], pipes)


# --------------------------------------------------------------------------- the wire
def _send(conn: socket.socket, msg: dict, fds: list[int] = ()) -> None:  # type: ignore[assignment]
    data = json.dumps(msg).encode()
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    conn.sendmsg([data], anc)


def _recv(conn: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the descriptors it carries; (None, []) at end of stream."""
    data, anc, _flags, _addr = conn.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(3 * 4))
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(payload[:len(payload) - len(payload) % a.itemsize])
            fds.extend(a)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    msg = json.loads(data)
    if not isinstance(msg, dict):
        raise ValueError("a message is not a JSON object")
    return msg, fds
