"""One element of a Slurm sweep (:mod:`testbed.runs.sweeps.slurm`), on the node Slurm placed
it: ``testbed _sweep-element DIR`` from the array's batch script.

It reads the request, picks its point (SLURM_ARRAY_TASK_ID), gets its repeat's checkpoint
(pre-trained once for the sweep), brings up its own testbed (NAME-jJOB; with the job's nodes
as hosts when the topology places nodes on hosts), runs the point into the sweep's
directory, takes the testbed down, and writes its result (``slurm/results/I.json``: its
entry of sweep.json, with its job and node). Slurm's SIGTERM unwinds it as Ctrl-C unwinds a
run: the testbed goes, the result says ``interrupted``, and the next submission runs it again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import write_json
from testbed.common.hostbase import node_name
from testbed.engine.core import Testbed
from testbed.hosts import sources
from testbed.hosts.slurm import job as slurmjob
from testbed.model.fields import MAX_TESTBED_NAME
from testbed.model.topology import load_topology_dict
from testbed.runs.sweeps import request as sweepfile
from testbed.runs.interrupts import RunInterrupted, ignore_interrupts, install_signals
from testbed.runs.sweeps.slurm import job_id, open_sweep, task_id
from testbed.runs.sweeps.sweep import Checkpoints, plan, run_point


def element(d: Path, say: Callable[[str], None]) -> dict:
    """Run this element of the sweep in ``d``; its result (also written to its file)."""
    d = open_sweep(d.resolve())
    req, topology = sweepfile.read(d / "slurm" / "request.json")
    points, i = plan(req), task_id()
    if i >= len(points):
        raise TestbedError(f"element {i} of a sweep of {len(points)} runs", "the array was not submitted by testbed")
    p, job = points[i], job_id()
    say(f"element {i}: {p.scheme} at {p.bw}, repeat {p.repeat}, on {node_name()} (job {job})")
    started = time.time()
    entry = {**p.entry(None), "job": job, "node": node_name(), "started": started}
    restore = install_signals()  # Slurm's SIGTERM (scancel, the time limit) unwinds like Ctrl-C
    tb = None
    try:
        init = Checkpoints(req, say).get(p.repeat)
        entry["checkpoint"] = None if init is None else str(init)
        tb = _up(topology, job, req.exporter, say)
        entry.update(run_point(req, p, init, tb.name, d, None, say))
    except RunInterrupted as e:
        entry.update(status="interrupted", error=e.message)
        raise
    except TestbedError as e:
        entry.update(status="failed", error=e.message)
    finally:
        ignore_interrupts()
        try:
            if tb is not None:
                tb.down()
        finally:
            if "status" not in entry:
                entry.update(status="interrupted", error="ended before its run did")
            entry["ended"] = time.time()
            write_json(d / "slurm" / "results" / f"{i}.json", entry)
            restore()
    return entry


def _up(topology: dict, job: str, exporter: bool, say: Callable[[str], None]) -> Testbed:
    """The element's own testbed: NAME-jJOB (elements sharing a node each have one)."""
    data = {**topology, "name": element_name(str(topology.get("name", "sweep")), job)}
    slurm = sources.source("slurm")
    assert slurm is not None
    if slurmjob.host_names(data):
        data = slurm.assign_hosts(data)
    topo = load_topology_dict(data, source=f"the sweep's topology ({os.environ.get('SLURM_JOB_NODELIST', '')})")
    say(f"bringing up {topo.name} ({len(topo.workers)} workers)")
    tb = Testbed.up(topo, exporter="127.0.0.1:0" if exporter else None)
    slurm.after_up(tb.name, topo)  # as root: a step removes this node's part if the job is ended
    return tb


def element_name(name: str, job: str) -> str:
    """NAME-jJOB, NAME cut to fit the testbed names' limit."""
    suffix = f"-j{job}"
    return f"{name[:MAX_TESTBED_NAME - len(suffix)]}{suffix}"
