"""The local Docker engine through the docker SDK, an optional dependency (``testbed[docker]``)."""

from __future__ import annotations

from testbed.common.errors import TestbedError


def docker_sdk():
    """The ``docker`` module, or a TestbedError saying how to install it."""
    try:
        import docker
    except ImportError:
        raise TestbedError("backend docker needs the docker SDK for Python",
                           "pip install 'testbed[docker]' (or: pip install docker)") from None
    return docker


ENGINE_HINT = ("install and start the engine (apt-get install docker.io; dockerd), "
               "and the SDK (pip install 'testbed[docker]'); `testbed doctor` checks both")


def client():
    """A docker SDK client for the local engine, or a TestbedError saying what is missing."""
    docker = docker_sdk()
    try:
        c = docker.from_env(timeout=120)
        c.ping()
    except docker.errors.DockerException as e:
        raise TestbedError(f"cannot reach the Docker engine: {e}", ENGINE_HINT) from None
    return c


def any_labelled(label: str) -> bool | None:
    """Whether the local engine has a container (running or not) labelled ``label``
    (KEY=VALUE), asked over its socket without the SDK (whose import alone takes 0.2 s):
    False also when no engine listens, and when the engine's socket refuses this user (not
    in the ``docker`` group: the SDK would be refused too, and no container can have been
    made through it by this user); None when this cannot tell (``DOCKER_HOST`` names another
    engine, or the answer is not understood): ask the SDK then."""
    import http.client
    import json
    import os
    import socket
    from urllib.parse import quote

    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return None
    path = host[len("unix://"):]
    if not os.path.exists(path):
        return False  # no engine: no containers can exist

    class _Unix(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(path)

    conn = _Unix("localhost", timeout=30)
    try:
        conn.request("GET", "/containers/json?all=1&filters=" + quote(json.dumps({"label": [label]})))
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            return None
        found = json.loads(body)
        return bool(found) if isinstance(found, list) else None
    except ConnectionRefusedError:
        return False  # a socket file with no engine behind it
    except PermissionError:
        return False  # an engine this user may not use (an ordinary user's `down` paid 0.2 s for the SDK to learn it)
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def not_found(e: Exception) -> bool:
    return isinstance(e, docker_sdk().errors.NotFound)
