"""``/metrics`` over HTTP, for the owner only when a token is given (testbed.monitor.auth).

prometheus_client's own ``start_http_server`` with one difference: with ``token`` set, a
request without ``Authorization: Bearer TOKEN`` gets 401 and no metrics (an ordinary user's
exporter listens on the loopback every user of the machine reaches)."""

from __future__ import annotations

import hmac
import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002  (the base class's name)
        pass


def _guarded(app, token: str):
    expected = f"Bearer {token}".encode()

    def guarded(environ, start_response):
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                                ("WWW-Authenticate", 'Bearer realm="testbed"')])
            return [b"this exporter answers its owner only (Authorization: Bearer TOKEN)\n"]
        return app(environ, start_response)

    return guarded


def serve(registry, host: str, port: int, token: str | None = None, start: bool = True):
    """(server, thread) serving ``registry`` on ``host:port`` (0: any free port) in a daemon thread.

    ``start=False``: bound and listening (the port is known, connections wait in the
    backlog), not yet answering; ``thread.start()`` begins."""

    class Server(ThreadingWSGIServer):
        pass

    family, _, _, _, sockaddr = next(iter(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)))
    Server.address_family = family
    app = make_wsgi_app(registry)
    httpd = make_server(sockaddr[0], port, _guarded(app, token) if token else app, Server, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    if start:
        thread.start()
    return httpd, thread
