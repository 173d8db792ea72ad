"""The embedded default backend: a worker is a named network namespace on this host."""

from __future__ import annotations

import subprocess
import sys
from typing import Sequence


class NetnsBackend:
    name = "netns"

    def command(self, ns: str, argv: Sequence[str]) -> list[str]:
        """argv that runs ``argv`` inside namespace ``ns`` (with /sys showing its interfaces)."""
        return [sys.executable, "-m", "testbed.nsexec", ns, "--", *argv]

    def spawn(self, ns: str, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(ns, argv), **popen_kwargs)
