"""The host agent's request loop (testbed.engine.hostserve): one JSON answer per line,
errors as answers, a bounded line (the real session: tests/kernel/test_multihost.py)."""

from __future__ import annotations

import io
import json

from testbed.common.errors import TestbedError
from testbed.engine import hostserve


def _fail(name, payload):
    raise TestbedError("link end (9, 'forward') is not on this host", "ask the right host")


OPS = {"counters": lambda name, payload: {"counters": {"0/forward": {"bytes": 7}}, "of": name},
       "shape": _fail}


def _serve(data: bytes) -> tuple[int, list[dict]]:
    out = io.StringIO()
    rc = hostserve.serve("tb", OPS, io.BytesIO(data), out)
    return rc, [json.loads(x) for x in out.getvalue().splitlines()]


def test_each_request_line_gets_one_answer_line_and_errors_are_answers():
    rc, answers = _serve(b'{"op": "counters"}\n{"op": "shape", "payload": {}}\nnot json\n[1]\n{"op": "apply"}\n'
                         b'{"op": "counters"}\n')
    assert rc == 0 and len(answers) == 6
    assert answers[0] == answers[5] == {"counters": {"0/forward": {"bytes": 7}}, "of": "tb"}
    assert answers[1] == {"error": "link end (9, 'forward') is not on this host", "hint": "ask the right host",
                          "type": "TestbedError"}
    assert answers[2]["error"].startswith("the request is not JSON")
    assert answers[3]["error"] == "the request is not a JSON object"
    assert "answers counters, shape, not 'apply'" in answers[4]["error"]


def test_a_request_over_the_bound_ends_the_session(monkeypatch):
    monkeypatch.setattr(hostserve, "MAX_LINE", 100)
    rc, answers = _serve(b'{"op": "counters"}\n' + b"x" * 200 + b'\n{"op": "counters"}\n')
    assert rc == 1 and len(answers) == 2 and "longer than 100 bytes" in answers[1]["error"]
