"""Worker backends: what a worker node is made of. One small interface; a registry by name.

A backend turns a planned worker into something that can run processes on the emulated
network. Creation and teardown of the network side are in the plan (so the ledger sees
them); a backend adds how to run a command inside the node.
"""

from __future__ import annotations

from .netns import NetnsBackend

BACKENDS = {"netns": NetnsBackend()}


def get(name: str):
    from ..errors import TestbedError

    try:
        return BACKENDS[name]
    except KeyError:
        raise TestbedError(f"unknown backend '{name}'", f"choose one of: {', '.join(BACKENDS)}") from None
