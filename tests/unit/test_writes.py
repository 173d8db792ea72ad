"""Write failures (full disk, I/O error) as users see them: one error naming the file, the
reason and what was kept (the real full disk: tests/kernel/test_full_disk.py)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from testbed.common import files
from testbed.common.writes import WriteFailed, disk_error, writing
from testbed.runs.diskfull import kept_records
from workloads.records import JsonlWriter


def _failing(err: int):
    def fsync(fd):
        raise OSError(err, os.strerror(err))
    return fsync


@pytest.mark.parametrize("err,name,hint", [(errno.ENOSPC, "ENOSPC", "free space"), (errno.EIO, "EIO", "dmesg"),
                                           (errno.EDQUOT, "EDQUOT", "free space")])
def test_the_atomic_writer_keeps_the_old_file_and_names_the_reason(tmp_path, monkeypatch, err, name, hint):
    path = tmp_path / "summary.json"
    files.write_json(path, {"old": 1})
    monkeypatch.setattr(files.os, "fsync", _failing(err))
    with pytest.raises(WriteFailed) as e:
        files.write_json(path, {"new": 2})
    assert str(path) in e.value.message and name in e.value.message
    assert "summary.json is as it was before" in e.value.message
    assert hint in e.value.hint
    assert json.loads(path.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left


def test_other_os_errors_pass_through(tmp_path):
    with pytest.raises(PermissionError):
        with writing(tmp_path / "x"):
            raise PermissionError(errno.EACCES, "denied")


def test_what_was_kept_is_asked_only_on_failure(tmp_path):
    asked = []
    with writing(tmp_path / "x", lambda: asked.append(1) or "3 samples kept"):
        pass
    assert not asked
    with pytest.raises(WriteFailed, match="3 samples kept"):
        with writing(tmp_path / "x", lambda: "3 samples kept"):
            raise OSError(errno.ENOSPC, "full")


def test_an_uncaught_disk_error_names_its_file_when_known():
    assert "/r/x.csv" in disk_error(OSError(errno.ENOSPC, "full", "/r/x.csv")).message
    assert "ENOSPC" in disk_error(OSError(errno.ENOSPC, "full")).message


def test_a_rank_records_writer_names_its_file_and_count(tmp_path, monkeypatch):
    w = JsonlWriter(tmp_path / "rank0.jsonl")
    w.write({"iter": 1})
    w.write({"iter": 2})

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(w._f, "flush", full)
    with pytest.raises(OSError) as e:
        w.write({"iter": 3})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "rank0.jsonl")
    assert "2 records before are kept" in e.value.strerror


def test_kept_records_lists_complete_records_per_file(tmp_path):
    (tmp_path / "rank0.jsonl").write_text('{"iter": 1}\n{"iter": 2}\n{"it')  # the last line cut short
    (tmp_path / "rank10.jsonl").write_text('{"iter": 1}\n')
    (tmp_path / "rank2.jsonl").write_text("")
    (tmp_path / "links.jsonl").write_text('{"link": "a"}\n' * 4)
    assert kept_records(tmp_path) == ("rank0.jsonl 2 records (to iteration 2), rank2.jsonl 0 records, "
                                      "rank10.jsonl 1 records (to iteration 1), links.jsonl 4 link samples")
