"""testbed: a network-emulation lab for communication-efficient distributed training.

Importing needs no root; building a testbed does.
"""

__version__ = "0.1.0"

from .errors import TestbedError  # noqa: E402
from .topology import Topology, load_topology, load_topology_dict  # noqa: E402


def __getattr__(name):  # lazy: keep `import testbed` free of netlink imports
    if name == "Testbed":
        from .core import Testbed

        return Testbed
    raise AttributeError(name)


__all__ = ["Testbed", "TestbedError", "Topology", "load_topology", "load_topology_dict", "__version__"]
