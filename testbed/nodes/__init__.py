"""Worker backends: what a worker node is made of, behind one small interface
(:class:`testbed.nodes.base.Backend`), in a registry by name.

``netns`` (the embedded default), ``docker`` and ``vm`` exist; the topology validates ``backend:``
against this registry, so a new backend appears in errors and docs by registering here.
"""

from __future__ import annotations

import importlib

from testbed.nodes.base import Backend
from testbed.nodes.docker import DockerBackend
from testbed.nodes.netns import NetnsBackend
from testbed.nodes.vm import VmBackend

BACKENDS: dict[str, Backend] = {b.name: b for b in (NetnsBackend(), DockerBackend(), VmBackend())}


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def get(name: str | None) -> Backend:
    from testbed.common.errors import TestbedError

    try:
        return BACKENDS[name or "netns"]
    except KeyError:
        raise TestbedError(f"unknown backend '{name}'", f"choose one of: {', '.join(BACKENDS)}") from None


def register(where: str) -> None:
    """Add a backend from outside this package, ``where`` its ``module:class``: the one
    registration a new backend needs. Its class's ``options`` (a
    :class:`testbed.model.backend_options.Options` of the same name, default: no keys)
    declares its topology keys, their checks and schema to the loader."""
    from testbed.model.backend_options import Options, register_options

    module, cls = where.split(":")
    backend = getattr(importlib.import_module(module), cls)
    options = getattr(backend, "options", None) or type(f"{cls}Options", (Options,), {"name": backend.name})()
    register_options(options)
    BACKENDS[backend.name] = backend()
