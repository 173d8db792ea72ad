"""``testbed _host serve NAME``: one long-lived agent per host for the requests a controller
repeats (link counters at 1 Hz, each step of a trace on a cross-host link), so that each
costs one line each way on an SSH channel kept open, not a new session and a Python start
on that host (:meth:`testbed.hosts.ssh.Remote.ask`).

Requests and answers are JSON, one per line: ``{"op": "counters"}`` or ``{"op": "shape",
"payload": {...}}`` in; the operation's answer, or ``{"error": ..., "hint": ...}``, out. A line
longer than :data:`MAX_LINE` ends the session. The agent ends with the SSH connection
(PR_SET_PDEATHSIG) or at end of input.
"""

from __future__ import annotations

import json
import sys
from typing import Callable, Mapping

from testbed.common.errors import TestbedError

MAX_LINE = 16 << 20
"""A request's bound: a shape request for every link end of a large testbed fits easily."""

Op = Callable[[str, object], dict]
"""(testbed name, the request's payload) -> the answer."""


def answer(name: str, line: bytes, ops: Mapping[str, Op]) -> dict:
    """The answer to one request line (an error as ``{"error", "hint"}``)."""
    try:
        try:
            req = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TestbedError(f"the request is not JSON: {e}") from None
        if not isinstance(req, dict):
            raise TestbedError("the request is not a JSON object")
        op = ops.get(req.get("op"))  # type: ignore[arg-type]
        if op is None:
            raise TestbedError(f"`testbed _host serve` answers {', '.join(ops)}, not {req.get('op')!r}")
        return op(name, req.get("payload"))
    except TestbedError as e:
        return e.to_dict()


def serve(name: str, ops: Mapping[str, Op], stdin=None, stdout=None) -> int:
    """Answer requests for testbed ``name`` until end of input; the exit status."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    while True:
        line = stdin.readline(MAX_LINE + 1)
        if not line:
            return 0
        if len(line) > MAX_LINE:
            stdout.write(json.dumps({"error": f"a request longer than {MAX_LINE} bytes; session ended"}) + "\n")
            stdout.flush()
            return 1
        stdout.write(json.dumps(answer(name, line, ops), default=str) + "\n")
        stdout.flush()
