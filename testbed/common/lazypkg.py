"""A package whose ``__init__`` runs only when something of its own is asked for.

pyroute2's ``__init__`` imports every protocol it speaks (IPDB, NDB, conntrack, nftables,
wireguard, ...): 0.1-0.2 s of a command that needs only rtnetlink. :func:`lazy_package`
puts the package in ``sys.modules`` without running its ``__init__``, so that importing a
submodule (``pyroute2.iproute.linux``) loads that submodule and what it imports, and no
more. The first attribute of the package itself that is not a submodule (``from pyroute2
import IPRoute``) runs the real ``__init__`` then, so every caller still gets what it asked
for: only the time moves.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def lazy_package(name: str) -> None:
    """Put ``name`` in ``sys.modules`` with its ``__init__`` deferred (no-op if already
    imported or not an importable package)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    module = importlib.util.module_from_spec(spec)

    def __getattr__(attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if importlib.util.find_spec(f"{name}.{attr}") is not None:  # a submodule: just it
            return importlib.import_module(f"{name}.{attr}")
        _complete(module, spec)
        return getattr(module, attr)

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[name] = module


def _complete(module: types.ModuleType, spec) -> None:
    """Run the package's own ``__init__`` in ``module`` (once)."""
    if "__getattr__" in module.__dict__:
        del module.__dict__["__getattr__"]
        spec.loader.exec_module(module)
