"""``/metrics`` over HTTP, for the owner only when a token is given (testbed.monitor.auth).

prometheus_client's own ``start_http_server`` with one difference: with ``token`` set, a
request without ``Authorization: Bearer TOKEN`` gets 401 and no metrics (an ordinary user's
exporter listens on the loopback every user of the machine reaches)."""

from __future__ import annotations

import hmac
import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from collectors.listen import listen


SHUTDOWN_POLL_S = 0.05
"""How often the serving thread looks whether ``shutdown()`` was asked (what it waits at most)."""


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


def serve(registry, host: str, port: int, token: str | None = None, start: bool = True,
          sock: socket.socket | None = None):
    """(server, thread) serving ``registry`` on ``host:port`` (0: any free port) in a daemon thread.

    ``start=False``: bound and listening (the port is known, connections wait in the
    backlog), not yet answering; ``thread.start()`` begins. ``sock``: a socket
    :func:`collectors.listen.listen` bound and listening already (host and port are then its)."""

    class Server(ThreadingWSGIServer):
        pass

    own = sock is None
    sock = sock or listen(host, port)
    Server.address_family = sock.family
    try:
        httpd = Server(sock.getsockname()[:2], _Quiet, bind_and_activate=False)
    except BaseException:
        if own:
            sock.close()
        raise
    httpd.socket.close()  # the one it made unbound; it serves ours, as server_bind would have left it
    address = sock.getsockname()
    httpd.socket, httpd.server_address = sock, address
    httpd.server_name, httpd.server_port = socket.getfqdn(address[0]), address[1]
    httpd.setup_environ()
    app = make_wsgi_app(registry)
    httpd.set_app(_guarded(app, token) if token else app)
    # shutdown() waits for serve_forever to see its flag, which it checks every poll_interval:
    # 0.5 s by default, which every run paid as it closed its training exporter (measured)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True)
    if start:
        thread.start()
    return httpd, thread
