"""A run whose disk fills (or fails): what it says, and what of its records it kept.

The controller's own writes (link samples, cross-traffic reports, summaries) fail as
:class:`~testbed.common.writes.WriteFailed` naming the file; a rank that cannot write its
records dies of it, and its log (on the same disk) may not even hold why. Either way the
run ends with one error that names the run directory's file system and lists the complete
records kept there, which stay readable (a line cut short is skipped by every reader).
"""

from __future__ import annotations

import re
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import read_jsonl
from testbed.common.writes import WriteFailed, free_bytes, nearly_full
from testbed.runs.launch import RankFailed

__all__ = ["as_disk_failure", "kept_records"]


def kept_records(run_dir: Path) -> str:
    """``rank0.jsonl 812 records (to iteration 812), links.jsonl 40 samples, ...``: the complete
    records in ``run_dir``."""
    parts = []
    ranks = sorted(run_dir.glob("rank*.jsonl"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    for p in ranks:
        recs = _complete(p)
        last = next((r.get("iter") for r in reversed(recs) if isinstance(r, dict)), None)
        parts.append(f"{p.name} {len(recs)} records" + (f" (to iteration {last})" if isinstance(last, int) else ""))
    for name, what in (("eval.jsonl", "evaluations"), ("links.jsonl", "link samples"),
                       ("traffic.jsonl", "cross-traffic reports")):
        if (run_dir / name).exists():
            parts.append(f"{name} {len(_complete(run_dir / name))} {what}")
    return ", ".join(parts) or "no records"


def _complete(path: Path) -> list:
    try:
        return read_jsonl(path)
    except (OSError, TestbedError):
        return []


def as_disk_failure(e: TestbedError, run_dir: Path | None) -> TestbedError:
    """``e`` as the run's error: a write that failed, or a rank that died while the run
    directory's file system was full, says so and lists what was kept; any other error as it is."""
    if run_dir is None:
        return e
    if isinstance(e, WriteFailed):
        return RankFailed(f"{e.message}. The run was stopped (all ranks stopped, links restored); kept in "
                          f"{run_dir}: {kept_records(run_dir)}", e.hint)
    if isinstance(e, RankFailed) and nearly_full(run_dir):
        first = e.message.split(";", 1)[0]
        return RankFailed(f"the file system of {run_dir} is full ({free_bytes(run_dir) or 0} bytes free): {first}, "
                          "most likely as it could not write its records there. The run was stopped (all ranks "
                          f"stopped, links restored); kept in {run_dir}: {kept_records(run_dir)}",
                          f"free space on it (`df -h {run_dir}`), or write elsewhere (--out)")
    return e
