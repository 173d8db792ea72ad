"""Where ``testbed up --hosts SOURCE`` takes a topology's hosts from: the registry.

``slurm`` (:mod:`testbed.hosts.slurm.job`): the nodes of the Slurm job the command runs in.
A source's module gives ``assign_hosts(data)``, the topology document with its hosts filled
in before it is loaded, and ``after_up(name, topology)``, what it does once the testbed is
up (the Slurm source starts the step that removes this node's part at the job's end). The
CLI asks this registry, never which source it is: registering one is a line here, its module
imported on first use.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_REGISTERED: dict[str, str] = {
    "slurm": "testbed.hosts.slurm.job",
}
"""``--hosts`` value -> the module that implements it."""


def names() -> list[str]:
    return sorted(_REGISTERED)


def source(name: str) -> ModuleType | None:
    """The module behind ``--hosts name``; None for a name no source has."""
    where = _REGISTERED.get(name)
    return importlib.import_module(where) if where else None
