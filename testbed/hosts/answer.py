"""A host agent's answer line (``testbed _host serve``), read the same way over every transport
(an SSH channel, a Slurm step)."""

from __future__ import annotations

import json

from testbed.common.errors import TestbedError


def parse_answer(host: str, op: str, got: bytes) -> dict:
    """The answer to ``op`` from ``host``'s agent: a JSON object; an error it reports, or
    anything else it sent, raised as one line naming the host."""
    try:
        answer = json.loads(got)
    except (json.JSONDecodeError, UnicodeDecodeError):
        answer = None
    if not isinstance(answer, dict):
        raise TestbedError(f"host {host}: its agent answered {op} with {got[:200]!r}")
    if isinstance(answer.get("error"), str):
        raise TestbedError(f"host {host}: {answer['error']}", answer.get("hint"))
    return answer
