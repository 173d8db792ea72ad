"""A node of a Slurm job as a host of a multi-host testbed: the SSH host's counterpart with
``srun`` as the transport (no SSH keys, no sshd on the nodes).

Everything the controller asks of the node runs as a job step on it, ``srun --jobid=JOB
--overlap --nodes=1 --ntasks=1 --nodelist=NODE``, and talks over the step's stdin/stdout
exactly as it would over an SSH channel:

* :class:`SlurmRemote` — ``testbed _host OP`` as one step per request (its JSON payload on
  stdin, its answer on stdout): probe, apply, down, rundir; and the run's files
  (:mod:`testbed.hosts.slurm.files`, a step that serves them, in place of SFTP).
* :class:`SlurmAgent` — the long-lived ``testbed _host serve NAME`` as one step, one JSON
  line each way (counters at 1 Hz, shapes, why a rank stopped).
* :class:`SlurmSite` — the Site of such a host; ranks start through
  ``python -m testbed.hosts.slurm.relay`` (``srun`` bound to the launcher's life).

Steps run with ``--overlap`` (they share the node with each other and with the job's own
steps) and ``--export`` of a few variables only, so nothing of the controller's testbed
settings (``TESTBED_STATE_DIR``) reaches the node. Each runs in its own session: a Ctrl-C
typed at the controller reaches the controller only, which ends its steps itself (SIGTERM
to ``srun``, which cancels the step). Lines of 1024 bytes or more cost about 44 ms per
direction on srun's I/O stream (measured, ``docs/slurm.md``); the agent's requests and
answers are short.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from typing import IO, BinaryIO

from testbed.common import lines, procs, rootless, slurmenv
from testbed.common.digits import is_ascii_int
from testbed.hosts.answer import parse_answer
from testbed.common.errors import StateError, TestbedError
from testbed.hosts.site import SshSite
from testbed.hosts.slurm.files import FilesClient
from testbed.hosts.slurm.step import STOP_WAIT_S, host_argv, start, step_argv, stop
from testbed.model.hosts import Host

JOB_ENDED = ("Unable to confirm allocation for job", "has expired", "has already completed")
"""What ``srun --jobid`` says of a job that has ended (soon after; once purged; or never was)."""


def answer_of(host: Host, op: str, status: int, out: bytes, err: bytes, timeout: float | None) -> dict:
    """A ``testbed _host`` step's JSON answer, or its error as a TestbedError naming the host."""
    try:
        got = json.loads(out.decode() or "null")
    except (UnicodeDecodeError, json.JSONDecodeError):
        got = None
    if status == 0 and isinstance(got, dict):
        return got
    if isinstance(got, dict) and isinstance(got.get("error"), str):
        raise TestbedError(f"host {host.name}: {got['error']}", got.get("hint"))
    tail = (err or out).decode(errors="replace").strip()[-600:]
    if "No such file" in tail and host.testbed in tail:
        raise StateError(f"host {host.name}: the testbed program {host.testbed!r} is not on node {host.slurm}",
                         "install testbed there at the same path (a shared filesystem), or set hosts[].testbed:")
    what = f"did not end within {timeout or 0:g} s" if status == -1 else f"exit {status}"
    raise TestbedError(f"host {host.name} (Slurm node {host.slurm}): `testbed _host {op}` failed ({what}): "
                       f"{tail or 'no output'}")


def _wait_answer(proc: subprocess.Popen, out: IO[bytes], holds: bool, timeout: float | None) -> int:
    """The step's exit status; 0 as soon as a step that ``holds`` has written its answer's
    line (it stays); -1 when ``timeout`` passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.01
    while True:
        try:
            return proc.wait(pause)
        except subprocess.TimeoutExpired:
            pass
        if holds and os.pread(out.fileno(), lines.MAX_LINE, 0).endswith(b"\n"):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            return -1
        pause = min(pause * 1.5, 0.2)


class SlurmRemote:
    """One node's ``testbed _host`` commands, each a step (the SSH host's ``Remote``)."""

    def __init__(self, host: Host):
        self.host = host

    def call(self, op: str, *args: str, payload: object = None, timeout: float | None = 600.0) -> dict:
        """``testbed _host OP ARGS`` there with ``payload`` as JSON on stdin; its answer.

        If the job that built the testbed has ended (``scancel``, its time limit) and this
        runs in another job, the node is reached through this one: ``testbed down`` inside
        a new allocation of the same nodes removes what the shares left there."""
        data = json.dumps(payload).encode() if payload is not None else b""
        holds = op == "apply"  # the share's processes live in its step: it stays until `down`
        if holds:
            args = (*args, "--hold")
        status, out, err = self.step(host_argv(self.host, op, *args), data, timeout, holds)
        if status != 0 and any(s in err.decode(errors="replace") for s in JOB_ENDED):
            if op == "down" and rootless.active():  # an ordinary user's share lived in the job's steps
                return {"removed": [], "ended_with_job": self.host.slurm_job}
            current = slurmenv.job_id()  # a value that is no job id is refused by name
            if current is None or current == self.host.slurm_job:
                node = self.host.slurm
                raise StateError(f"Slurm job {self.host.slurm_job} has ended, so node {node} cannot be reached "
                                 f"through it (run this again inside an allocation that includes {node})",
                                 f"e.g. salloc -w {node} ..., then the same command: its steps reach the node")
            self.host = replace(self.host, slurm_job=current)
            status, out, err = self.step(host_argv(self.host, op, *args), data, timeout, holds)
        return answer_of(self.host, op, status, out, err, timeout)

    def step(self, argv: list[str], data: bytes = b"", timeout: float | None = 600.0,
             holds: bool = False) -> tuple[int, bytes, bytes]:
        """Run one step; (status, stdout, stderr), status -1 when ``timeout`` passed first.
        A step that ``holds`` (``apply --hold``: answers a line and stays) is left running
        once it has answered, with status 0: it ends when the share is removed, or with the job."""
        out_f, err_f = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        with out_f, err_f:
            proc = start(argv, detach=holds, stdin=subprocess.PIPE, stdout=out_f, stderr=err_f)
            try:
                assert proc.stdin is not None
                proc.stdin.write(data)
                proc.stdin.close()
                status = _wait_answer(proc, out_f, holds, timeout)
            except BaseException:  # interrupted: the step ends with us
                stop(proc)
                raise
            if status == -1:
                stop(proc)
            out_f.seek(0)
            err_f.seek(0)
            return status, out_f.read(lines.MAX_LINE), err_f.read(lines.MAX_LINE)

    def failure(self, doing: str, error: BaseException) -> TestbedError:
        return TestbedError(f"host {self.host.name} (Slurm node {self.host.slurm}): {doing} failed: {error}")

    def require_root(self) -> None:
        status, out, err = self.step(step_argv(self.host, ["id", "-u"]), timeout=60)
        uid = out.decode(errors="replace").strip()
        if status != 0 or not is_ascii_int(uid, 10):
            raise StateError(f"host {self.host.name}: `id -u` as a step on node {self.host.slurm} failed: "
                             f"{(err or out).decode(errors='replace').strip()[-300:]}")
        if uid != "0":
            raise StateError(f"host {self.host.name}: the job's steps run as uid {uid} on node {self.host.slurm}, "
                             "not root", "run testbed as the job's own user, without sudo: each node's share is then "
                             "built in that user's rootless namespaces, the links between nodes user-space tunnels "
                             "(docs/slurm.md)")

    def open_sftp(self) -> FilesClient:
        """What a run's file copies use (a file step, in place of SFTP)."""
        return FilesClient(self.host)

    def close(self) -> None:
        pass


class SlurmAgent:
    """Requests to testbed ``name``'s agent on the node (one step, kept), one at a time."""

    def __init__(self, remote: SlurmRemote, name: str):
        self.remote, self.name = remote, name
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._reader: BinaryIO | None = None
        self._err: IO[bytes] | None = None
        self._lock = threading.Lock()

    def ask(self, op: str, payload: object = None, timeout: float = 60.0) -> dict:
        """The agent's answer to ``op``; its error re-raised naming the host."""
        host = self.remote.host
        line = lines.encode({"op": op, "payload": payload})
        with self._lock:
            try:
                sock = self._open()
                sock.settimeout(timeout)
                sock.sendall(line)
                assert self._reader is not None
                try:
                    got = lines.read_line(self._reader)
                except EOFError as e:
                    raise EOFError(f"the agent ended ({self._ended()})" if str(e) == lines.ENDED else str(e)) \
                        from None
            except (OSError, EOFError) as e:  # socket.timeout is an OSError
                self._drop()
                if isinstance(e, socket.timeout):
                    raise TestbedError(f"host {host.name}: `testbed _host serve` gave no answer to {op} within "
                                       f"{timeout:g} s") from None
                raise self.remote.failure(f"asking its agent for {op}", e) from None
        return parse_answer(host.name, op, got)

    def _open(self) -> socket.socket:
        """The step, its stdin and stdout one end of a socket pair (the other end is ours)."""
        if self._sock is None:
            ours, theirs = socket.socketpair()
            self._err = tempfile.TemporaryFile()
            try:
                self._proc = start(host_argv(self.remote.host, "serve", self.name), stdin=theirs, stdout=theirs,
                                   stderr=self._err)
            finally:
                theirs.close()
            self._sock, self._reader = ours, ours.makefile("rb")
        return self._sock

    def _ended(self) -> str:
        proc = self._proc
        if proc is None:
            return "no exit status"
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            return "no exit status"
        err = b""
        if self._err is not None:
            self._err.seek(0)
            err = self._err.read()[-300:]
        return f"exit {proc.returncode}" + (f": {err.decode(errors='replace').strip()}" if err.strip() else "")

    def _drop(self) -> None:
        if self._sock is not None and self._reader is not None:
            self._reader.close()
            self._sock.close()  # end of input: the agent exits, and its step with it
        if self._proc is not None:
            try:
                self._proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                stop(self._proc)
        if self._err is not None:
            self._err.close()
        self._sock = self._reader = self._proc = self._err = None

    def close(self) -> None:
        with self._lock:
            self._drop()


class SlurmSite(SshSite):
    """A node of the Slurm job as a host of the testbed: the SSH host's Site with its
    transport, agent and rank relay over ``srun``."""

    def __init__(self, tb, host: str):
        super().__init__(tb, host)
        self._remote: SlurmRemote | None = None  # type: ignore[assignment]
        self._session: SlurmAgent | None = None  # type: ignore[assignment]

    @property
    def remote(self) -> SlurmRemote:
        if self._remote is None:
            self._remote = SlurmRemote(self.spec)
        return self._remote

    @property
    def agent(self) -> SlurmAgent:
        if self._session is None:
            self._session = SlurmAgent(self.remote, self.tb.name)
        return self._session

    def relay(self, node, argv, *, python=False, run=None, env=None, mounts=()):
        """Argv that runs ``argv`` in ``node`` there: ``testbed _host exec`` as a step,
        through :mod:`testbed.hosts.slurm.relay` (it ends with the launcher)."""
        opts = (["--python"] if python else []) + ([f"--run={run}"] if run else [])
        opts += [f"--env={k}={v}" for k, v in (env or {}).items()] + [f"--mount={m}" for m in mounts]
        return procs.python_argv("testbed.hosts.slurm.relay",
                                 *host_argv(self.spec, "exec", self.tb.name, node, *opts, "--", *argv))
