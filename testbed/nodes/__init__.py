"""Worker backends: what a worker node is made of, behind one small interface
(:class:`testbed.nodes.base.Backend`), in a registry by name.

``netns`` (the embedded default, a module), ``docker`` and ``vm`` (packages: a backend and
its parts) exist, and ``zygote`` is how ranks of netns workers start (docs/zygote.md); the
topology validates ``backend:``
against this registry, so a new backend appears in errors and docs by registering here.

A backend's module is imported when the backend is first used (``get``; importing
``BACKENDS`` makes them all), not with this package: a rank's launcher
(``python -m testbed.nodes.nsexec``) or a command that builds no node pays for none of
them (the docker backend alone imports netlink for its health checks).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.nodes.base import Backend

_REGISTERED: dict[str, str] = {
    "netns": "testbed.nodes.netns:NetnsBackend",
    "docker": "testbed.nodes.docker.backend:DockerBackend",
    "vm": "testbed.nodes.vm.backend:VmBackend",
}
"""Backend name -> ``module:class``: registering a backend is one line here."""


class _Registry(Mapping):
    """The backends by name, each made (its module imported) on first use."""

    def __init__(self, where: dict[str, str]):
        self._where = where
        self._made: dict[str, Backend] = {}

    def __getitem__(self, name: str) -> Backend:
        if name not in self._made:
            module, cls = self._where[name].split(":")
            self._made[name] = getattr(importlib.import_module(module), cls)()
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __repr__(self) -> str:
        return f"<backends {', '.join(self._where)}>"


_BACKENDS = _Registry(_REGISTERED)


def __getattr__(name: str):
    """``BACKENDS``: every backend, made. Whoever imports it (teardown, preflight, doctor)
    gets them all, as when this package imported them, and with them every action class
    a ledger may name (a backend's module registers its own)."""
    if name == "BACKENDS":
        for n in _BACKENDS:
            _BACKENDS[n]
        return _BACKENDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    BACKENDS: Mapping[str, Backend]


def names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def get(name: str | None) -> Backend:
    from testbed.common.errors import TestbedError

    try:
        return _BACKENDS[name or "netns"]
    except KeyError:
        raise TestbedError(f"unknown backend '{name}'", f"choose one of: {', '.join(_BACKENDS)}") from None


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
    _REGISTERED[backend.name] = where
