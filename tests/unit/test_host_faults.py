"""Logic around hosts that fail: the host timeout, the memory of a silent host, and the
version a controller asks a host for (the real faults: tests/kernel/test_multihost_faults.py)."""

from __future__ import annotations

import io
import json
import socket

import pytest

from testbed.common.errors import TestbedError
from testbed.common.version import __version__
from testbed.engine import hostagent
from testbed.hosts.ssh import client as ssh
from testbed.model.topology import Host


def _host(address="192.0.2.7") -> Host:
    return Host(name="h9", address=address, underlay=address)


@pytest.mark.parametrize("raw, want", [("", 30.0), ("6", 6.0), (" 120 ", 120.0)])
def test_the_host_timeout_comes_from_the_environment(monkeypatch, raw, want):
    monkeypatch.setenv(ssh.HOST_TIMEOUT_ENV, raw)
    assert ssh.host_timeout() == want


@pytest.mark.parametrize("raw", ["0", "-3", "nan", "inf", "soon", "1e9"])
def test_a_bad_host_timeout_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(ssh.HOST_TIMEOUT_ENV, raw)
    with pytest.raises(TestbedError, match="TESTBED_HOST_TIMEOUT"):
        ssh.host_timeout()


def test_a_silent_host_is_refused_at_once_then_tried_again_after_the_timeout(monkeypatch):
    monkeypatch.setenv(ssh.HOST_TIMEOUT_ENV, "5")
    now = [1000.0]
    monkeypatch.setattr(ssh.time, "monotonic", lambda: now[0])
    h = _host()
    ssh.silent(h, "nothing was acknowledged for 5 s")
    with pytest.raises(TestbedError, match=r"host h9 \(192.0.2.7\) stopped answering: nothing was acknowledged"):
        ssh.connect(h)
    assert ssh._still_silent(_host("192.0.2.8")) is None  # another host is not affected
    now[0] += 6
    assert ssh._still_silent(h) is None


def test_the_watched_socket_keeps_a_real_error_and_ignores_polling_timeouts():
    a, b = socket.socketpair()
    w = ssh._Watched(fileno=a.detach())
    w.settimeout(0.01)
    with pytest.raises(TimeoutError):
        w.recv(1)
    assert w.error is None
    b.close()
    w.close()
    with pytest.raises(OSError):
        w.send(b"x")  # a closed socket: EBADF, an errno
    assert w.error is not None and w.error.errno is not None


def _answer(monkeypatch, capsys, argv: list[str]) -> tuple[int, dict]:
    monkeypatch.setattr(hostagent.sys, "stdin", io.StringIO(""))
    monkeypatch.setattr(hostagent, "counters", lambda name: {"counters": {}, "asked": name})
    monkeypatch.setattr(hostagent, "down", lambda name: {"removed": name})
    rc = hostagent.main(argv[0], argv[1:])
    return rc, json.loads(capsys.readouterr().out)


def test_a_host_of_another_version_refuses_all_but_teardown(monkeypatch, capsys):
    rc, out = _answer(monkeypatch, capsys, ["--controller=9.9.9", "counters", "tb"])
    assert rc == 1 and f"this host has testbed {__version__}, the controller 9.9.9" in out["error"], out
    assert "install the same version" in out["hint"]
    assert _answer(monkeypatch, capsys, ["--controller=9.9.9", "down", "tb"]) == (0, {"removed": "tb"})
    assert _answer(monkeypatch, capsys, [f"--controller={__version__}", "counters", "tb"]) == \
        (0, {"counters": {}, "asked": "tb"})
    assert _answer(monkeypatch, capsys, ["counters", "tb"])[0] == 0  # an older controller sends none
