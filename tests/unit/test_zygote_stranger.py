"""Issue 56: a rank's client hands its environment and descriptors only to the run's own
zygote. A socket at the zygote's path whose listener is another user's process, or another
process of the user than the run's, gets nothing; the rank starts by itself (one line)."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from testbed.common.procs import python_argv


def _listen(path: str, uid: int | None) -> tuple[int, int]:
    """A forked listener on ``path`` (as ``uid`` when given): (its pid, the read end of a
    pipe that gets the bytes and the count of descriptors any client sent it)."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.bind(path)
            if uid is not None:  # bound here, listening as them: SO_PEERCRED is the listener's
                os.chown(path, uid, uid)
                os.setgid(uid)
                os.setuid(uid)
            s.listen(4)
            os.write(ready_w, b"x")
            conn, _ = s.accept()
            conn.settimeout(20)
            try:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 16)
            except OSError:
                data, fds = b"", []
            os.write(w, f"{len(data)} {len(fds)}".encode())
        finally:
            os._exit(0)
    os.close(w)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    return pid, r


def _client(path: str, run_pid: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESTBED_ZYGOTE_SOCKET=path, TESTBED_DIE_WITH_PARENT=str(run_pid))
    return subprocess.run(python_argv("testbed.nodes.zygote.client", "platform"), env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="listens as another user (setuid): root only")
def test_a_zygote_socket_of_another_user_gets_nothing(tmp_path):
    path = str(tmp_path / "zygote.sock")
    pid, got = _listen(path, 65534)
    r = _client(path, os.getpid())
    os.waitpid(pid, 0)
    assert os.read(got, 64).decode() == "0 0", "the client sent the rank's request to another user's socket"
    assert r.returncode == 0 and r.stdout.strip(), r.stderr  # the rank (here: `python -m platform`) ran by itself
    assert "started without the zygote" in r.stderr and "is served by uid 65534, not by you" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_zygote_socket_of_another_process_than_the_runs_gets_nothing(tmp_path):
    path = str(tmp_path / "zygote.sock")
    pid, got = _listen(path, None)
    r = _client(path, os.getpid())  # the run is this process; the listener is not
    os.waitpid(pid, 0)
    assert os.read(got, 64).decode() == "0 0", "the client sent the rank's request to a stranger"
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert f"is served by pid {pid}, not by the run's own process (pid {os.getpid()})" in r.stderr, r.stderr
