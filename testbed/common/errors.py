"""Errors users see.

Every failure a user can cause or fix is a :class:`TestbedError` carrying a message
(what is wrong, naming the field or value) and a hint (how to fix it). The CLI prints
both and exits non-zero without a traceback. Foreign exceptions (pyroute2's
``NetlinkError``, ``OSError``) are translated at the boundary where they happen.
"""

from __future__ import annotations

import reprlib

MAX_MESSAGE = 10_000
"""Characters of an error message or hint that are kept: a value quoted from a hostile
input (a 5 MB line of a trace) must not become a 10 MB error."""

_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict, _repr.maxlevel = 120, 120, 8, 8, 3


def shown(value: object) -> str:
    """``repr(value)`` for an error message, bounded (reprlib: long strings and containers
    are cut with ``...``), so a huge or deeply nested input cannot make a huge message."""
    return _repr.repr(value)


def printable(text: str | None, limit: int = MAX_MESSAGE) -> str | None:
    """``text`` with control characters (but newlines and tabs) written as escapes, so an
    input's ESC sequences cannot reach the terminal, and cut to ``limit`` characters."""
    if text is None:
        return None
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


class TestbedError(Exception):
    """A failure the user can understand and act on."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, message: str, hint: str | None = None):
        message, hint = printable(str(message)) or "", printable(hint)
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
