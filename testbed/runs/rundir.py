"""A run's directory, runs/<run_id>/, as it is before the ranks start.

    run.json        the request, the bottleneck shapes in force, each rank's worker (node,
                    address, interface, GPU, switch), the versions
    topology.json   the testbed's topology

The ranks add their records (rank<r>.jsonl, eval.jsonl, config.json, summary.json), the run
its samples (links.jsonl, trace.jsonl, traffic.jsonl) and the final summary.json.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from testbed.common.files import write_json
from testbed.common.version import __version__
from testbed.model.topology import DIRECTIONS
from testbed.engine.core import Testbed
from testbed.model.topology import Link
from testbed.runs.launch import Seat, placement
from testbed.runs.request import RunRequest


PACKAGE = Path(__file__).resolve().parents[1]
"""This package's folder, testbed/."""
COMMIT = re.compile(r"[0-9a-f]{7,40}")


def code_version(package: Path = PACKAGE) -> str:
    """The commit of the code running (7 hex digits), or "unknown": an installed package's
    COMMIT file (written by the build, setup.py), else the git checkout whose top holds
    this package (an editable install), never an enclosing repository's (a venv inside
    some other checkout would name that one's HEAD): git is not let search above it."""
    try:
        with open(package / "COMMIT", "rb") as f:
            written = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        written = ""
    if written:
        return written[:7] if COMMIT.fullmatch(written) else "unknown"
    top = package.parent
    if not (top / ".git").exists():
        return "unknown"
    try:
        r = subprocess.run(["git", "-C", str(top), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                           timeout=5, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(top.parent)})
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    found = r.stdout.strip()
    return found if r.returncode == 0 and COMMIT.fullmatch(found) else "unknown"


def bottleneck_shapes(bottlenecks: list[Link]) -> dict:
    """link name -> direction -> the shape in force (as in the topology file)."""
    return {l.name: {d: l.shape(d).to_dict() for d in DIRECTIONS} for l in bottlenecks}


def request_record(req: RunRequest, tb: Testbed, created: bool, flows: list, trace) -> dict:
    """The request as run.json and summary.json keep it (with the sweep's ``extra``); the
    built-in trainer's arguments as its spec renders them (paths absolute, the grid point in)."""
    spec = req.workload
    request = {"scheme": req.scheme, "workload_args": spec.args() if spec is not None else req.workload_args,
               "bw": str(req.bw) if req.bw else None,
               "testbed": tb.name, "created_testbed": created, "timeout_s": req.timeout, **req.extra}
    if req.params:
        request["params"] = req.params
    if req.code is not None:
        request["code"] = req.code.to_dict()
    if flows:
        request["cross_traffic"] = [f.to_dict() for f in flows]
    if trace is not None:
        request["bw_trace"] = {"file": str(req.bw_trace), "format": req.trace_format, "window_s": req.trace_window,
                               "loop": trace.loop, "steps": len(trace.steps), "period_s": trace.period_s}
    return request


def write_run_files(run_dir: Path, run_id: str, request: dict, shapes: dict, tb: Testbed) -> list[Seat]:
    """run.json and topology.json; returns the ranks' seats (:func:`testbed.runs.launch.placement`)."""
    seats = placement(tb.topology)
    write_json(run_dir / "run.json", {
        "run_id": run_id, "request": request, "bottlenecks": shapes,
        "workers": [{"rank": w.rank, "node": w.name, "address": w.address, "iface": w.iface, "gpu": w.gpu,
                     "switch": seat.switch} for w, seat in zip(tb.workers, seats)],
        "testbed_version": __version__, "code_version": code_version()})
    write_json(run_dir / "topology.json", tb.topology.to_dict())
    return seats
