"""`testbed report DIR...`: compare runs by time-to-accuracy, as the PacTrain paper does.

Reads run directories (or directories holding them, such as a sweep's), groups runs by
bottleneck bandwidth and scheme variant (the scheme with every hyper-parameter in the
summary's ``hyper``; repeats give the median and min-max), and writes:

    report.json, report.csv   one row per (bandwidth, variant); only proven runs ("ok") are
                              ranked, "unproven" ones too with include_unproven
    proof.csv                 per run, link and direction: the proof's bound and measured bytes
    tta.png                   time-to-accuracy normalised to allreduce, per bandwidth (Fig. 3 style),
                              median with min-max over repeats
    accuracy.png              accuracy vs wall-clock training time per run (Fig. 5 style)
    prune_ratio.png           final accuracy vs pruning ratio (Fig. 6 style), when runs span ratios
    bytes.png                 payload and bottleneck bytes per iteration per variant
    utilisation.png           bottleneck utilisation over time per run

Runs that never reached the target are shown as "not reached", never dropped.

The work is split by job: reading runs (testbed.runs.reports.rundata), the table
(testbed.runs.reports.tables), the figures (testbed.runs.reports.plots); ``RunData``, ``find_runs`` and
``table`` are re-exported here for callers.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from testbed.common.outdir import OutDir
from testbed.runs.reports.plots import plots
from testbed.runs.reports.rundata import RunData, find_runs
from testbed.runs.reports.tables import freeze, table

__all__ = ["RunData", "find_runs", "table", "write"]


def write(runs: list[RunData], out: Path, target: float | None = None, include_unproven: bool = False,
          baseline: str = "allreduce") -> dict:
    """Tables and figures into ``out``, a directory of the user's own (made private when new;
    refused when another user owns it or can write it: see testbed.common.outdir)."""
    rows = table(runs, target, include_unproven, baseline)
    with OutDir(out) as d:
        d.write_text("report.json", json.dumps({"rows": rows, "runs": [str(r.path) for r in runs]}, indent=2,
                                               default=str) + "\n")
        with d.create_text("report.csv", "report.json is written; the run records are untouched") as f:
            w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "failed"] + ["failed"])
            w.writeheader()
            for row in rows:
                w.writerow({**row, "failed": "; ".join(row["failed"]), "hyper": freeze(row["hyper"]),
                            "paths": "; ".join(row["paths"])})
        _proof_csv(runs, d)
        files = plots(runs, rows, d, target)
    return {"rows": rows, "out": str(d.path), "files": ["report.json", "report.csv", "proof.csv", *files]}


PROOF_FIELDS = ("run_id", "status", "proof", "link", "direction", "bound_bytes", "shared_bound_bytes",
                "measured_bytes")


def _proof_csv(runs: list[RunData], d: OutDir) -> None:
    """Every run's proof, a row per link and direction (summary.json's proof_links)."""
    with d.create_text("proof.csv", "report.json and report.csv are written; the run records are untouched") as f:
        w = csv.DictWriter(f, fieldnames=PROOF_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in runs:
            links = r.summary.get("proof_links")
            for name, row in (links.items() if isinstance(links, dict) else ()):
                link, _, direction = str(name).rpartition(" ")
                if isinstance(row, dict):
                    w.writerow({**{k: row.get(k) for k in PROOF_FIELDS if isinstance(row.get(k), int)},
                                "run_id": r.path.name, "status": r.status, "proof": r.summary.get("proof"),
                                "link": link, "direction": direction})
