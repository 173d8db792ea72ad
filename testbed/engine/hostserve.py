"""``testbed _host serve NAME``: one long-lived agent per host for the requests a controller
repeats (link counters at 1 Hz, each step of a trace on a cross-host link), so that each
costs one line each way on an SSH channel kept open, not a new session and a Python start
on that host (:meth:`testbed.hosts.ssh.client.Remote.ask`).

Requests and answers are the one protocol's lines (:mod:`testbed.common.lines`: its bound
and error shape): ``{"op": "counters"}`` or ``{"op": "shape", "payload": {...}}`` in; the
operation's answer out. The agent ends with the SSH connection (PR_SET_PDEATHSIG) or at end
of input.
"""

from __future__ import annotations

from typing import Callable, Mapping

from testbed.common import lines
from testbed.common.errors import TestbedError

Op = Callable[[str, object], dict]
"""(testbed name, the request's payload) -> the answer."""


def answer(name: str, req: dict, ops: Mapping[str, Op]) -> dict:
    """The answer to one request (an error as the protocol's error answer)."""
    op = ops.get(req.get("op"))  # type: ignore[arg-type]
    if op is None:
        raise TestbedError(f"`testbed _host serve` answers {', '.join(ops)}, not {req.get('op')!r}")
    return op(name, req.get("payload"))


def serve(name: str, ops: Mapping[str, Op], stdin=None, stdout=None) -> int:
    """Answer requests for testbed ``name`` until end of input; the exit status."""
    return lines.serve(lambda req: answer(name, req, ops), stdin, stdout)
