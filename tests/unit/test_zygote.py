"""The run's zygote (testbed.nodes.zygote.launcher*): the protocol between a rank's client and the
fork server, with a real server preloading nothing (no torch, no namespaces: the client is
in the server's own namespaces, which the rank then skips entering), and the pure parts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.nodes.zygote import launcher as zygotes
from testbed.nodes.zygote.child import cgroup_moves, exit_code
from testbed.nodes.zygote.client import SOCKET_ENV, address, connect, recv, request, send
from testbed.nodes.zygote.server import load_time_differences, refusal

PROBE = '''
import json, os, sys, time
mode = sys.argv[1]
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(), "ppid": os.getppid(),
                  "x": os.environ.get("ZX"), "socket": os.environ.get("TESTBED_ZYGOTE_SOCKET"),
                  "name": __name__, "umask": os.umask(0)}), flush=True)
if mode == "exit": sys.exit(int(sys.argv[2]))
if mode == "raise": raise RuntimeError("boom")
if mode == "message": sys.exit("bye")
if mode == "sleep": time.sleep(60)
if mode == "signal": os.kill(os.getpid(), int(sys.argv[2]))
'''


def _env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "mods"), str(Path(__file__).resolve().parents[2])])
    env.update(extra)
    return env


@pytest.fixture
def server(tmp_path):
    """A zygote serving module ``zprobe`` on ``tmp_path/z.sock``; (socket path, log path)."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "zprobe.py").write_text(PROBE)
    path = str(tmp_path / "z.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    log = tmp_path / "zygote.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "testbed.nodes.zygote.server", "--fd",
                                 str(listener.fileno()), "--preload", "", "zprobe"], env=_env(tmp_path),
                                pass_fds=[listener.fileno()], stdout=f, stderr=subprocess.STDOUT)
    listener.close()
    yield path, log
    proc.terminate()
    proc.wait(timeout=30)


def _client(tmp_path: Path, path: str | None, *args: str, popen: bool = False, umask: int = 0o022, **env):
    e = _env(tmp_path, **env)
    if path is not None:
        e[SOCKET_ENV] = path
    argv = [sys.executable, "-P", "-m", "testbed.nodes.zygote.client", "zprobe", *args]
    if popen:
        return subprocess.Popen(argv, env=e, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                umask=umask)
    return subprocess.run(argv, env=e, cwd=tmp_path, capture_output=True, text=True, timeout=120, umask=umask)


def _said(out: str) -> dict:
    return json.loads(out.splitlines()[0])


def test_a_rank_runs_forked_with_the_clients_argv_env_cwd_and_stdio(tmp_path, server):
    path, log = server
    r = _client(tmp_path, path, "exit", "0", umask=0o027, ZX="mine")
    assert r.returncode == 0, r.stderr
    said = _said(r.stdout)
    assert said["argv"] == ["exit", "0"] and said["x"] == "mine" and said["name"] == "__main__"
    assert said["cwd"] == str(tmp_path) and said["socket"] is None  # the socket's variable is the client's
    assert said["umask"] == 0o027
    assert "runs zprobe" in log.read_text() and f"process {said['pid']}" in log.read_text()
    assert r.stderr == ""


@pytest.mark.parametrize("args, code, err", [(("exit", "3"), 3, ""), (("raise",), 1, "RuntimeError: boom"),
                                             (("message",), 1, "bye")])
def test_the_client_exits_as_python_m_would(tmp_path, server, args, code, err):
    r = _client(tmp_path, server[0], *args)
    assert r.returncode == code and err in r.stderr and "without the zygote" not in r.stderr


def test_a_rank_killed_by_a_signal_kills_its_client_with_it(tmp_path, server):
    r = _client(tmp_path, server[0], "signal", str(int(signal.SIGKILL)))
    assert r.returncode == -signal.SIGKILL and "without the zygote" not in r.stderr


def test_sigterm_to_the_client_reaches_the_rank_and_a_killed_client_takes_its_rank(tmp_path, server):
    p = _client(tmp_path, server[0], "sleep", popen=True)
    said = json.loads(p.stdout.readline())
    assert said["ppid"] != p.pid, "the rank is the zygote's child, not the client's"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == -signal.SIGTERM
    assert "killed by signal 15" in server[1].read_text()
    p = _client(tmp_path, server[0], "sleep", popen=True)
    rank = json.loads(p.stdout.readline())["pid"]
    p.kill()
    p.wait(timeout=60)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{rank}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{rank}"), "the rank outlived its client"


def test_a_refused_rank_starts_alone_and_says_why(tmp_path, server):
    r = _client(tmp_path, server[0], "exit", "0", OMP_NUM_THREADS="7")  # libgomp read another value
    assert r.returncode == 0
    assert "started without the zygote: the zygote refused: variables read at load time differ: OMP_NUM_THREADS" \
        in r.stderr
    assert _said(r.stdout)["ppid"] != _said(r.stdout)["pid"] and "refused" in server[1].read_text()


def test_without_a_zygote_the_rank_starts_alone(tmp_path):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "zprobe.py").write_text(PROBE)
    r = _client(tmp_path, str(tmp_path / "none.sock"), "exit", "4")
    assert r.returncode == 4 and "cannot reach" in r.stderr and _said(r.stdout)["socket"] is None
    r = _client(tmp_path, None, "exit", "0")  # no socket named: silent
    assert r.returncode == 0 and r.stderr == ""


def test_a_rank_that_cannot_be_put_in_place_is_refused_after_the_fork_and_nothing_runs(tmp_path, server):
    file = tmp_path / "not-a-directory"
    file.write_text("")
    with connect(server[0]) as s:
        fds = [0, 1, 2, os.open(file, os.O_RDONLY)] + [os.open(f"/proc/self/ns/{n}", os.O_RDONLY)
                                                         for n in ("user", "mnt", "net")]
        req = request("zprobe", ["exit", "0"])
        req["path"] = json.loads(subprocess.run([sys.executable, "-P", "-c", "import sys, json; "
                                                 "print(json.dumps(sys.path))"], env=_env(tmp_path),
                                                capture_output=True, text=True).stdout)
        req["env"] = _env(tmp_path)
        send(s, req, fds)
        for fd in fds[3:]:
            os.close(fd)
        s.settimeout(60)
        msg, _ = recv(s)
    assert "working directory" in msg["refused"], msg


def test_a_client_of_another_python_is_refused():
    req = {"module": "m", "python": "/other/python", "version": sys.version, "path": sys.path, "env": {},
           "argv": []}
    assert "another Python" in refusal(req, "m", {})
    assert "not x" in refusal({**req, "module": "x"}, "m", {})
    ok = {**req, "python": sys.executable}
    assert refusal(ok, "m", {}) is None
    assert "import path" in refusal({**ok, "path": ["/x"]}, "m", {})


def test_load_time_variables_must_agree():
    mine = {"OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "131072", "RANK": "0", "PYTHONHASHSEED": "1"}
    theirs = {**mine, "RANK": "3", "CUDA_VISIBLE_DEVICES": "2", "NCCL_HOSTID": "x"}
    assert load_time_differences(mine, theirs) == []  # read after the fork: free to differ
    assert load_time_differences(mine, {**theirs, "OMP_NUM_THREADS": "2", "LD_PRELOAD": "x"}) == \
        ["LD_PRELOAD", "OMP_NUM_THREADS"]
    # what dynamo and inductor read as the zygote preloads them
    assert load_time_differences(mine, {**theirs, "TORCHINDUCTOR_CACHE_DIR": "/x", "TORCHDYNAMO_VERBOSE": "1"}) == \
        ["TORCHDYNAMO_VERBOSE", "TORCHINDUCTOR_CACHE_DIR"]


def test_the_zygote_gets_what_all_ranks_share():
    envs = [{"A": "1", "RANK": "0", "OMP_NUM_THREADS": "1"}, {"A": "1", "RANK": "1", "OMP_NUM_THREADS": "1"}]
    assert zygotes.common_env(envs) == {"A": "1", "OMP_NUM_THREADS": "1"}
    assert zygotes.common_env([]) == {}


def test_which_runs_get_a_zygote():
    assert zygotes.serves("workloads.train") and zygotes.serves("workloads.collective")
    assert not zygotes.serves("workloads.userscript") and not zygotes.serves("mypkg.train")
    assert zygotes.enabled({}) and zygotes.enabled({"TESTBED_ZYGOTE": "1"})
    assert not any(zygotes.enabled({"TESTBED_ZYGOTE": v}) for v in ("0", "off", "no", "false"))


def test_the_rank_joins_each_cgroup_of_its_client_that_differs():
    v2 = "0::/user.slice/a\n"
    assert cgroup_moves(v2, "0::/testbed/1.tb\n", "/sys/fs/cgroup/unified") == \
        ["/sys/fs/cgroup/unified/testbed/1.tb/cgroup.procs"]
    assert cgroup_moves(v2, v2) == []
    hybrid = "9:name=systemd:/\n4:memory:/m\n0::/\n"
    assert cgroup_moves(hybrid, "9:name=systemd:/\n4:memory:/m\n0::/testbed/x\n") == \
        ["/sys/fs/cgroup/testbed/x/cgroup.procs"]
    assert cgroup_moves(hybrid, "9:name=systemd:/s\n4:memory:/m\n0::/\n") == \
        ["/sys/fs/cgroup/systemd/s/cgroup.procs"]


def test_exit_codes_follow_python():
    assert exit_code(None) == 0 and exit_code(3) == 3 and exit_code(256) == 0 and exit_code(-1) == 255
    assert exit_code("message") == 1


def test_a_long_socket_path_is_reached_through_its_directory(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "zygote.sock")
    where, fd = address(path)
    assert fd is not None and where.startswith("/proc/self/fd/")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(where)
    os.close(fd)
    s.listen(1)
    with connect(path) as c:
        send(c, {"hello": 1})
        conn, _ = s.accept()
        assert recv(conn) == ({"hello": 1}, [])
    conn.close()
    s.close()


def test_the_client_imports_nothing_heavy():
    code = ("import sys, testbed.nodes.zygote.client; "
            "print(sorted(m for m in ('torch', 'numpy', 'pyroute2', 'yaml', 'subprocess') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
