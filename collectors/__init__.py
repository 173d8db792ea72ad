"""Prometheus exporters for testbed: link counters read at scrape time, training records.

Both are custom collectors (prometheus-client): nothing is sampled in the background,
so an idle exporter costs nothing, and a scrape reads exactly the kernel counters and
record files of that moment. They run on the host side and bind to 127.0.0.1 unless
told otherwise, so metric traffic never crosses an emulated link.

    python -m collectors [--listen 127.0.0.1:9464] (--testbed NAME ... | --all-testbeds) [--runs DIR ...]
                         [--sd-file FILE --sd-label KEY=VALUE]

`testbed up` starts one per testbed (``--testbed NAME --listen 127.0.0.1:0 --sd-file
<state dir>/targets/testbed-NAME.json``) and `testbed down` stops it; `testbed run` serves
its run's records from its own process (:class:`collectors.training.RunExporter`).
"""


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` too; an empty host means 127.0.0.1) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def hostport(host: str, port: int) -> str:
    """``host:port`` for a URL or a target file; an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_error(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (e.g. "Address already in use"), or None."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None
