"""The run's zygote: torch imported once, every local netns rank forked from it.

``python -m testbed.nodes.zygote.server --fd FD MODULE [--preload torch,torch.distributed,...]``
    Started by :class:`testbed.nodes.zygote.launcher.Zygote` with the listening socket FD (bound in
    the run directory) and the environment all of the run's ranks share (the variables
    libgomp, OpenBLAS and torch read when they load: OMP_NUM_THREADS, TORCH_FR_BUFFER_SIZE,
    ...). It imports the preloaded modules and MODULE (the workload: its imports stay, the
    module itself is forgotten and runs afresh in each rank, as under ``python -m``),
    checks that CUDA was not initialised (a CUDA context does not survive a fork; each rank
    chooses its GPU after it), freezes what it made for the garbage collector (so that the
    ranks share those pages instead of copying them), then serves.

For each client (:mod:`testbed.nodes.zygote.client`) it checks the peer (SO_PEERCRED: the
same user, or root), the module (MODULE), the interpreter (executable, version, import
path) and the environment variables read at load time (:data:`LOAD_TIME`: a rank whose
value differs from the zygote's is refused); it forks the rank
(:func:`testbed.nodes.zygote.child.become`), waits until the child says it is in place,
answers the client with the rank's pid, passes the client's signals on to the rank's
process group, and reports the rank's wait status once it has reaped it. A client that
goes away takes its rank with it (SIGKILL); the zygote dies with the launcher
(PR_SET_PDEATHSIG, through ``TESTBED_DIE_WITH_PARENT``) and its ranks with it; on SIGTERM it
kills its ranks and exits. Single-threaded: a poll loop over the socket, the clients and a
SIGCHLD wake-up pipe. One line per event goes to its stdout (``zygote.log`` in the run).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import os
import select
import signal
import socket
import struct
import sys
import time

from testbed.nodes.zygote import child as zygote_child
from testbed.nodes.zygote.client import REQUEST_FDS, recv, send

DIE_WITH_PARENT = "TESTBED_DIE_WITH_PARENT"  # testbed.nodes.nsexec's
PRELOAD = "torch,torch.distributed,torch._dynamo,torch._inductor.config"
"""What every rank imports: torch, and dynamo with inductor's config, which
``DistributedDataParallel()`` and ``torch.use_deterministic_algorithms`` import (sympy
with them: about 1.2 s of CPU per rank when each rank imported them after the fork;
`testbed run allreduce` on three_switch, 8 ranks, 12 iterations: 8.3 -> 5.5 s, measured)."""
LOAD_TIME = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO_", "TORCH_", "PYTORCH_",
             "TORCHDYNAMO_", "TORCHINDUCTOR_", "INDUCTOR_", "AOT_", "MALLOC_", "GLIBC_TUNABLES", "LC_", "LANG")
"""Prefixes of the variables read when the interpreter and torch's libraries load: a
client's must equal the zygote's (missing on both sides counts as equal)."""
SETUP_TIMEOUT_S = 10.0


def log(text: str) -> None:
    try:
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)
    except OSError:
        pass  # a full disk: the ranks matter more than this line


def load_time_differences(mine: dict, theirs: dict) -> list[str]:
    """The load-time variables (:data:`LOAD_TIME`) whose values differ."""
    keys = {k for k in (*mine, *theirs) if k.startswith(LOAD_TIME)}
    return sorted(k for k in keys if mine.get(k) != theirs.get(k))


def refusal(req: dict, module: str, env: dict) -> str | None:
    """Why a request cannot be served by this zygote (None: it can)."""
    if req.get("module") != module:
        return f"this zygote runs {module}, not {req.get('module')}"
    if req.get("python") != sys.executable or req.get("version") != sys.version:
        return f"another Python ({req.get('python')}, not {sys.executable})"
    if req.get("path") != sys.path:
        return "another import path (sys.path)"
    if not isinstance(req.get("env"), dict) or not isinstance(req.get("argv"), list):
        return "a malformed request"
    differ = load_time_differences(env, req["env"])
    if differ:
        return f"variables read at load time differ: {', '.join(differ)}"
    return None


def peer(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the client, as SO_PEERCRED gives them at connect time."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _closing(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Client:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.pid: int | None = None
        """The rank's pid while it runs (not yet reaped)."""
        self.rank = "?"
        self.asked = False
        """Its request came (the first message; then only signals)."""


class Server:
    def __init__(self, listener: socket.socket, module: str, env: dict):
        self.listener, self.module, self.env = listener, module, env
        self.clients: dict[int, Client] = {}
        """By the connection's fd."""
        self.ranks: dict[int, Client] = {}
        """By the rank's pid, until reaped."""
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.stopping = False
        self.poll = select.poll()
        self.poll.register(listener.fileno(), select.POLLIN)
        self.poll.register(self.wake_r, select.POLLIN)

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *a: None)  # a handler: the wake-up pipe hears of it
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        while not self.stopping:
            for fd, _ in self.poll.poll():
                if fd == self.listener.fileno():
                    self._accept()
                elif fd == self.wake_r:
                    self._drain()
                    self.reap()
                elif fd in self.clients:
                    self._message(self.clients[fd])
        for pid in list(self.ranks):
            self._kill(pid)
        log(f"stopped; {len(self.ranks)} rank(s) killed")

    def _stop(self, *_) -> None:
        self.stopping = True

    def _drain(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        self.clients[sock.fileno()] = Client(sock)
        self.poll.register(sock.fileno(), select.POLLIN)

    def _close(self, c: Client) -> None:
        fd = c.sock.fileno()
        if self.clients.pop(fd, None) is not None:
            self.poll.unregister(fd)
        c.sock.close()

    def _message(self, c: Client) -> None:
        try:
            msg, fds = recv(c.sock)
        except (OSError, ValueError) as e:
            log(f"client of rank {c.rank}: {e}; dropped")
            msg, fds = None, []
        if msg is None:  # the client went away: its rank goes with it
            if c.pid is not None:
                log(f"rank {c.rank}'s client went away: its process {c.pid} killed")
                self._kill(c.pid)
            self._close(c)
        elif not c.asked:
            c.asked = True
            self._start(c, msg, fds)
        else:
            _closing(fds)
            sig = msg.get("signal")
            if c.pid is not None and isinstance(sig, int):
                self._signal(c.pid, sig)

    def _start(self, c: Client, req: dict, fds: list[int]) -> None:
        try:
            c.rank = str(req.get("env", {}).get("RANK", "?")) if isinstance(req.get("env"), dict) else "?"
            pid, uid = peer(c.sock)
            why = refusal(req, self.module, self.env)
            if uid not in (os.getuid(), 0) or pid <= 0:
                why = f"a client of another user ({uid}) or outside this PID namespace"
            elif len(fds) != REQUEST_FDS:
                why = f"{len(fds)} file descriptors, not {REQUEST_FDS}"
            if why is None:
                why = self._fork(c, req, fds, pid)
            if why is not None:
                log(f"rank {c.rank} (client {pid}) refused: {why}")
                send(c.sock, {"refused": why})
                self._close(c)
        except OSError as e:  # the client went away meanwhile: so does its rank
            log(f"rank {c.rank}: {e}")
            if c.pid is not None:
                self._kill(c.pid)  # reaped as any other
            self._close(c)
        finally:
            _closing(fds)

    def _fork(self, c: Client, req: dict, fds: list[int], client: int) -> str | None:
        """Fork the rank; None once it is in place and runs, else why it does not."""
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        sys.stdout.flush()
        sys.stderr.flush()
        me = os.getpid()
        pid = os.fork()
        if pid == 0:  # the rank
            os.close(ready_r)
            _closing([self.listener.fileno(), self.wake_r, self.wake_w, *self.clients])
            _child(req, fds, client, me, ready_w)
        os.close(ready_w)
        said = _read_all(ready_r, SETUP_TIMEOUT_S)
        os.close(ready_r)
        if said != b"ok":
            self._kill(pid)
            os.waitpid(pid, 0)
            return said.decode(errors="replace") or "the forked rank died before it was in place"
        c.pid = pid
        self.ranks[pid] = c
        send(c.sock, {"pid": pid})
        log(f"rank {c.rank} (client {client}): process {pid} runs {req['module']}")
        return None

    def _signal(self, pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)  # the rank leads its own session and group: its helpers too
        except OSError:
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def _kill(self, pid: int) -> None:
        self._signal(pid, signal.SIGKILL)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            c = self.ranks.pop(pid, None)
            if c is None:
                continue
            log(f"rank {c.rank}: process {pid} ended ({_describe(status)})")
            c.pid = None
            try:
                send(c.sock, {"status": status})
            except OSError:
                pass
            self._close(c)


def _describe(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _read_all(fd: int, timeout: float) -> bytes:
    got, deadline = b"", time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0 and select.select([fd], [], [], left)[0]:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    return got


def _child(req: dict, fds: list[int], client: int, zygote: int, ready: int) -> None:
    """The forked rank: in place (or refused, said on ``ready``), then the workload. Never returns."""
    try:
        zygote_child.become(req, fds, client, zygote)
    except BaseException as e:
        why = str(e) if isinstance(e, zygote_child.Refused) else f"{type(e).__name__}: {e}"
        try:
            os.write(ready, why.encode()[:4000] or b"?")
        finally:
            os._exit(1)
    os.write(ready, b"ok")
    os.close(ready)
    os._exit(zygote_child.run(req["module"], [str(a) for a in req["argv"]]))


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> bool:
    """PR_SET_PDEATHSIG as TESTBED_DIE_WITH_PARENT asks; False when that parent is gone already."""
    want = os.environ.pop(DIE_WITH_PARENT, None)
    if want is None:
        return True
    _libc.prctl(zygote_child.PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == 0 or str(os.getppid()) == want  # 0: a parent outside our PID namespace


def preload(modules: list[str], module: str) -> str | None:
    """Import them; why the zygote cannot serve (None: it can)."""
    for m in [*modules, module]:
        try:
            importlib.import_module(m)
        except BaseException as e:
            return f"importing {m}: {type(e).__name__}: {e}"
    # what it imported stays; the module itself runs afresh in each rank, as under `python -m`,
    # where it is not imported before it runs (runpy warns about one found in sys.modules)
    sys.modules.pop(module, None)
    parent, _, leaf = module.rpartition(".")
    if parent in sys.modules and hasattr(sys.modules[parent], leaf):
        delattr(sys.modules[parent], leaf)
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "importing them initialised CUDA, which a fork does not carry"
    return None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.nodes.zygote.server")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--preload", default=PRELOAD)
    p.add_argument("module")
    a = p.parse_args(argv)
    if not _die_with_parent():
        return 1
    env = dict(os.environ)
    listener = socket.socket(fileno=a.fd)
    t0 = time.monotonic()
    why = preload([m for m in a.preload.split(",") if m], a.module)
    if why is not None:
        log(f"zygote {os.getpid()} cannot serve ({why}): the ranks start without it")
        return 1
    gc.collect()
    gc.freeze()
    threads = len(os.listdir("/proc/self/task"))
    log(f"zygote {os.getpid()}: {', '.join(filter(None, [a.preload, a.module]))} imported in {time.monotonic() - t0:.2f} s; "
        f"{threads} thread(s); serving")
    Server(listener, a.module, env).serve()
    os._exit(0)  # no interpreter shutdown (torch's) for the run's end to wait out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
