"""`testbed graph --serve` against hostile neighbours (issue 56, item 5: the review of issue
59's parts): the owner's token goes only to the owner's listener and never along a redirect;
a slow, silent or broken exporter is a sample missed, never a hang or a dead sampler; an idle
client holds up nobody; the page is served on the loopback only."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
import urllib.request

import pytest

from testbed.common.errors import TestbedError
from testbed.monitor import auth
from testbed.runs import graph, graph_live
from testbed import load_topology
from pathlib import Path

TOPO = Path(__file__).resolve().parents[2] / "testbed" / "topologies" / "dumbbell.yaml"
METRICS = ('testbed_link_transmit_bytes_total{testbed="d",link="%s",direction="forward"} %d\n'
           'testbed_link_capacity_bytes_per_second{testbed="d",link="%s",direction="forward"} 1000\n')


class _Exporter(http.server.BaseHTTPRequestHandler):
    """Answers what the class says; records each request's Authorization header."""

    seen: list = []
    answer = b""
    status = 200
    location = ""

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).seen.append(self.headers.get("Authorization"))
        self.send_response(self.status)
        if self.location:
            self.send_header("Location", self.location)
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *args):
        pass


def _exporter(**attrs) -> tuple[http.server.HTTPServer, type]:
    handler = type("H", (_Exporter,), {"seen": [], **attrs})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, handler


@pytest.fixture
def owner(monkeypatch):
    """An ordinary user's exporters, as the scrape sees them: a token is asked for."""
    monkeypatch.setattr(auth, "required", lambda: True)
    monkeypatch.setattr(auth, "token", lambda: "the-owners-token")


def test_the_token_goes_to_the_owners_listener_and_not_along_a_redirect(owner):
    good, seen = _exporter(answer=(METRICS % ("a", 5, "a")).encode())
    got = graph_live.scrape(f"http://127.0.0.1:{good.server_address[1]}/metrics")
    assert got[("testbed_link_transmit_bytes_total", (("direction", "forward"), ("link", "a"),
                                                      ("testbed", "d")))] == 5.0
    assert seen.seen == ["Bearer the-owners-token"]
    elsewhere, other = _exporter(answer=b"x")
    bounce, _ = _exporter(status=302, location=f"http://127.0.0.1:{elsewhere.server_address[1]}/metrics")
    with pytest.raises(urllib.error.HTTPError):
        graph_live.scrape(f"http://127.0.0.1:{bounce.server_address[1]}/metrics")
    assert other.seen == []  # before: the token followed the 302
    with pytest.raises(TestbedError, match="not an exporter on the loopback"):
        graph_live.scrape("http://192.0.2.1:9/metrics")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to listen as another user")
def test_a_port_another_user_listens_on_gets_no_token(owner):
    """A killed exporter's target file outlives it; another user took its port."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: nobody
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen()
            os.write(w, str(s.getsockname()[1]).encode())
            s.settimeout(1)
            try:
                conn, _ = s.accept()
                os._exit(3 if b"the-owners-token" in conn.recv(4096) else 2)
            except OSError:
                os._exit(0)
        finally:
            os._exit(1)
    port = int(os.read(r, 16))
    assert auth.listener_uid("127.0.0.1", port) == 65534
    with pytest.raises(graph_live.ForeignListener, match="its token is not sent there"):
        graph_live.scrape(f"http://127.0.0.1:{port}/metrics")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # it heard nothing (before: the Bearer token)


def test_a_slow_or_broken_exporter_is_a_sample_missed_and_the_sampler_lives_on(monkeypatch):
    monkeypatch.setattr(graph_live, "SCRAPE_S", 0.6)

    class Dribble(_Exporter):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            for _ in range(100):  # 20 s, unless the client goes
                self.wfile.write(b"#")
                self.wfile.flush()
                time.sleep(0.2)

    slow = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dribble)
    threading.Thread(target=slow.serve_forever, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        graph_live.scrape(f"http://127.0.0.1:{slow.server_address[1]}/metrics")
    assert time.monotonic() - t0 < 10  # the 0.6 s deadline, not the 20 s answer
    # a line that is no HTTP status, then values that are no numbers, then a good answer
    garbage = socket.socket()
    garbage.bind(("127.0.0.1", 0))
    garbage.listen()

    def answer_garbage():
        for _ in range(2):
            c, _ = garbage.accept()
            c.recv(4096)
            c.sendall(b"NOT HTTP\r\n\r\n")
            c.close()
    threading.Thread(target=answer_garbage, daemon=True).start()
    live = graph_live.Live("d", f"http://127.0.0.1:{garbage.getsockname()[1]}/metrics", {"a": 0}, every=0.1)
    live.start()
    deadline = time.monotonic() + 30
    while not (live.error or "").startswith("the link exporter gave no sample") and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(ValueError, match="the link exporter gave no sample"):
        live.state()
    assert live._thread.is_alive()
    good, _ = _exporter(answer=(METRICS % ("a", 5, "a") + 'testbed_link_capacity_bytes_per_second'
                                '{testbed="d",link="b",direction="forward"} NaN\n').encode())
    live.exporter = f"http://127.0.0.1:{good.server_address[1]}/metrics"
    deadline = time.monotonic() + 30
    while live.error is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    live.stop()
    assert live.state()["utilisation"] == {"0 forward": 0.0}


def test_an_idle_client_holds_nobody_up_and_the_page_is_the_loopbacks_only(tmp_path, monkeypatch):
    monkeypatch.setattr(graph_live._Handler, "timeout", 60)  # the idle one outlasts the urlopen below
    m = graph.model(load_topology(TOPO))
    live = graph_live.Live("d", "http://127.0.0.1:9/metrics", {})
    live.error, live.sample = None, {"utilisation": {}, "run": None}
    server, url = graph_live.serve(m, live)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        idle = socket.create_connection(server.server_address[:2])  # connects, says nothing
        with urllib.request.urlopen(url + "state.json", timeout=30) as r:  # before: waited for the idle one
            assert json.loads(r.read()) == {"utilisation": {}, "run": None}
        idle.close()
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(TestbedError, match="served on the loopback only"):
        graph_live.serve(m, live, "0.0.0.0", 0)
    v6, url6 = graph_live.serve(m, live, "::1", 0)
    v6.server_close()
    assert url6.startswith("http://[::1]:")


def test_a_run_target_that_is_gone_or_a_dangling_link_is_passed_over(tmp_path, monkeypatch):
    monkeypatch.setattr(graph_live, "targets_dir", lambda: tmp_path)
    (tmp_path / "run-d-20261207-1.json").symlink_to(tmp_path / "nowhere")
    (tmp_path / "run-d-20261207-2.json").write_text("not json")
    assert graph_live.newest_run("d") is None
