"""The embedded default backend: a worker is a named network namespace on this host."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Sequence

from testbed.common import procs
from testbed.plan.actions import CreateNetns
from testbed.net import netns
from testbed.nodes import cgroup
from testbed.nodes.base import Backend


class NetnsBackend(Backend):
    name = "netns"

    def plan_node(self, testbed: str, node, ns: str, tag: str, address: str, sysctls: tuple) -> list:
        return [CreateNetns(ns, tag), *self.namespace_sysctls(ns, sysctls)]

    def command(self, info, argv: Sequence[str], *, mounts: Sequence[Path] = (), cwd: Path | None = None) -> list[str]:
        # The host's file system is the node's: mounts need nothing; the working directory is
        # set inside, as for container and VM workers (a rank runs in its run directory);
        # the process joins the testbed's cgroup first, so `down` finds all it starts
        where = ["--cwd", str(Path(cwd).resolve())] if cwd is not None else []
        return procs.python_argv("testbed.nodes.nsexec", info.netns, *where, *cgroup.command_option(info.netns),
                                 "--", *argv)

    def python(self, info) -> str:
        return sys.executable

    def stop(self, info) -> None:
        netns.kill_processes([info.netns])

    def put(self, info, src: Path, dst: str) -> None:
        shutil.copyfile(src, dst)

    def get(self, info, src: str, dst: Path) -> None:
        shutil.copyfile(src, dst)
