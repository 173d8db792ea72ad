"""The agent inside a VM worker's guest, and the wire format it shares with the host.

The guest's init (:data:`testbed.nodes.vm.image.INIT`) starts ``python -m testbed.nodes.vm.agent CONFIG``
once the NICs are up. The agent applies the node's sysctls, then serves one request per
TCP connection on the guest's management NIC (QEMU user networking: reachable only
through the port QEMU forwards to 127.0.0.1 in the node's network namespace on the host,
so only root on the host reaches it; each request also carries the VM's token, a file
readable by root only, compared in constant time).

A request is the first frame (:func:`send` / :func:`recv`), a JSON object
``{"token", "op", ...}``. ``op`` is

* ``exec``: run ``argv`` with ``env`` in ``cwd``; each host directory in ``mounts`` is
  bind-mounted at its own path from the host's writable share, in a private mount
  namespace of the command (the guest's root is a copy-on-write overlay of the host's, so
  only those directories reach the host). Then frames flow both ways (:func:`send` /
  :func:`recv`): stdin, stdin-EOF and signals from the host; stdout, stderr and the exit
  status from the guest. When the host's side goes away (the relay was killed), the
  command's process group is killed: a rank never outlives the run that started it.
  With ``heartbeat: SECONDS`` the agent also sends a HEARTBEAT frame that often while the
  command runs (the first at once), so the host tells a silent command from a hung guest.
* ``stop``: SIGTERM, then SIGKILL after a grace period, to every process but init and the
  agent (``Backend.stop``).
* ``ping``: the agent answers (readiness after boot).

Only the standard library is used: the agent must start before anything else works.
"""

from __future__ import annotations

import ctypes
import hmac
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

STDIN, STDIN_EOF, SIGNAL, STDOUT, STDERR, EXIT, ERROR, REQUEST, HEARTBEAT = range(9)
MAX_REQUEST = 1 << 20
HOST_SHARE = "/run/testbed-host"
"""Where the guest mounts the host's root, writable (source of ``mounts``)."""
GUEST_ADDRESS = "10.0.2.15"
CLONE_NEWNS, MS_BIND, MS_REC, MS_SLAVE = 0x00020000, 0x1000, 0x4000, 1 << 19


def send(sock: socket.socket, kind: int, data: bytes = b"", lock: threading.Lock | None = None) -> None:
    frame = struct.pack(">BI", kind, len(data)) + data
    if lock is None:
        sock.sendall(frame)
    else:
        with lock:
            sock.sendall(frame)


def _exact(sock: socket.socket, n: int, idle: float | None = None) -> bytes | None:
    buf = b""
    while len(buf) < n:
        if idle is not None and not select.select([sock], [], [], idle)[0]:
            raise TimeoutError(f"nothing received for {idle:g} s")
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv(sock: socket.socket, idle: float | None = None) -> tuple[int, bytes] | None:
    """The next frame, or None when the peer closed the connection; TimeoutError when
    nothing at all arrives for ``idle`` seconds (None: wait for ever)."""
    hdr = _exact(sock, 5, idle)
    if hdr is None:
        return None
    kind, n = struct.unpack(">BI", hdr)
    if n > (1 << 24):
        raise ValueError(f"frame of {n} bytes")
    data = _exact(sock, n, idle) if n else b""
    if data is None:
        return None
    return kind, data


# ---------------------------------------------------------------------- guest side


def _private_mounts(mounts: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0 or libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None) != 0:
        raise OSError(ctypes.get_errno(), "private mount namespace")
    for m in mounts:
        os.makedirs(m, exist_ok=True)
        src = (HOST_SHARE + m).encode()
        if libc.mount(src, m.encode(), b"none", MS_BIND | MS_REC, None) != 0:
            raise OSError(ctypes.get_errno(), f"bind-mounting the host's {m}")


def _valid_request(req: object) -> str | None:
    if not isinstance(req, dict):
        return "request is not an object"
    if req.get("op") == "exec":
        argv, env, mounts = req.get("argv"), req.get("env", {}), req.get("mounts", [])
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) and "\0" not in a for a in argv)):
            return "argv must be a non-empty list of strings"
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) and "=" not in k
                                              and "\0" not in k + v for k, v in env.items())):
            return "env must map names to strings"
        if not (isinstance(mounts, list) and all(isinstance(m, str) and m.startswith("/") and ".." not in
                                                 m.split("/") and "\0" not in m for m in mounts)):
            return "mounts must be absolute paths"
        cwd = req.get("cwd")
        if cwd is not None and not (isinstance(cwd, str) and cwd.startswith("/")):
            return "cwd must be an absolute path"
        beat = req.get("heartbeat", 0)
        if isinstance(beat, bool) or not isinstance(beat, (int, float)) or not (beat == 0 or 0.1 <= beat <= 3600):
            return "heartbeat must be 0 or a number of seconds from 0.1 to 3600"
    return None


def _alive(pid: int) -> bool:
    """Running (a zombie is not: orphans wait on PID 1, a shell that reaps at its end)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Agent:
    def __init__(self, config: dict):
        with open(HOST_SHARE + config["token_file"]) as f:
            self.token = f.read().strip()
        self.port = int(config.get("port", 7000))
        self.grace = float(config.get("grace", 5.0))
        for key, value in config.get("sysctls", []):
            with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
                f.write(str(value))

    def serve(self) -> None:
        srv = socket.create_server((GUEST_ADDRESS, self.port), backlog=64)
        print(f"testbed-agent: listening on {GUEST_ADDRESS}:{self.port}", file=sys.stderr, flush=True)
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                frame = recv(conn)
                if frame is None:
                    return
                kind, data = frame
                if kind != REQUEST or len(data) > MAX_REQUEST:
                    send(conn, ERROR, b"the first frame must be a request")
                    return
                req = json.loads(data)
                if not isinstance(req, dict) or not hmac.compare_digest(str(req.get("token", "")), self.token):
                    send(conn, ERROR, b"bad token")
                    return
                problem = _valid_request(req)
                if problem:
                    send(conn, ERROR, problem.encode())
                    return
                op = req.get("op")
                if op == "ping":
                    send(conn, EXIT, b"0")
                elif op == "stop":
                    send(conn, EXIT, str(self.stop_all()).encode())
                elif op == "exec":
                    self.exec(conn, req)
                else:
                    send(conn, ERROR, f"unknown op {op!r}".encode())
        except (OSError, ValueError) as e:
            print(f"testbed-agent: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def _others(self) -> list[int]:
        me, out = os.getpid(), []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) in (1, me):
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if not f.read():
                        continue  # a kernel thread
            except OSError:
                continue
            if int(fields[1]) != 2 and fields[0] != "Z":
                out.append(int(d))
        return out

    def stop_all(self) -> int:
        pids = self._others()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in pids:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + self.grace
            while pids and time.monotonic() < deadline:
                time.sleep(0.05)
                pids = [p for p in pids if _alive(p)]
            if not pids:
                break
        return len(pids)

    def exec(self, conn: socket.socket, req: dict) -> None:
        mounts = list(req.get("mounts", []))
        lock = threading.Lock()
        try:
            proc = subprocess.Popen(req["argv"], env=req.get("env", {}), cwd=req.get("cwd") or "/",
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, close_fds=True,
                                    preexec_fn=(lambda: _private_mounts(mounts)) if mounts else None)
        except (OSError, subprocess.SubprocessError) as e:
            send(conn, ERROR, f"cannot start {req['argv'][0]}: {e}".encode())
            return
        stdin = proc.stdin
        assert stdin is not None  # stdin=PIPE

        def pump(src, kind):
            try:
                while True:
                    data = os.read(src.fileno(), 65536)
                    if not data:
                        break
                    send(conn, kind, data, lock)
            except OSError:
                pass

        pumps = [threading.Thread(target=pump, args=(proc.stdout, STDOUT), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, STDERR), daemon=True)]
        for t in pumps:
            t.start()

        def from_host():
            try:
                while (frame := recv(conn)) is not None:
                    kind, data = frame
                    if kind == STDIN:
                        stdin.write(data)
                        stdin.flush()
                    elif kind == STDIN_EOF:
                        stdin.close()
                    elif kind == SIGNAL:
                        os.killpg(proc.pid, int(data))
            except (OSError, ValueError):
                pass
            if proc.poll() is None:  # the host side is gone: so is the command
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        threading.Thread(target=from_host, daemon=True).start()
        done = threading.Event()
        if req.get("heartbeat"):
            threading.Thread(target=_beat, args=(conn, lock, float(req["heartbeat"]), done), daemon=True).start()
        rc = proc.wait()
        done.set()
        for t in pumps:
            t.join(timeout=5)
        try:
            send(conn, EXIT, str(rc).encode(), lock)
        except OSError:
            pass


def _beat(conn: socket.socket, lock: threading.Lock, every: float, done: threading.Event) -> None:
    """A HEARTBEAT frame every ``every`` seconds (the first at once) until ``done``."""
    while True:
        try:
            send(conn, HEARTBEAT, b"", lock)
        except OSError:
            return
        if done.wait(every):
            return


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m testbed.nodes.vm.agent CONFIG.json", file=sys.stderr)
        return 2
    with open(HOST_SHARE + argv[0]) as f:  # host paths: the guest's /run is its own
        config = json.load(f)
    Agent(config).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
