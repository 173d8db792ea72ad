"""``testbed graph --serve``: the page of :mod:`testbed.runs.graph`, live.

Served on the loopback only, under a random secret path (the URL printed is the only way
in, as a Jupyter token), by a threaded server whose connections time out (one idle client
holds nothing up). A sampler thread, once a second, scrapes the testbed's own link exporter
(transmit bytes over the capacity it reports: each link direction's utilisation over the
last second, so a live shape change or a trace shows) and the newest run's exporter that
answers (its iteration and accuracy); a page's request only reads the newest sample.

Both exporters are asked with the owner's token (:mod:`testbed.monitor.auth`) only when the
socket listening at their address is the owner's: a target file outlives an exporter that
was killed, and its port may be another user's by then. Redirects are not followed. Each
scrape has an overall deadline and a bounded answer; a broken or hostile answer (no
Prometheus text, a value that is no finite number) is a sample missed, said on the page.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import secrets
import socket
import socketserver
import threading
import time
import urllib.parse
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from testbed.common.errors import TestbedError
from testbed.common.files import read_json
from testbed.monitor import auth
from testbed.monitor.sd import targets_dir
from testbed.runs.graph import page

MAX_SCRAPE = 4 << 20
"""Bytes read of one exporter's answer at most."""
SCRAPE_S = 3.0
"""Seconds one scrape may take in all (a slow exporter is a sample missed, not a hang)."""
RUNS_TRIED = 3
"""The newest run target files tried, newest first, for one that answers."""


class ForeignListener(TestbedError):
    """The exporter's address is another user's socket now: no token goes there."""


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _no_redirects() -> urllib.request.OpenerDirector:
    class Refuse(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # the 3xx is an error: the token goes nowhere else

    return urllib.request.build_opener(Refuse)


_OPENER = _no_redirects()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """(metric name, sorted labels) -> value of an exporter on this machine's loopback,
    asked with the owner's token where one is needed, if its listener is the owner's."""
    from prometheus_client.parser import text_string_to_metric_families

    where = urllib.parse.urlsplit(url)
    if where.scheme != "http" or not where.hostname or not loopback(where.hostname) or where.port is None:
        raise TestbedError(f"{url}: not an exporter on the loopback")
    headers = {}
    if auth.required():
        if auth.listener_uid(where.hostname, where.port) != os.geteuid():
            raise ForeignListener(f"{where.hostname}:{where.port} is no longer the exporter's (another user's, or "
                                  "nobody's): its token is not sent there")
        headers["Authorization"] = f"Bearer {auth.token()}"
    deadline = time.monotonic() + SCRAPE_S
    body = b""
    with _OPENER.open(urllib.request.Request(url, headers=headers), timeout=1.0) as r:
        while len(body) <= MAX_SCRAPE:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} took over {SCRAPE_S:g} s")
            chunk = r.read1(64 << 10)  # what has come (read(n) would wait for n bytes)
            if not chunk:
                break
            body += chunk
    out = {}
    for fam in text_string_to_metric_families(body[:MAX_SCRAPE].decode("utf-8", "replace")):
        for s in fam.samples:
            if isinstance(s.value, (int, float)) and math.isfinite(s.value):
                out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def newest_run(name: str) -> dict | None:
    """The newest run on testbed ``name`` whose exporter answers: its id, scheme, rank 0's
    iteration and the last accuracy (None when none answers)."""
    found = []
    for f in targets_dir().glob(f"run-{name}-*.json"):
        try:
            found.append((f.lstat().st_mtime, f))
        except OSError:
            continue  # gone meanwhile
    for _, f in sorted(found, reverse=True)[:RUNS_TRIED]:
        try:
            target = read_json(f, "json", "target file")[0]["targets"][0]
            got = scrape(f"http://{target}/metrics")
        except Exception:  # noqa: BLE001 - a stale, foreign or broken exporter: try the next
            continue
        out: dict = {"run_id": f.stem.removeprefix(f"run-{name}-"), "scheme": None, "iteration": None,
                     "accuracy": None}
        for (n, labels), v in got.items():
            lab = dict(labels)
            if n == "testbed_train_iterations_total" and lab.get("rank") == "0":
                out["iteration"], out["scheme"] = int(v), lab.get("scheme")
            elif n == "testbed_train_accuracy":
                out["accuracy"] = v
        return out
    return None


class Live:
    """The newest sample: utilisation per link direction over the last second, the newest
    run; refreshed by :meth:`start`'s thread every ``every`` seconds."""

    def __init__(self, name: str, exporter: str, links: dict[str, int], every: float = 1.0):
        self.name, self.exporter, self.links, self.every = name, exporter, links, every
        self.sample: dict = {"utilisation": {}, "run": None}
        self.error: str | None = "no sample yet"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="graph-sampler", daemon=True)

    def _counters(self) -> tuple[dict, dict]:
        got = scrape(self.exporter)
        pick = {n: {(dict(k).get("link"), dict(k).get("direction")): v for (m, k), v in got.items() if m == n}
                for n in ("testbed_link_transmit_bytes_total", "testbed_link_capacity_bytes_per_second")}
        return pick["testbed_link_transmit_bytes_total"], pick["testbed_link_capacity_bytes_per_second"]

    def _run(self) -> None:
        prev = None
        while not self._stop.is_set():
            try:
                now, (sent, cap) = time.monotonic(), self._counters()
                if prev is not None and now > prev[0]:
                    util = {f"{self.links[link]} {d}": max(0.0, v - prev[1][(link, d)]) / (now - prev[0]) / c
                            for (link, d), v in sent.items()
                            if link in self.links and (link, d) in prev[1] and (c := cap.get((link, d), 0)) > 0}
                    self.sample = {"utilisation": util, "run": newest_run(self.name)}
                    self.error = None
                prev = (now, sent)
            except Exception as e:  # noqa: BLE001 - any answer of a broken exporter: a sample missed
                self.error, prev = f"the link exporter gave no sample: {type(e).__name__}: {str(e)[:200]}", None
            self._stop.wait(self.every)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def state(self) -> dict:
        if self.error is not None:
            raise ValueError(self.error)
        return self.sample


class _Handler(WSGIRequestHandler):
    timeout = 10  # an idle or slow client's connection is dropped

    def log_message(self, format, *args):  # noqa: A002  (the base class's name)
        pass


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


def serve(m: dict, live: Live, host: str = "127.0.0.1", port: int = 0) -> tuple[WSGIServer, str]:
    """A server of the live page and its state under a random secret path (not started:
    ``server.serve_forever()``); the URL to open. TestbedError for a host off the loopback."""
    if not loopback(host):
        raise TestbedError(f"--listen {host}: the live page is served on the loopback only",
                           "--listen 127.0.0.1:PORT (or [::1]:PORT)")
    secret = secrets.token_urlsafe(24)
    body = page(m, live=True).encode()

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == f"/{secret}":  # the page's relative state.json needs the slash
            start_response("302 Found", [("Location", f"/{secret}/")])
            return [b""]
        if path == f"/{secret}/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")])
            return [body]
        if path == f"/{secret}/state.json":
            try:
                answer, status = json.dumps(live.state(), allow_nan=False).encode(), "200 OK"
            except ValueError as e:
                answer, status = json.dumps({"error": str(e)}).encode(), "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
            return [answer]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not here\n"]

    cls = type("Server", (_Server,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    server: WSGIServer = make_server(host, port, app, server_class=cls, handler_class=_Handler)
    shown = f"[{host}]" if ":" in host else host
    return server, f"http://{shown}:{server.server_address[1]}/{secret}/"
