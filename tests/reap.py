"""Remove what an interrupted earlier test session left on this machine (CI runs this first).

The kernel tests give every testbed a private state directory under pytest's temporary
directory. If a session is killed (the machine restarted, CI timed out), its namespaces,
QEMU guests and containers stay, tagged with a state directory that no longer exists, and
the next session's tests collide with them ("already exist and are not this testbed's").
`testbed down --all` rightly leaves other state directories' testbeds alone, so this
script, meant only for test machines, removes every testbed-tagged namespace that the
default state directory does not own, and containers labelled with a pytest state dir.

    python tests/reap.py
"""

from __future__ import annotations

import sys

from testbed.plan import naming
from testbed.nodes.vm.backend import forget_vms
from testbed.common.errors import TestbedError
from testbed.net import netns
from testbed.net.rtnl import Rtnl


def stale_namespaces() -> list[str]:
    default = naming.state_id(naming.DEFAULT_STATE)
    out = []
    for ns in netns.list_all():
        try:
            with Rtnl.open(ns) as rt:
                alias = rt.lo_alias() or ""
        except TestbedError:
            continue
        if alias.startswith(naming.TAG_PREFIX) and naming.testbed_of_tag(alias, default) is None:
            out.append(ns)
    return out


def stale_containers() -> list:
    try:
        import docker

        dc = docker.from_env(timeout=30)
        return [c for c in dc.containers.list(all=True)
                if c.labels.get("testbed.state", "").startswith("/tmp/pytest-of-")]
    except Exception:  # no SDK or no engine: no containers can exist
        return []


def main() -> int:
    nss = stale_namespaces()
    if nss:
        netns.kill_processes(nss)
        forget_vms(nss)
        for ns in nss:
            netns.remove(ns)
    cs = stale_containers()
    for c in cs:
        c.remove(force=True)
    print(f"reap: removed {len(nss)} stale namespace(s) {nss}, {len(cs)} container(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
