"""The only code that talks to the kernel's network stack (pyroute2 / netlink).

pyroute2 is imported module by module (``pyroute2.iproute.linux``, not ``pyroute2``):
its package's ``__init__`` imports every protocol it speaks, and is deferred here until
something asks the package itself (``testbed.common.lazypkg``)."""

from testbed.common.lazypkg import lazy_package

lazy_package("pyroute2")
