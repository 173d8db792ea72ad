"""A run's summary.json (the proof that its collectives crossed the links: testbed.runs.proof).

    summarise        the workload's summary plus the request, bottleneck bytes and utilisation
                     (from the tc counters), wire bytes per rank, versions
    mark             a run that failed or was interrupted: its status and error
"""

from __future__ import annotations

from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import read_json, read_jsonl, write_json
from testbed.common.version import __version__
from testbed.model.topology import DIRECTIONS
from testbed.model.topology import Link
from testbed.runs.rundir import code_version
from testbed.runs.userrecords import sane_number

def summarise(run_dir: Path, run_id: str, request: dict, links: list[Link], start: dict, end: dict,
              duration: float, shapes: dict, train_start: tuple[dict, float] | None = None,
              workload: dict | None = None, dilation: float = 1.0) -> dict:
    """``train_start``: the bottleneck counters when the first iteration began, and how long
    before the end that was: bytes and utilisation are measured from then (else from the launch).
    ``workload``: the workload's part (None: the summary.json rank 0 wrote). ``links`` are
    in force (K times slower in a run dilated K-fold) and ``duration`` is wall-clock: the
    summary gives emulated rates (x K) and seconds (/ K); ``shapes`` are the emulated ones."""
    if workload is not None:
        summary = dict(workload)
    else:
        try:
            summary = read_json(run_dir / "summary.json", "json", "summary")
        except FileNotFoundError:
            raise TestbedError(f"the ranks exited 0 but wrote no summary.json in {run_dir}") from None
    iters = summary.get("iterations") or 0
    duration /= dilation
    if train_start is not None:
        train_start = (train_start[0], train_start[1] / dilation)
    rates = sorted({s["rate"] for dirs in shapes.values() for s in dirs.values()})
    summary.update({
        "run_id": run_id, "run_dir": str(run_dir), "status": "ok", "request": request,
        "bw": request["bw"] or (rates[0] if len(rates) == 1 else ",".join(rates)),
        "topology": request["testbed"], "params": request.get("params", {}), "bottleneck_shapes": shapes,
        "bottleneck": _bottleneck(links, *(train_start or (start, duration)), end, iters, dilation),
        "run_s": duration, "testbed_version": __version__, "code_version": code_version(),
        "dilation": dilation, "dilation_validated": _validated(summary, dilation),
    })
    summary["bottleneck"]["measured_from"] = "training start" if train_start else "launch"
    summary["mean_wire_tx_bytes_per_iteration"] = _mean_wire_tx(run_dir, summary.get("world_size", 0))
    return summary


def _validated(workload: dict, dilation: float) -> bool | None:
    """A --gpu-time run (real compute held to K x T) is validated when no iteration of any rank
    overran its budget (the workload's ``overruns``), at any K; a --compute-time run only by
    ``--dilation auto`` (testbed.runs.dilation_auto); an undilated one needs nothing (None)."""
    if workload.get("gpu_time_s") is not None:
        return workload.get("overruns") == 0
    return None if dilation == 1 else False


def _bottleneck(links: list[Link], start: dict, duration: float, end: dict, iters: int, k: float = 1.0) -> dict:
    """Bytes, drops and utilisation per bottleneck direction between two counter readings."""
    per = {}
    total = 0
    util = []
    for l in links:
        for d in DIRECTIONS:
            b = end.get((l.index, d), {}).get("bytes", 0) - start.get((l.index, d), {}).get("bytes", 0)
            rate = l.shape(d).rate.bps * k  # the emulated rate
            per[f"{l.name} {d}"] = {"bytes": b, "rate_bps": rate,
                                    "drops": end.get((l.index, d), {}).get("drops", 0)
                                    - start.get((l.index, d), {}).get("drops", 0),
                                    "utilisation": b * 8 / duration / rate if duration > 0 else None}
            total += b
            util.append(per[f"{l.name} {d}"]["utilisation"] or 0)
    return {"bytes": total, "bytes_per_iteration": total / iters if iters else None, "seconds": duration,
            "links": per, "max_utilisation": max(util) if util else None,
            "mean_utilisation": sum(util) / len(util) if util else None}


def _mean_wire_tx(run_dir: Path, world: int) -> float | None:
    """What each rank's interface put on the wire per iteration, from the records (tx counters)."""
    wire = []
    for r in range(world):
        tx = [x["tx_bytes"] for x in read_jsonl(run_dir / f"rank{r}.jsonl")
              if isinstance(x.get("tx_bytes"), (int, float)) and not isinstance(x["tx_bytes"], bool)
              and sane_number(x["tx_bytes"])]
        if len(tx) >= 2:
            wire.append((tx[-1] - tx[0]) / (len(tx) - 1))
    return sum(wire) / len(wire) if wire else None


def access_links(tb) -> list[Link]:
    """Each worker's own link (to its switch), in rank order."""
    return [tb.topology.worker_link(w.name) for w in tb.workers]


def rank_tx_bytes(tb, start: dict, end: dict) -> dict[str, int]:
    """rank -> bytes its worker put on its own link between two counter readings."""
    out = {}
    for w, l in zip(tb.workers, access_links(tb)):
        d = DIRECTIONS[0] if l.a == w.name else DIRECTIONS[1]  # the worker's egress
        out[str(w.rank)] = end.get((l.index, d), {}).get("bytes", 0) - start.get((l.index, d), {}).get("bytes", 0)
    return out


def mark(run_dir: Path | None, status: str, error: str) -> None:
    if run_dir is None or not run_dir.exists():
        return
    path = run_dir / "summary.json"
    try:
        summary = read_json(path, "json", "summary") if path.exists() else {}
    except (ValueError, TestbedError):
        summary = {}
    if not isinstance(summary, dict):
        summary = {}
    try:
        run = read_json(run_dir / "run.json", "json", "run file")
    except (OSError, TestbedError):  # never written (a full disk): nothing to mark
        return
    summary.update(run_id=run["run_id"], status=status, error=error, request=run["request"],
                   bw=run["request"]["bw"], scheme=run["request"]["scheme"])
    write_json(path, summary)
