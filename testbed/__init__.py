"""testbed: a network-emulation lab for communication-efficient distributed training.

Importing needs no root; building a testbed does.
"""

from testbed.common.errors import TestbedError
from testbed.common.version import __version__
from testbed.model.topology import Topology, load_topology, load_topology_dict  # noqa: E402


def __getattr__(name):  # lazy: keep `import testbed` free of netlink imports
    if name == "Testbed":
        from testbed.engine.core import Testbed

        return Testbed
    raise AttributeError(name)


__all__ = ["Testbed", "TestbedError", "Topology", "load_topology", "load_topology_dict", "__version__"]
