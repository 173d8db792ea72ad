"""One protocol between testbed's processes: JSON objects, one per line, each way.

A request is one line in, its answer one line out; the same framing, bound and error shape
for every pair that speaks it: a host's agent and its controller (``testbed _host serve``,
:mod:`testbed.engine.hostserve`, over SSH or a Slurm step) and a Slurm node's file step
(:mod:`testbed.hosts.slurm.files`).

* A line holds at most :data:`MAX_LINE` bytes, its newline included. A server that reads a
  longer request answers an error and ends the session (exit 1): it cannot tell where the
  next request begins. A client that reads a longer answer, or none, gives up the session.
* An error is an answer: ``{"error": MESSAGE, "hint": HINT or null, "type": KIND}``, with
  ``"errno"`` besides where an operating system error is meant (a file step's ENOENT).
* What a line holds is untrusted on both sides: not JSON, or not an object, is an error.
"""

from __future__ import annotations

import json
import sys
from typing import Callable

from testbed.common.errors import TestbedError

ENDED = "the other side ended"
"""read_line's EOFError when nothing came: the other side's process or connection ended."""
MAX_LINE = 64 << 20
"""Bytes of one line at most, newline included: a shape request for every link end of a
large testbed, or a 32 MiB chunk of a file base64-encoded, fit."""


def error(message: str, hint: str | None = None, kind: str = "TestbedError", **extra) -> dict:
    """The one error answer."""
    return {"error": message, "hint": hint, "type": kind, **extra}


def encode(obj: dict) -> bytes:
    """``obj`` as one line (``default=str``: a path or a number type of the answer's)."""
    return (json.dumps(obj, default=str) + "\n").encode()


def decode(line: bytes) -> dict:
    """The object one line holds; TestbedError when it is not a JSON object."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise TestbedError(f"the request is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise TestbedError("the request is not a JSON object")
    return obj


def read_line(reader) -> bytes:
    """One whole line from ``reader`` (a binary file), within the bound; EOFError when the
    other side ended (nothing, or a cut line) or sent more than a line may hold."""
    got = reader.readline(MAX_LINE + 1)
    if not got:
        raise EOFError(ENDED)
    if not got.endswith(b"\n"):
        raise EOFError(f"a line over {MAX_LINE} bytes" if len(got) > MAX_LINE else "a line cut short")
    return got


def serve(handle: Callable[[dict], dict], stdin=None, stdout=None) -> int:
    """Answer each request line with ``handle(request)`` (a TestbedError it raises is the
    error answer) until end of input; the exit status (1: a line over the bound)."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    while True:
        line = stdin.readline(MAX_LINE + 1)
        if not line:
            return 0
        if len(line) > MAX_LINE:
            stdout.write(encode(error(f"a request longer than {MAX_LINE} bytes; session ended")))
            stdout.flush()
            return 1
        try:
            answer = handle(decode(line))
        except TestbedError as e:
            answer = e.to_dict()
        stdout.write(encode(answer))
        stdout.flush()
