"""A listening TCP socket, made before the HTTP server and its imports exist.

``python -m collectors`` binds and announces its address with this alone (the socket
module), then imports wsgiref and prometheus_client (about 40 ms) and serves the same
socket: `testbed up` waits for the announcement, and a scrape that comes before the server
is ready waits in the backlog."""

from __future__ import annotations

import socket

BACKLOG = 64


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (0: any free port), as socketserver's TCPServer
    with ``allow_reuse_address`` (http.server's) would bind it; OSError when it cannot."""
    family, kind, proto, _, sockaddr = next(iter(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                    flags=socket.AI_PASSIVE)))
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock
