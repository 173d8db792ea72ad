"""The node interface: what every backend (netns, docker, vm) provides.

In the spirit of containerlab's ``Node`` and Mininet's node/intf/link split, but small.
A backend

* validates its own topology keys (``image:``, ``cpus:``, ...) and plans the actions that
  make a worker node and its network namespace (:meth:`Backend.plan_node`);
* names the namespace handle through which :mod:`testbed.net` reaches the node's
  interfaces (:meth:`Backend.namespace`), so links, shaping and counters never ask what a
  node is made of;
* runs processes inside the node (:meth:`Backend.command`, :meth:`Backend.python`,
  :meth:`Backend.environment`) and stops them (:meth:`Backend.stop`);
* moves files in and out (:meth:`Backend.put`, :meth:`Backend.get`).

``testbed exec``, the launcher and ``down`` go through this interface only.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from testbed.plan.actions import SetSysctl


@dataclass
class Check:
    """One line of `testbed doctor`: what is there, and how to get it if it is not."""

    name: str
    ok: bool
    detail: str
    hint: str | None = None
    required: bool = False


class Backend(abc.ABC):
    name: str = ""
    needs_root: str | None = None
    """Why this backend cannot build its nodes in an ordinary user's rootless namespaces
    (None: it can); a rootless ``up`` refuses it with this reason."""

    def preflight(self, nodes) -> None:
        """Checks before anything is created (e.g. an engine reachable, images present)."""

    def why_stopped(self, info) -> str | None:
        """Why a process in this node may have died beyond its own doing (e.g. the node is gone)."""
        return None

    @abc.abstractmethod
    def plan_node(self, testbed: str, node, ns: str, tag: str, address: str, sysctls: tuple) -> list:
        """Actions that create the node and its network namespace ``ns`` (tagged ``tag``),
        with the worker's data-plane ``address`` (CIDR) and ``sysctls``: a backend whose
        ``host_address`` is True leaves the address to the plan (it goes on ``eth0`` once
        the link exists) and sets the sysctls in ``ns`` (:meth:`namespace_sysctls`); a VM's
        guest carries both itself."""
        ...

    @staticmethod
    def namespace_sysctls(ns: str, sysctls: tuple) -> list:
        """The node's sysctls, set in its network namespace."""
        return [SetSysctl(ns, k, v) for k, v in sysctls]

    host_address = True
    """Whether the worker's address and sysctls go on ``eth0`` in its host-side namespace
    (netns, docker); a VM's guest carries them instead."""

    node_master: str | None = None
    """A bridge in the node's namespace that the worker's link end joins (a VM's NIC)."""

    def plan_ready(self, infos) -> list:
        """Actions at the end of the plan (e.g. wait until VMs that boot meanwhile answer)."""
        return []

    def namespace(self, info) -> str:
        """The network namespace handle (a name under /run/netns) of the node's interfaces."""
        return info.netns

    @abc.abstractmethod
    def command(self, info, argv: Sequence[str], *, mounts: Sequence[Path] = (), cwd: Path | None = None) -> list[str]:
        """Host argv that runs ``argv`` inside the node; ``mounts``: host directories the
        command must see at the same path (run directories, checkpoints)."""
        ...

    @abc.abstractmethod
    def python(self, info) -> str:
        """The Python interpreter inside the node."""
        ...

    def environment(self, info) -> dict[str, str]:
        """The base environment of a process inside the node (a rank's variables go on top)."""
        return dict(os.environ)

    shares_host_gpus = True
    """Whether a process in the node sees every GPU of the host (a namespace does), so that
    workers without ``gpu:`` can be spread over them at run time."""

    def own_gpu(self, node) -> bool:
        """Whether the topology's ``node`` has a GPU of its own that only it sees (recorded in
        its NodeInfo as ``own_gpu``; the node then numbers it 0)."""
        return False

    def cuda_visible(self, info, gpu: int | None) -> str:
        """CUDA_VISIBLE_DEVICES for a rank in the node given host GPU ``gpu`` (None: no GPU)."""
        return "" if gpu is None else str(gpu)

    @abc.abstractmethod
    def stop(self, info) -> None:
        """Stop every process running inside the node (the node itself stays)."""
        ...

    @abc.abstractmethod
    def put(self, info, src: Path, dst: str) -> None:
        """Copy host file ``src`` into the node at path ``dst``."""
        ...

    @abc.abstractmethod
    def get(self, info, src: str, dst: Path) -> None:
        """Copy the node's file ``src`` to host path ``dst``."""
        ...

    # ------------------------------------------------------------- host-wide duties
    def checks(self) -> list[Check]:
        """What this backend needs on the host, for `testbed doctor` (engine, images, tools)."""
        return []

    def build_image(self, say, force: bool = False, **options) -> dict | None:
        """Build what this backend's workers start from (`testbed image build --backend NAME`);
        None when it needs nothing built."""
        return None

    def recover(self, testbeds: set[str] | None, problems: list[str]) -> list[str]:
        """Remove what this backend made for ``testbeds`` (None: any) that no ledger lists any
        more (``down --all`` after a lost ledger), found by its own labels; returns the
        testbeds found. Failures are appended to ``problems``."""
        return []

    def forget(self, namespaces: Sequence[str]) -> None:
        """After the processes in orphaned node ``namespaces`` were stopped: remove what this
        backend keeps for them outside the namespace (e.g. a VM's state directory)."""
