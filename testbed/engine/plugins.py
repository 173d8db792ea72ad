"""Backends and link types installed as packages: entry points, read at start-up.

A package adds to testbed by declaring entry points (``pyproject.toml``)::

    [project.entry-points."testbed.backends"]
    NAME = "package.backend:Class"     # a testbed.nodes.base.Backend subclass named NAME
    [project.entry-points."testbed.link_types"]
    NAME = "package.link:Kind"         # a testbed.plan.links.LinkKind named NAME (class or instance)
    [project.entry-points."testbed.schemes"]
    NAME = "package.scheme:attach"     # attach(ddp, opts, masks=None) -> state

(``examples/plugin/`` is a package of both the last kinds.)

Each is the same one registration a module in this tree makes (docs/architecture.md,
"Extension points"): :func:`load` makes it for every installed package, in the CLI before a
command runs, in a remote host's agent before it reads a share, and in Python by calling
``testbed.load_plugins()``. Schemes are read by ``workloads.schemes`` itself (in the CLI and
in every rank, without importing them until a rank attaches one). A plugin that fails to
import, or names what is already registered, is skipped with one warning line naming it and
its package; the built-in parts work as before.

Only installed packages are loaded (``pip install``: the user's own choice of code), never a
name read from a topology, a state file or a ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import EntryPoint

_loaded = False
WARNINGS: list[str] = []
"""One line per plugin skipped, in the order met (the CLI prints them as warnings)."""


def _backend(ep: EntryPoint) -> None:
    from testbed import nodes

    if ep.name in nodes.names():
        raise ValueError(f"backend {ep.name!r} exists already")
    cls = ep.load()
    if getattr(cls, "name", None) != ep.name:
        raise ValueError(f"{ep.value} is no backend named {ep.name!r} (its name: {getattr(cls, 'name', None)!r})")
    nodes.register(ep.value)


def _link_type(ep: EntryPoint) -> None:
    from testbed.plan.links import LINK_KINDS, LinkKind, register_link_kind

    if ep.name in LINK_KINDS:
        raise ValueError(f"link type {ep.name!r} exists already")
    obj = ep.load()
    kind = obj() if isinstance(obj, type) else obj
    if not isinstance(kind, LinkKind) or kind.name != ep.name:
        raise ValueError(f"{ep.value} is no testbed.plan.links.LinkKind named {ep.name!r}")
    register_link_kind(kind)


GROUPS: dict[str, tuple[str, Callable[[EntryPoint], None]]] = {
    "testbed.backends": ("backend", _backend),
    "testbed.link_types": ("link type", _link_type),
}
"""Entry-point group -> (what it adds, its registration)."""


def load() -> list[str]:
    """Register every installed package's backends and link types (once per process); the
    warnings of those skipped. Without any, nothing is imported (the registries stay lazy)."""
    global _loaded
    if _loaded:
        return WARNINGS
    _loaded = True
    from workloads.entrypoints import installed, package, printable

    for group, (what, register) in GROUPS.items():
        for ep in installed(group, WARNINGS):
            try:
                register(ep)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - a broken plugin must not break the CLI
                why = printable(str(e).splitlines()[0]) if str(e) else ""
                WARNINGS.append(f"plugin {what} {printable(ep.name)!r} of package {package(ep)!r} is "
                                f"skipped: {printable(type(e).__name__)}{': ' + why if why else ''}")
    return WARNINGS

