"""A run's files on a node of the Slurm job, in place of SFTP (:mod:`testbed.hosts.slurm.host`).

:class:`FilesClient` offers the part of paramiko's SFTP client that the run's copies use
(:class:`testbed.hosts.runplace.RemoteRun`, the training-start watch): ``put``, ``mkdir``,
``listdir_attr``, ``open(path, "rb")``, ``stat``, ``get_channel().settimeout``. Each call is
one JSON line each way to ``python -m testbed.hosts.slurm.files`` (:func:`serve`), a step
on the node started on first use and ended by :meth:`FilesClient.close` (end of input).
File contents travel base64-encoded, a read at most :data:`CHUNK` bytes; paths must be
absolute, without ``..``. The lines are the one protocol's (:mod:`testbed.common.lines`).
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

from testbed.common import lines, procs
from testbed.hosts.slurm import step as slurmstep

CHUNK = 32 << 20
"""Bytes of a file one read answers at most (base64: 43 MiB, within the protocol's line)."""
TIMEOUT_S = 120.0


def _path(p: object) -> str:
    if not isinstance(p, str) or not p.startswith("/") or "\0" in p or ".." in Path(p).parts:
        raise ValueError(f"not an absolute path: {str(p)[:80]!r}")
    return p


def handle(req: dict) -> dict:
    """One request's answer (an operating system's error with its ``errno``)."""
    op = req.get("op")
    try:
        path = _path(req.get("path"))
        if op == "put":
            data = base64.b64decode(req.get("data") or "")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return {}
        if op == "mkdir":
            os.mkdir(path, 0o700)
            return {}
        if op == "list":
            out = []
            for e in os.scandir(path):
                s = e.stat(follow_symlinks=False)
                out.append([e.name, s.st_mode, s.st_size, s.st_mtime])
            return {"entries": out}
        if op == "read":
            with open(path, "rb") as f:
                f.seek(int(req.get("offset") or 0))
                return {"data": base64.b64encode(f.read(CHUNK)).decode()}
        if op == "stat":
            return {"mtime": os.stat(path).st_mtime}
        raise ValueError(f"unknown operation {op!r}")
    except OSError as e:
        return lines.error(f"{op} {req.get('path')}: {e.strerror}", kind="OSError", errno=e.errno)
    except (ValueError, TypeError) as e:
        return lines.error(str(e), kind=type(e).__name__)


def serve(stdin=None, stdout=None) -> int:
    return lines.serve(handle, stdin, stdout)


class FilesClient:
    """The node's files, as paramiko's SFTPClient offers them (the part used)."""

    def __init__(self, host):
        self.host = host
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair()
        self._err = tempfile.TemporaryFile()
        python = os.path.join(os.path.dirname(host.testbed), "python") if host.testbed.startswith("/") else "python3"
        argv = procs.python_argv("testbed.hosts.slurm.files", python=python)
        try:
            self._proc = slurmstep.start(slurmstep.step_argv(host, argv),
                                     stdin=theirs, stdout=theirs, stderr=self._err)
        finally:
            theirs.close()
        self._sock = ours
        self._sock.settimeout(TIMEOUT_S)
        self._reader = ours.makefile("rb")

    def _ask(self, op: str, path: str, **more) -> dict:
        with self._lock:
            self._sock.sendall(lines.encode({"op": op, "path": path, **more}))
            try:
                got = lines.read_line(self._reader)
            except EOFError as e:
                raise EOFError(f"the file step on node {self.host.slurm} ended ({e})") from None
        answer = json.loads(got)
        if "error" in answer:
            if answer.get("errno") == 2:
                raise FileNotFoundError(2, answer["error"])
            raise OSError(answer.get("errno"), answer["error"])
        return answer

    def put(self, local: str, remote: str) -> None:
        self._ask("put", remote, data=base64.b64encode(Path(local).read_bytes()).decode())

    def mkdir(self, path: str) -> None:
        self._ask("mkdir", path)

    def listdir_attr(self, path: str) -> list:
        return [SimpleNamespace(filename=n, st_mode=m, st_size=s, st_mtime=t)
                for n, m, s, t in self._ask("list", path)["entries"]]

    def stat(self, path: str):
        return SimpleNamespace(st_mtime=self._ask("stat", path)["mtime"])

    def open(self, path: str, mode: str = "rb") -> "_Remote":
        if mode != "rb":
            raise ValueError("only reading")
        return _Remote(self, path)

    def get_channel(self):
        return self._sock

    def close(self) -> None:
        self._reader.close()
        self._sock.close()
        try:
            self._proc.wait(slurmstep.STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            slurmstep.stop(self._proc)
        self._err.close()


class _Remote(io.RawIOBase):
    """A node's file opened for reading: ``seek`` then ``read`` (the rest, a chunk a request)."""

    def __init__(self, client: FilesClient, path: str):
        self.client, self.path, self.offset = client, path, 0

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0:
            raise ValueError("only absolute seeks")
        self.offset = offset
        return offset

    def read(self, size: int = -1) -> bytes:
        out = b""
        while size < 0 or len(out) < size:
            data = base64.b64decode(self.client._ask("read", self.path, offset=self.offset)["data"])
            self.offset += len(data)
            out += data
            if len(data) < CHUNK:
                break
        if size >= 0 and len(out) > size:  # what was read past ``size`` is read again next time
            self.offset -= len(out) - size
            out = out[:size]
        return out

    def readable(self) -> bool:
        return True


def main() -> int:
    """Serve on the step's stdin/stdout; an ordinary user's files (their runs' directories
    are in the state directory of their rootless namespaces on this node) from inside them."""
    from testbed.hosts import agentns

    entered = agentns.enter()
    try:
        return serve()
    finally:
        agentns.leave(entered)


if __name__ == "__main__":
    sys.exit(main())
