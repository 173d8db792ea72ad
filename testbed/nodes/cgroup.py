"""The testbed's cgroup as an action: made first on each host, removed last by ``down``
(after the processes in the nodes' namespaces were stopped), ending whatever is left in it:
what a node's process started and moved elsewhere (a new network namespace, a new session).

The ledger names only the testbed; the path is worked out where the action runs (that
host's cgroup2 mount and state directory, :func:`testbed.common.cgroups.path_for`), so an
entry cannot point ``down`` at another cgroup. Where cgroups cannot be made (no cgroup2,
not root) the action does nothing, and neither does its undo.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.common import cgroups
from testbed.common.errors import TestbedError
from testbed.plan import naming
from testbed.plan.base import Action, ApplyContext, Teardown, register


def path(testbed: str) -> Path | None:
    """Testbed ``testbed``'s cgroup on this host, for this state directory."""
    return cgroups.path_for(testbed, naming.state_id())


def command_option(netns: str) -> list[str]:
    """``--cgroup PATH`` for :mod:`testbed.nodes.nsexec` starting a process in node namespace
    ``netns`` (``NAME`` or ``NAME.NODE``): it joins testbed NAME's cgroup when there is one."""
    p = path(netns.partition(".")[0])
    return ["--cgroup", str(p)] if p is not None else []


@register
@dataclass(frozen=True)
class CreateCgroup(Action):
    testbed: str

    def describe(self) -> str:
        return f"cgroup {cgroups.TOP}/{naming.state_id()}.{self.testbed}  (every process started in the nodes)"

    def apply(self, ctx: ApplyContext) -> None:
        ctx.results["cgroup"] = str(p) if cgroups.create(p := path(self.testbed)) else None

    def undo(self, td: Teardown) -> None:
        if self.testbed != td.testbed:
            td.problems.append(f"ledger entry CreateCgroup names testbed {self.testbed!r}, not {td.testbed!r}; "
                               "left alone")
            return
        p = path(self.testbed)
        if p is None:
            return
        for what in cgroups.remove(p):
            td.problems.append(f"could not end {what}, started in testbed {td.testbed} (its cgroup {p})")


def sweep(testbeds: set[str] | None, problems: list[str]) -> list[str]:
    """Remove the cgroups of this state directory's testbeds ``testbeds`` (None: all) that
    a lost or damaged ledger no longer lists; the testbeds found."""
    found = []
    for name, p in cgroups.of_state(naming.state_id()).items():
        if testbeds is not None and name not in testbeds:
            continue
        try:
            left = cgroups.remove(p)
        except TestbedError as e:
            problems.append(e.message)
            continue
        problems += [f"could not end {what}, started in testbed {name} (its cgroup {p})" for what in left]
        found.append(name)
    return found
