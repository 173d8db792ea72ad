"""What a run of the user's own code (``testbed run --script`` / ``-m``) leaves for reports
and Prometheus: its config.json at the start, and at the end, from the records its ranks
appended to ``$TESTBED_RECORDS`` (``workloads.records.CONTRACT_FIELDS``), a summary.json
and an eval.jsonl.

The records come from code testbed does not control: every field is taken only when it has
the contract's type (a finite number; ``iter`` an integer), anything else is ignored, and a
file with no usable record is a run without records (the summary says so). A line that is no
JSON object (nested past the parser's depth, a list, torn) is skipped, and the summary's
``records_skipped`` says which file and how many lines, as the run's warning does.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from testbed.common.files import InputError, atomic_write, read_bounded, write_json
from testbed.runs.request import RunRequest, UserCode

NUMERIC = ("time", "loss", "accuracy", "payload_bytes", "iter_s")


def _code(req: RunRequest) -> UserCode:
    """The user's code ``req`` runs (this module serves such runs only)."""
    if req.code is None:
        raise ValueError(f"{req.scheme}: not a run of the user's own code (--script / -m)")
    return req.code


def write_config(run_dir: Path, req: RunRequest, world: int) -> None:
    """config.json as the built-in trainer writes it: what the exporter discovers a run by."""
    write_json(run_dir / "config.json", {"args": {"scheme": req.scheme, "variant": req.scheme, "model": "",
                                                  "dataset": ""},
                                         "world_size": world, "code": _code(req).to_dict(), "time": time.time()})


def clean(rec) -> dict | None:
    """A record reduced to the contract's fields with the contract's types (None: not a record)."""
    if not isinstance(rec, dict):
        return None
    out: dict[str, int | float] = {}
    it = rec.get("iter")
    if isinstance(it, int) and not isinstance(it, bool) and it >= 0:
        out["iter"] = it
    for k in NUMERIC:
        v = rec.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and sane_number(v):
            out[k] = float(v)
    return out


MAX_MAGNITUDE = 1e18
"""A record's numbers are at most this large (a byte count of an exabyte, a Unix time):
1e308 overflowed the means, and a 400-digit integer could not become a float."""


def sane_number(v: int | float, limit: float = MAX_MAGNITUDE) -> bool:
    """``v`` is finite and at most ``limit`` in size (an int past float's range is not)."""
    try:
        return math.isfinite(v) and abs(v) <= limit
    except OverflowError:
        return False


def read_records(path: Path) -> tuple[list[dict], Counter[str]]:
    """The JSON objects of a records file (bounded, as ``read_jsonl``), and how many of its
    lines were skipped, by why: nested past the parser's depth, JSON but no object, or not
    JSON (a line cut short by a crash: reading stops there, what follows is skipped too)."""
    try:
        data = read_bounded(Path(path), "records", "records file")
    except FileNotFoundError:
        return [], Counter()
    out: list[dict] = []
    skipped: Counter[str] = Counter()
    lines = [line for line in data.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except RecursionError:
            skipped[NESTED] += 1
            continue
        except ValueError:
            skipped[TORN] += len(lines) - i
            break
        if isinstance(rec, dict):
            out.append(rec)
        else:
            skipped[NOT_OBJECT] += 1
    return out, skipped


NESTED, NOT_OBJECT, TORN = "nested too deeply", "not a JSON object", "not JSON (reading stopped there)"


def rank_records(run_dir: Path, rank: int, skipped: list[dict] | None = None) -> list[dict]:
    """Rank ``rank``'s records, reduced to the contract (:func:`clean`); lines skipped are
    added to ``skipped`` as ``{"file", "lines", "why"}``."""
    path = run_dir / f"rank{rank}.jsonl"
    try:
        recs, why = read_records(path)
    except InputError as e:  # larger than records may be, or no regular file: none of it is read
        if skipped is None:
            raise
        skipped.append({"file": str(path), "lines": None, "why": e.message})
        return []
    if skipped is not None:
        skipped.extend({"file": str(path), "lines": n, "why": w} for w, n in why.items())
    return [r for r in map(clean, recs) if r is not None]


def skipped_warning(s: dict) -> str:
    if s["lines"] is None:
        return f"warning: skipped {s['file']} ({s['why']}); the summary is made of the other ranks' records"
    return (f"warning: {s['file']}: {s['lines']} record line{'s' * (s['lines'] != 1)} skipped ({s['why']}); "
            f"the summary is made of the rest")


def summary_from_records(run_dir: Path, req: RunRequest, world: int, t_start: float, duration: float,
                         warn: Callable[[str], None] | None = None) -> dict:
    """summary.json's workload part (the keys a built-in run's rank 0 writes), from the records;
    eval.jsonl written from rank 0's records that carry an accuracy. Lines that are no record
    (nested too deeply, no object, torn) are skipped: ``records_skipped`` lists them, and
    ``warn`` is told one line per file and reason."""
    skipped: list[dict] = []
    per_rank = [rank_records(run_dir, r, skipped) for r in range(world)]
    if warn:
        for s in skipped:
            warn(skipped_warning(s))
    r0 = per_rank[0] if per_rank else []
    iterations = max((r.get("iter", i + 1) for i, r in enumerate(r0)), default=0)
    if r0 and "time" in r0[0]:  # training starts with the first step, not with the ranks' Python
        t_start = r0[0]["time"] - r0[0].get("iter_s", 0.0)
    evals = [{"iter": r.get("iter", i + 1), "time": r["time"], "train_s": r["time"] - t_start,
              "accuracy": r["accuracy"]}
             for i, r in enumerate(r0) if "accuracy" in r and "time" in r]
    _write_jsonl(run_dir / "eval.jsonl", evals)
    steps = [r["iter_s"] for r in r0 if "iter_s" in r] or _gaps([r["time"] for r in r0 if "time" in r])
    payloads = [r["payload_bytes"] for recs in per_rank for r in recs if "payload_bytes" in r]
    last = [recs[-1]["payload_bytes"] for recs in per_rank if recs and "payload_bytes" in recs[-1]]
    accuracy = next((r["accuracy"] for r in reversed(r0) if "accuracy" in r), None)
    return {
        "scheme": req.scheme, "variant": req.scheme, "code": _code(req).to_dict(),
        "workload_args": req.args, "hyper": {"args": " ".join(req.workload_args)},  # the grid point: params
        "model": None, "dataset": None, "world_size": world,
        "backend": None, "iterations": iterations, "epochs": None, "wall_s": duration,
        "train_s": max((r["time"] for r in r0 if "time" in r), default=t_start + duration) - t_start,
        "final_accuracy": accuracy, "target_accuracy": None, "time_to_target_s": None,
        "final_loss": next((r["loss"] for r in reversed(r0) if "loss" in r), None),
        "mean_iter_s": statistics.fmean(steps) if steps else (duration / iterations if iterations else None),
        "median_iter_s": statistics.median(steps) if steps else None,
        "mean_payload_bytes": statistics.fmean(payloads) if payloads else None,
        "final_payload_bytes": statistics.fmean(last) if last else None,
        "records": {"ranks_with_records": sum(1 for recs in per_rank if recs),
                    "records_rank0": len(r0), "evaluations": len(evals)},
        "records_skipped": skipped,
    }


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:]) if b >= a]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))
