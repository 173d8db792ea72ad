"""`testbed sweep`: every scheme x bandwidth (x repeats) from one pre-trained checkpoint.

The checkpoint is made once per (model, width, depth, dataset, seed) by
``python -m workloads.pretrain`` and cached under ``OUT/checkpoints/``; every run starts
from it (``--init``), so schemes are compared from the same weights. All runs share one
testbed (brought up here unless ``--testbed`` names a running one) and land in
``OUT/sweep-<time>/``, with ``sweep.json`` listing them. A failed run is recorded and the
sweep goes on; the sweep then exits non-zero.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .files import write_json
from .errors import TestbedError
from .experiment import RunRequest, Status, check_out, obtain_testbed, run
from .units import Rate


@dataclass
class SweepRequest:
    schemes: list[str]
    bws: list[Rate]
    workload_args: list[str]
    repeats: int = 1
    topology: Path | None = None
    testbed: str | None = None
    out: Path = Path("runs")
    timeout: float = 300.0
    init: Path | None = None
    pretrain_args: list[str] | None = None
    """Arguments for workloads.pretrain (model, width, depth, dataset, data dir, seed, epochs)."""
    cache_key: str = ""
    exporter: bool = True


def checkpoint(req: SweepRequest, say: Callable[[str], None]) -> Path:
    path = req.out / "checkpoints" / f"{req.cache_key}.pt"
    if path.exists():
        say(f"using cached checkpoint {path}")
        return path
    say(f"pre-training -> {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(procs.python_argv("workloads.pretrain", *(req.pretrain_args or []), "--out", str(path)),
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise TestbedError(f"pre-training failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}")
    say(p.stdout.strip())
    return path


def sweep(req: SweepRequest, on_status: Callable[[Status], None] | None = None,
          on_message: Callable[[str], None] | None = None) -> dict:
    say = on_message or (lambda m: None)
    init = req.init or checkpoint(req, say)
    check_out(req.out)
    sweep_dir = req.out / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while sweep_dir.exists():
        n += 1
        sweep_dir = req.out / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    sweep_dir.mkdir(parents=True)
    tb, created = None, False
    index = {"checkpoint": str(init), "schemes": req.schemes, "bws": [str(b) for b in req.bws],
             "repeats": req.repeats, "runs": []}
    try:
        tb, created = obtain_testbed(req.testbed, req.topology, say, req.exporter)
        total = len(req.bws) * len(req.schemes) * req.repeats
        k = 0
        for bw in req.bws:
            for scheme in req.schemes:
                for rep in range(req.repeats):
                    k += 1
                    run_id = f"{scheme}-{bw}-r{rep}"
                    say(f"[{k}/{total}] {scheme} at {bw}, repeat {rep + 1}/{req.repeats}")
                    entry = {"run_id": run_id, "scheme": scheme, "bw": str(bw), "repeat": rep}
                    try:
                        run(RunRequest(scheme=scheme, workload_args=[*req.workload_args, "--init", str(init)],
                                       testbed=tb.name, bw=bw, out=sweep_dir, timeout=req.timeout, run_id=run_id,
                                       extra={"repeat": rep, "sweep": sweep_dir.name},
                                       exporter=req.exporter),
                            on_status=on_status, on_message=say)
                        entry["status"] = "ok"
                    except TestbedError as e:
                        entry.update(status="failed", error=e.message)
                        say(f"run {run_id} failed: {e.message.splitlines()[0]}")
                    index["runs"].append(entry)
                    write_json(sweep_dir / "sweep.json", index)
    finally:
        if created and tb is not None:
            tb.down()
    index["dir"] = str(sweep_dir)
    return index
