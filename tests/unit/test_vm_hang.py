"""backend: vm, a guest that stops answering, without QEMU: the agent's heartbeat, the relay
giving up on a silent guest with one line naming the node, the hang timeout setting, and
how a stopped QEMU is named. (The real faults: tests/kernel/test_vm_faults.py.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from testbed.common.errors import TestbedError
from testbed.nodes.vm import agent as wire
from testbed.nodes.vm import relay as vmexec, proc as vmproc, qemu as vmqemu
from tests.helpers import agent_frames


def _frames(agent: wire.Agent, req: dict) -> list:
    a, b = socket.socketpair()
    t = threading.Thread(target=agent.handle, args=(b,))
    t.start()
    wire.send(a, wire.REQUEST, json.dumps(req).encode())
    wire.send(a, wire.STDIN_EOF)
    return agent_frames(a, t, idle=10)


@pytest.fixture
def agent(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("s3cret\n")
    monkeypatch.setattr(wire, "HOST_SHARE", "")
    return wire.Agent({"token_file": str(tmp_path / "token")})


def test_the_agent_beats_while_a_command_runs_when_asked_and_only_then(agent, tmp_path):
    # The command runs until the test has seen three heartbeats (no timing assumed: a
    # fixed sleep saw only two beats on a loaded CI machine).
    go = tmp_path / "go"
    wait = f"while [ ! -e {go} ]; do sleep 0.02; done"
    req = {"token": "s3cret", "op": "exec", "argv": ["sh", "-c", wait], "env": {"PATH": "/usr/bin:/bin"}}
    a, b = socket.socketpair()
    t = threading.Thread(target=agent.handle, args=(b,))
    t.start()
    wire.send(a, wire.REQUEST, json.dumps({**req, "heartbeat": 0.1}).encode())
    wire.send(a, wire.STDIN_EOF)
    beats = []
    while (f := wire.recv(a, idle=30)) is not None and f[0] not in (wire.EXIT, wire.ERROR):
        beats.append(f)
        if beats.count((wire.HEARTBEAT, b"")) == 3:
            go.touch()
    a.close()
    t.join(10)
    assert beats[0] == (wire.HEARTBEAT, b""), "the first heartbeat comes at once"
    assert f == (wire.EXIT, b"0") and beats.count((wire.HEARTBEAT, b"")) >= 3
    assert _frames(agent, {**req, "argv": ["sleep", "0.3"]}) == [(wire.EXIT, b"0")]


@pytest.mark.parametrize("beat", [-1, "2", True, 0.01, 4000])
def test_a_bad_heartbeat_is_refused(beat):
    assert "heartbeat" in wire._valid_request({"op": "exec", "argv": ["ls"], "heartbeat": beat})
    assert wire._valid_request({"op": "exec", "argv": ["ls"], "heartbeat": 2}) is None


def test_recv_gives_up_on_silence_only():
    a, b = socket.socketpair()
    with a, b:
        def talk():
            for _ in range(4):  # 4 s in all, longer than the idle limit: only silence counts
                time.sleep(1.0)
                wire.send(a, wire.HEARTBEAT)
            wire.send(a, wire.EXIT, b"0")

        threading.Thread(target=talk).start()
        seen = []
        while (f := wire.recv(b, idle=3))[0] != wire.EXIT:
            seen.append(f)
        assert len(seen) == 4
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            wire.recv(b, idle=0.3)
        assert 0.25 < time.monotonic() - t0 < 10


def test_the_relay_gives_up_on_a_silent_guest_naming_the_node_and_why(monkeypatch, capsys):
    monkeypatch.setattr(vmexec, "qemu_trouble", lambda ns: "its QEMU (pid 42) is stopped (state T: SIGSTOP?)")
    a, b = socket.socketpair()
    with a, b:
        wire.send(a, wire.HEARTBEAT)
        wire.send(a, wire.STDOUT, b"training\n")
        t0 = time.monotonic()
        assert vmexec._relay_output(b, "tb.w1", "w1", 0.3) == vmexec.EXIT_LOST
        assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err.strip()
    assert err == ("error: node w1: its VM is not answering: no word from its guest agent for 0.3 s and its QEMU "
                   "(pid 42) is stopped (state T: SIGSTOP?); gave up the command there "
                   "(TESTBED_VM_HANG_TIMEOUT=SECONDS waits longer)"), err


def test_the_relay_asks_for_a_heartbeat_often_enough():
    assert vmexec.heartbeat_every(60) == 2.0 and vmexec.heartbeat_every(1) == 0.2
    assert vmexec.heartbeat_every(0.1) == 0.1


@pytest.mark.parametrize("value, expect", [(None, 60.0), ("", 60.0), ("0", 0.0), ("7.5", 7.5),
                                           ("soon", None), ("-1", None), ("inf", None), ("nan", None)])
def test_the_hang_timeout_setting(monkeypatch, value, expect):
    if value is None:
        monkeypatch.delenv(vmqemu.HANG_ENV, raising=False)
    else:
        monkeypatch.setenv(vmqemu.HANG_ENV, value)
    if expect is None:
        with pytest.raises(TestbedError) as e:
            vmqemu.hang_timeout()
        assert vmqemu.HANG_ENV in e.value.message
    else:
        assert vmqemu.hang_timeout() == expect


def test_a_stopped_or_missing_qemu_is_named(monkeypatch, tmp_path):
    """A rank's death explained: QEMU gone, QEMU stopped, or running but its agent silent."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pids: list[int] = []
    monkeypatch.setattr(vmqemu, "qemu_pids", lambda ns: pids)
    monkeypatch.setattr(vmproc, "qemu_pids", lambda ns: pids)
    monkeypatch.setattr(vmproc, "vm_dir", lambda ns: tmp_path)
    try:
        assert vmproc.why_stopped("tb.w1").startswith("its VM is no longer running (QEMU exited): no output")
        pids.append(p.pid)
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while vmqemu.qemu_trouble("tb.w1") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert vmproc.why_stopped("tb.w1") == f"its VM is not answering: its QEMU (pid {p.pid}) is stopped (state T: SIGSTOP?)"
        os.kill(p.pid, signal.SIGCONT)
        (tmp_path / "agent.json").write_text("{}")  # no agent to ask
        assert "its guest agent did not answer a ping within 1 s" in vmproc.why_stopped("tb.w1", probe=1.0)
    finally:
        p.kill()
        p.wait()


def test_up_names_the_vm_whose_agent_did_not_answer_a_stopped_one_first(monkeypatch, tmp_path):
    trouble = {"tb.w0": None, "tb.w1": "its QEMU (pid 7) is stopped (state T: SIGSTOP?)"}
    monkeypatch.setattr(vmproc, "qemu_trouble", trouble.get)
    (tmp_path / "console.log").write_text("Linux version 6.1\nbooting\n")
    e = vmproc._not_ready({"tb.w0": str(tmp_path), "tb.w1": str(tmp_path)})
    assert e.message == (f"node w1: its guest agent did not answer within {vmproc.READY_TIMEOUT:.0f} s, and its QEMU "
                         "(pid 7) is stopped (state T: SIGSTOP?); console: Linux version 6.1 | booting; "
                         "not ready either: w0")
    assert "TESTBED_VM_READY_TIMEOUT" in e.hint
