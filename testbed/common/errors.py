"""Errors users see.

Every failure a user can cause or fix is a :class:`TestbedError` carrying a message
(what is wrong, naming the field or value) and a hint (how to fix it). The CLI prints
both and exits non-zero without a traceback. Foreign exceptions (pyroute2's
``NetlinkError``, ``OSError``) are translated at the boundary where they happen.
"""

from __future__ import annotations


class TestbedError(Exception):
    """A failure the user can understand and act on."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"

    def to_dict(self) -> dict:
        return {"error": self.message, "hint": self.hint, "type": type(self).__name__}


class TopologyError(TestbedError):
    """The topology file is invalid; the message names the YAML path."""

    def __init__(self, path: str, message: str, hint: str | None = None):
        super().__init__(f"{path}: {message}" if path else message, hint)
        self.path = path


class KernelError(TestbedError):
    """A kernel operation failed (netlink, namespaces, mounts)."""


class StateError(TestbedError):
    """The testbed is not in the state the command needs (not up, already up, locked)."""
