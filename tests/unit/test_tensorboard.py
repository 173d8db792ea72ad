"""TensorBoard event files from records (testbed.runs.reports.tensorboard), read back by TensorBoard's
own reader: every record's value at its step, the new ones only as the records grow, and what
is not a finite number (a hostile or torn records file) left out rather than written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from testbed.runs.reports import tensorboard as events  # noqa: E402
from tests.helpers import records_as_scalars, tensorboard_scalars  # noqa: E402


def _lines(path: Path, *records: dict | str) -> None:
    with open(path, "a") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def _iter(rank: int, i: int, **extra) -> dict:
    return {"rank": rank, "iter": i, "epoch": 0, "time": 1.7e9 + i, "iter_s": 0.1 * i, "compute_s": 0.05,
            "comm_s": 0.04, "overlap_s": 0.01, "loss": 2.0 / i, "payload_bytes": 1000 * i, "tx_bytes": 10**9 + i,
            "rx_bytes": 10**9 + 2 * i, **extra}


def _link(t: float, util: float, link: str = "s0-s1", direction: str = "forward") -> dict:
    return {"time": t, "link": link, "direction": direction, "bytes": 5, "drops": 0, "rate_bps": 1e8,
            "bytes_per_s": util * 1.25e7, "utilisation": util}


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "runs" / "20261207-120000-allreduce-100mbit"
    d.mkdir(parents=True)
    for rank in (0, 1):
        _lines(d / f"rank{rank}.jsonl", *(_iter(rank, i) for i in (1, 2, 3)))
    _lines(d / "eval.jsonl", {"iter": 3, "epoch": 0, "time": 1.7e9 + 3, "train_s": 0.6, "accuracy": 0.5,
                              "loss": 1.2})
    _lines(d / "links.jsonl", *(_link(1.7e9 + t, 0.1 * t, direction=x) for t in (1, 2) for x in ("forward", "reverse")))
    return d


def _values(folder: Path) -> dict[str, list[tuple[int, float]]]:
    return {t: [(s, v) for s, v, _ in xs] for t, xs in tensorboard_scalars(folder).items()}


def _approx(want: dict[str, list[tuple[int, float]]]) -> dict:
    return {t: [(s, pytest.approx(v, rel=1e-6)) for s, v in xs] for t, xs in want.items()}


def test_every_records_value_is_read_back_at_its_step_and_only_new_ones_are_added(run_dir, tmp_path):
    logdir = tmp_path / "tb"
    ev = events.RunEvents(run_dir, logdir)
    assert ev.update() == 2 * 3 + 1 + 4
    assert ev.update() == 0  # nothing new
    _lines(run_dir / "rank0.jsonl", _iter(0, 4))
    with open(run_dir / "rank1.jsonl", "a") as f:  # a line still being written
        f.write(json.dumps(_iter(1, 4))[:30])
    assert ev.update() == 1
    with open(run_dir / "rank1.jsonl", "a") as f:  # its rest comes
        f.write(json.dumps(_iter(1, 4))[30:] + "\n")
    assert ev.update() == 1
    ev.close()
    want = records_as_scalars(run_dir)
    for folder, tags in want.items():
        got = _values(logdir / folder)
        assert {t: got[t] for t in tags} == _approx(tags), folder
    assert _values(logdir / "eval")["eval/loss"] == [(3, pytest.approx(1.2))]
    assert _values(logdir / "eval")["eval/train_seconds"] == [(3, pytest.approx(0.6))]
    assert _values(logdir / "links")["links/s0-s1/reverse/bytes_per_second"] == [(1, pytest.approx(1.25e6)),
                                                                                 (2, pytest.approx(2.5e6))]
    # a record's time is the event's wall time
    assert [w for _, _, w in tensorboard_scalars(logdir / "rank0")["train/loss"]] == [1.7e9 + i for i in (1, 2, 3, 4)]


def test_values_that_are_no_finite_numbers_and_hostile_names_are_left_out(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    _lines(d / "rank0.jsonl", {"iter": 1, "loss": True, "iter_s": "fast", "payload_bytes": 10**400,
                               "compute_s": [1], "comm_s": 0.5, "time": -5},
           "NaN", "[1, 2]", '{"iter": 2, "loss": NaN, "iter_s": Infinity, "comm_s": 0.25}',
           {"iter": -3, "comm_s": 0.125}, {"iter": True, "comm_s": 0.0625})
    _lines(d / "links.jsonl", _link(1.0, 0.5, link="../../etc/passwd", direction="forward/../x"),
           {"link": 7, "direction": "forward", "utilisation": 0.9})
    ev = events.RunEvents(d, tmp_path / "tb")
    ev.update()
    ev.close()
    got = _values(tmp_path / "tb" / "rank0")
    # only comm_s is a number each time; a step that is not a count becomes the record's place
    assert got == {"iteration/comm_seconds": [(1, 0.5), (2, 0.25), (3, 0.125), (4, 0.0625)]}
    assert set(_values(tmp_path / "tb" / "links")) == {"links/.._.._etc_passwd/forward_.._x/utilisation",
                                                       "links/.._.._etc_passwd/forward_.._x/bytes_per_second"}
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["links", "rank0"]


def test_a_reports_runs_get_folders_below_their_common_one(tmp_path):
    a, b = tmp_path / "sweep" / "topk-100mbit-r0", tmp_path / "sweep" / "topk-1gbit-r0"
    assert events.folders([a, b]) == [(a, "topk-100mbit-r0"), (b, "topk-1gbit-r0")]
    assert events.folders([a]) == [(a, "topk-100mbit-r0")]
    c = tmp_path / "other" / "x"
    assert events.folders([a, c]) == [(a, "sweep/topk-100mbit-r0"), (c, "other/x")]


def test_without_tensorboard_the_options_are_refused_in_one_line(run_dir, tmp_path):
    """The real CLI in a Python where TensorBoard cannot be imported: one line, exit 1,
    nothing made (not even the report)."""
    import subprocess
    import sys

    hide = "import sys; sys.modules['tensorboard'] = None; from testbed.cli import main; sys.argv[0] = 'testbed'; main()"
    for argv in (["report", str(run_dir), "--tensorboard", str(tmp_path / "tb")],
                 ["run", "allreduce", "--tensorboard", "--out", str(tmp_path / "out")]):
        r = subprocess.run([sys.executable, "-c", hide, *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("error: --tensorboard needs TensorBoard's package"), r.stderr
        assert "pip install 'testbed[tensorboard]'" in r.stderr
    assert not (tmp_path / "tb").exists() and not (tmp_path / "out").exists()
    assert not (run_dir / "report").exists()


def test_a_records_file_is_read_to_its_bound_and_names_are_bounded_too(tmp_path, monkeypatch):
    """A hostile run directory (the review of issue 59's parts): a records file that grows
    without end is read up to the records' bound, a batch at a time; link names past the
    bound are not drawn; two runs whose paths would share a folder get one each."""
    d = tmp_path / "run"
    d.mkdir()
    _lines(d / "rank0.jsonl", *(_iter(0, i) for i in range(1, 200)))
    _lines(d / "links.jsonl", *(_link(1.0 + i, 0.5, link=f"l{i}") for i in range(10)))
    from testbed.common import files

    monkeypatch.setattr(files, "MiB", 100)  # JsonlTail's batch: 800 bytes, three or so records
    monkeypatch.setattr(events, "MAX_FILE", 1000)
    monkeypatch.setattr(events, "MAX_LINKS", 3)
    ev = events.RunEvents(d, tmp_path / "tb")
    ev.update()
    ev.close()
    got = _values(tmp_path / "tb" / "rank0")["train/loss"]
    assert 2 <= len(got) <= (1000 + 800) // 200, len(got)  # to the bound and its last batch, of 199
    assert {t.split("/")[1] for t in _values(tmp_path / "tb" / "links")} == {"l0", "l1", "l2"}
    a = tmp_path / "x" / "a"
    assert events.folders([a, a / "a"]) == [(a, "a"), (a / "a", "a-2")]
