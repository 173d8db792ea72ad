"""The one protocol between testbed's processes (testbed.common.lines), as the host agent's
request loop (testbed.engine.hostserve) and a Slurm node's file step
(testbed.hosts.slurm.files) speak it: one JSON answer per line, errors as answers in one
shape, a bounded line both ways (the real sessions: tests/kernel/test_multihost.py and
test_slurm.py)."""

from __future__ import annotations

import io
import json

import base64

import pytest

from testbed.common import lines
from testbed.common.errors import TestbedError
from testbed.engine import hostserve
from testbed.hosts.slurm import files as slurmfiles


def _fail(name, payload):
    raise TestbedError("link end (9, 'forward') is not on this host", "ask the right host")


OPS = {"counters": lambda name, payload: {"counters": {"0/forward": {"bytes": 7}}, "of": name},
       "shape": _fail}


def _serve(data: bytes) -> tuple[int, list[dict]]:
    out = io.BytesIO()
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
    monkeypatch.setattr(lines, "MAX_LINE", 100)
    rc, answers = _serve(b'{"op": "counters"}\n' + b"x" * 200 + b'\n{"op": "counters"}\n')
    assert rc == 1 and len(answers) == 2 and "longer than 100 bytes" in answers[1]["error"]


def test_the_file_step_speaks_the_same_lines_with_the_same_error_shape(tmp_path, monkeypatch):
    f = tmp_path / "rank0.jsonl"
    f.write_bytes(b"0123456789" * 5)
    out = io.BytesIO()
    requests = [{"op": "read", "path": str(f), "offset": 45}, {"op": "stat", "path": str(tmp_path / "gone")},
                {"op": "read", "path": "relative"}]
    rc = slurmfiles.serve(io.BytesIO(b"".join(lines.encode(r) for r in requests) + b"[]\n"), out)
    got = [json.loads(x) for x in out.getvalue().splitlines()]
    assert rc == 0 and base64.b64decode(got[0]["data"]) == b"56789"
    assert got[1]["errno"] == 2 and got[1]["type"] == "OSError" and got[1]["error"].startswith("stat ")
    assert set(got[1]) == {"error", "hint", "type", "errno"}
    assert got[2]["type"] == "ValueError" and "not an absolute path" in got[2]["error"]
    assert got[3] == {"error": "the request is not a JSON object", "hint": None, "type": "TestbedError"}


def test_a_files_read_comes_in_chunks_each_within_the_line(tmp_path, monkeypatch):
    """A file over one answer's chunk is read in several requests (before: the whole rest in
    one line, and a records file over the line's bound ended the session)."""
    monkeypatch.setattr(slurmfiles, "CHUNK", 7)
    f = tmp_path / "big"
    f.write_bytes(bytes(range(50)))
    client = object.__new__(slurmfiles.FilesClient)
    asked = []

    def ask(op, path, **more):
        asked.append(more["offset"])
        return slurmfiles.handle({"op": op, "path": path, **more})
    client._ask = ask
    remote = client.open(str(f))
    remote.seek(3)
    assert remote.read() == bytes(range(3, 50)) and asked == [3, 10, 17, 24, 31, 38, 45]
    remote.seek(0)
    assert remote.read(10) == bytes(range(10)) and remote.read(5) == bytes(range(10, 15))


def test_a_client_gives_up_on_an_answer_over_the_bound_or_none(monkeypatch):
    monkeypatch.setattr(lines, "MAX_LINE", 10)
    with pytest.raises(EOFError, match="over 10 bytes"):
        lines.read_line(io.BytesIO(b"x" * 20 + b"\n"))
    with pytest.raises(EOFError, match=lines.ENDED):
        lines.read_line(io.BytesIO(b""))
    with pytest.raises(EOFError, match="cut short"):
        lines.read_line(io.BytesIO(b'{"a": 1'))
    assert lines.read_line(io.BytesIO(b'{"a": 1}\n{')) == b'{"a": 1}\n'
