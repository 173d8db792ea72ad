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


def not_found(e: Exception) -> bool:
    return isinstance(e, docker_sdk().errors.NotFound)
