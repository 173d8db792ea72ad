"""testbed: a network-emulation lab for communication-efficient distributed training.

Importing needs no root; building a testbed does.

The names below load on first use, so that ``import testbed`` (which every
``testbed.*`` import, the CLI's and a rank's launcher's among them, runs first) costs
nothing: a command imports only what it uses.
"""

from testbed.common.errors import TestbedError
from testbed.common.version import __version__

_LAZY = {
    "Testbed": "testbed.engine.core",  # netlink, the backends
    "Topology": "testbed.model.topology",  # YAML, the model
    "load_topology": "testbed.model.topology",
    "load_topology_dict": "testbed.model.topology",
    "load_plugins": "testbed.engine.plugins",  # as load: installed packages' backends and link types
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), "load" if name == "load_plugins" else name)
    raise AttributeError(f"module 'testbed' has no attribute {name!r}")


__all__ = ["Testbed", "TestbedError", "Topology", "load_plugins", "load_topology", "load_topology_dict",
           "__version__"]
