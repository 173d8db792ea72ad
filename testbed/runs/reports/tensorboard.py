"""TensorBoard event files from a run's records, live while it trains or afterwards.

``testbed run --tensorboard`` writes them into ``<run>/tensorboard/`` as the records grow
(the launcher's tick, twice a second); ``testbed report --tensorboard DIR`` writes them from
existing run directories, one TensorBoard run per testbed run under ``DIR``. Both go through
:class:`RunEvents`, so the two give the same events. Point TensorBoard at the folder
(``tensorboard --logdir DIR``).

Layout of one run's folder (each folder is one "run" in TensorBoard's run selector)::

    rank{R}/   per iteration of rank R (step: ``iter``): train/loss, iteration/seconds,
               iteration/compute_seconds, iteration/comm_seconds, iteration/overlap_seconds,
               payload/bytes, payload/buffer_bytes, interface/tx_bytes, interface/rx_bytes,
               pacing/late_seconds (each only where the record has it)
    eval/      per evaluation (step: ``iter``): eval/accuracy, eval/loss, eval/train_seconds
    links/     per link sample (step: the sample's number): links/<link>/<direction>/utilisation
               and .../bytes_per_second

Every value is the record's, untouched (a record's ``time`` is the event's wall time); a
value that is not a finite number is left out, as report leaves it out. The event files are
written with TensorBoard's own record framing into directories held by
:class:`testbed.common.outdir.OutDir` (never through a link), one file per folder.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import LIMITS, JsonlTail
from testbed.common.outdir import OutDir
from testbed.common.writes import writing
from testbed.runs.userrecords import sane_number

RANK_TAGS = {"loss": "train/loss", "iter_s": "iteration/seconds", "compute_s": "iteration/compute_seconds",
             "comm_s": "iteration/comm_seconds", "overlap_s": "iteration/overlap_seconds",
             "payload_bytes": "payload/bytes", "buffer_bytes": "payload/buffer_bytes",
             "tx_bytes": "interface/tx_bytes", "rx_bytes": "interface/rx_bytes",
             "paced_late_s": "pacing/late_seconds", "accuracy": "eval/accuracy"}
"""Iteration record field -> its tag (a script's records may carry its own ``accuracy``)."""
EVAL_TAGS = {"accuracy": "eval/accuracy", "loss": "eval/loss", "train_s": "eval/train_seconds"}
LINK_TAGS = {"utilisation": "utilisation", "bytes_per_s": "bytes_per_second"}
_RANK_FILE = re.compile(r"rank(\d{1,6})\.jsonl")
MAX_FILE = LIMITS["records"]
"""Bytes of one records file read at most, as report reads them."""
MAX_RANKS = 1024
"""Ranks drawn at most (an event file each, open while a run is live)."""
MAX_LINKS = 1024
"""Link directions drawn at most."""
_TAG_PART = re.compile(r"[^A-Za-z0-9_.-]")


def available() -> bool:
    """Whether TensorBoard's package (the ``tensorboard`` extra) is installed."""
    try:
        import tensorboard.compat.proto.event_pb2  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    """Refuse in one line, before a run starts, when TensorBoard is not installed."""
    if not available():
        raise TestbedError("--tensorboard needs TensorBoard's package, which is not installed",
                           "pip install 'testbed[tensorboard]' (or: pip install tensorboard)")


class _EventFile:
    """One TensorBoard event file in a folder of its own, appended to as events come."""

    def __init__(self, folder: Path):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.record_writer import RecordWriter

        self.path = folder
        with OutDir(folder, "--tensorboard") as d:
            name = f"events.out.tfevents.{int(time.time())}.{_TAG_PART.sub('_', socket.gethostname())}.{os.getpid()}"
            self.file = d.open_log(name)
        self.writer = RecordWriter(self.file)
        self._write(Event(wall_time=time.time(), step=0, file_version="brain.Event:2"))

    def _write(self, event) -> None:
        with writing(self.path, "the events before are kept"):
            self.writer.write(event.SerializeToString())

    def scalars(self, step: int, wall_time: float, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        if values:
            self._write(Event(wall_time=wall_time, step=step,
                              summary=Summary(value=[Summary.Value(tag=t, simple_value=v) for t, v in values.items()])))

    def flush(self) -> None:
        with writing(self.path, "the events before are kept"):
            self.file.flush()

    def close(self) -> None:
        self.file.close()


def _number(v: object) -> float | None:
    """A record's value when it is a finite number of sane size (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not sane_number(v):
        return None
    return float(v)


def _numbers(record: dict, tags: dict[str, str]) -> dict[str, float]:
    return {tag: v for field, tag in tags.items() if (v := _number(record.get(field))) is not None}


def _step(record: dict, fallback: int) -> int:
    step = record.get("iter")
    return step if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**63 else fallback


def _wall(record: dict) -> float:
    t = _number(record.get("time"))
    return t if t is not None and t >= 0 else time.time()


class RunEvents:
    """The event files of one run directory's records, brought up to date by :meth:`update`."""

    def __init__(self, run_dir: Path, logdir: Path):
        self.run_dir, self.logdir = Path(run_dir), Path(logdir)
        self.tails: dict[str, JsonlTail] = {}
        self.files: dict[str, _EventFile] = {}
        self.counts: dict[str, int] = {}
        self.links = 0
        """Link directions drawn so far (keys ``links/...`` of ``counts``)."""
        self.events = 0
        """Scalar events written so far (one per record or link sample)."""

    def _file(self, folder: str) -> _EventFile:
        if folder not in self.files:
            self.files[folder] = _EventFile(self.logdir / folder)
        return self.files[folder]

    def _new(self, name: str) -> Iterator[dict]:
        """The records ``name`` gained, a batch (at most 8 MiB) in memory at a time, and none
        past the records' bound (a file that grows without end is read up to it)."""
        tail = self.tails.setdefault(name, JsonlTail(self.run_dir / name))
        while tail.offset < MAX_FILE and (batch := tail.read()):
            yield from batch

    def _write(self, folder: str, step: int, wall: float, values: dict[str, float]) -> None:
        if values:
            self._file(folder).scalars(step, wall, values)
            self.events += 1

    def update(self) -> int:
        """Write what the records gained since the last call; the events written."""
        before = self.events
        ranks = sorted((int(m.group(1)), p.name) for p in _listing(self.run_dir)
                       if (m := _RANK_FILE.fullmatch(p.name)))[:MAX_RANKS]
        for rank, name in ranks:
            for i, r in enumerate(self._new(name), self.counts.get(name, 0) + 1):
                self._write(f"rank{rank}", _step(r, i), _wall(r), _numbers(r, RANK_TAGS))
                self.counts[name] = i
        for i, e in enumerate(self._new("eval.jsonl"), self.counts.get("eval.jsonl", 0) + 1):
            self._write("eval", _step(e, i), _wall(e), _numbers(e, EVAL_TAGS))
            self.counts["eval.jsonl"] = i
        self._links()
        for f in self.files.values():
            f.flush()
        return self.events - before

    def _links(self) -> None:
        for s in self._new("links.jsonl"):
            link, direction = s.get("link"), s.get("direction")
            if not isinstance(link, str) or not isinstance(direction, str):
                continue
            key = f"links/{_TAG_PART.sub('_', link[:64])}/{_TAG_PART.sub('_', direction[:16])}"
            if key not in self.counts:
                if self.links >= MAX_LINKS:
                    continue  # a records file naming link after link: the first MAX_LINKS are drawn
                self.links += 1
            n = self.counts[key] = self.counts.get(key, 0) + 1
            values = {f"{key}/{t}": v for t, v in _numbers(s, LINK_TAGS).items()}
            self._write("links", n, _wall(s), values)

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()


def _listing(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def folders(paths: list[Path]) -> list[tuple[Path, str]]:
    """Each run directory with its folder under a log directory: its path below the runs'
    common folder (a sweep's ``<point>-r<k>``, or ``<sweep>/<point>`` for several sweeps)."""
    resolved = [Path(os.path.abspath(p)) for p in paths]
    if len(resolved) == 1:
        return [(resolved[0], resolved[0].name)]
    top = Path(os.path.commonpath(resolved))
    out, taken = [], set()
    for p in resolved:
        name = base = str(p.relative_to(top)) if p != top else p.name
        k = 1
        while name in taken:  # /x/a beside /x/a/a: both would be "a"
            k += 1
            name = f"{base}-{k}"
        taken.add(name)
        out.append((p, name))
    return out


def write(run_dirs: list[tuple[Path, str]], logdir: Path) -> dict:
    """Event files for finished runs: ``run_dirs`` is (run directory, its folder under
    ``logdir``). Returns what was written, for ``--json``."""
    written = []
    for run_dir, folder in run_dirs:
        events = RunEvents(run_dir, logdir / folder)
        try:
            n = events.update()
        finally:
            events.close()
        written.append({"run": str(run_dir), "logdir": str(logdir / folder), "events": n})
    return {"logdir": str(logdir), "runs": written}
