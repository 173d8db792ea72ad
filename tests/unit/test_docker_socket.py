"""``any_labelled`` asks the Docker engine over its socket without the SDK: a real Unix
socket served here stands in for the engine (its answers, a refusal, no listener)."""

from __future__ import annotations

import json
import os
import socket
import threading

from testbed.nodes.docker import api as dockerapi


def _engine(path: str, body: bytes, status: str = "200 OK") -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn, srv:
            conn.recv(65536)
            conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_the_engines_answer_no_engine_and_a_socket_this_user_may_not_use(tmp_path, monkeypatch):
    path = str(tmp_path / "docker.sock")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    assert dockerapi.any_labelled("testbed.state=/x") is False  # no socket: no engine
    _engine(path, json.dumps([{"Id": "c1"}]).encode()).join(0)
    assert dockerapi.any_labelled("testbed.state=/x") is True
    os.unlink(path)
    _engine(path, b"[]")
    assert dockerapi.any_labelled("testbed.state=/x") is False
    os.unlink(path)
    _engine(path, b"{}", "500 Internal Server Error")
    assert dockerapi.any_labelled("testbed.state=/x") is None  # not understood: the SDK is asked
    os.unlink(path)
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(path)  # a socket file nobody listens on
    assert dockerapi.any_labelled("testbed.state=/x") is False

    def refused(self, address):
        raise PermissionError(13, "Permission denied")

    os.unlink(path)
    _engine(path, b"[]")
    monkeypatch.setattr(socket.socket, "connect", refused)  # as a user outside the docker group (root bypasses modes)
    assert dockerapi.any_labelled("testbed.state=/x") is False
    monkeypatch.setenv("DOCKER_HOST", "tcp://192.0.2.1:2375")
    assert dockerapi.any_labelled("testbed.state=/x") is None
