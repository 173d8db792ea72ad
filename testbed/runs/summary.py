"""A run's summary.json, and the proof that its collectives crossed the shaped links.

    summarise        the workload's summary plus the request, bottleneck bytes and utilisation
                     (from the tc counters at start and end), wire bytes per rank, versions
    verify_crossed   the bottlenecks carried at least MIN_WIRE_FRACTION of what one rank
                     handed to collectives, else the run is marked "bypassed" and refused
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

MIN_WIRE_FRACTION = 0.25
"""The bottlenecks must carry at least this fraction of the bytes one rank handed to
collectives. An all-reduce or all-gather across a cut moves at least a full vector per
direction, so a real run is far above it (2x to 7x on the shipped topologies)."""


class TrafficBypassed(TestbedError):
    pass


def summarise(run_dir: Path, run_id: str, request: dict, links: list[Link], start: dict, end: dict,
              duration: float, shapes: dict) -> dict:
    try:
        summary = read_json(run_dir / "summary.json", "json", "summary")
    except FileNotFoundError:
        raise TestbedError(f"the ranks exited 0 but wrote no summary.json in {run_dir}") from None
    iters = summary.get("iterations") or 0
    rates = sorted({s["rate"] for dirs in shapes.values() for s in dirs.values()})
    summary.update({
        "run_id": run_id, "run_dir": str(run_dir), "status": "ok", "request": request,
        "bw": request["bw"] or (rates[0] if len(rates) == 1 else ",".join(rates)),
        "topology": request["testbed"], "params": request.get("params", {}), "bottleneck_shapes": shapes,
        "bottleneck": _bottleneck(links, start, end, duration, iters),
        "run_s": duration, "testbed_version": __version__, "code_version": code_version(),
    })
    summary["mean_wire_tx_bytes_per_iteration"] = _mean_wire_tx(run_dir, summary.get("world_size", 0))
    return summary


def _bottleneck(links: list[Link], start: dict, end: dict, duration: float, iters: int) -> dict:
    """Bytes, drops and utilisation per bottleneck direction between two counter readings."""
    per = {}
    total = 0
    util = []
    for l in links:
        for d in DIRECTIONS:
            b = end.get((l.index, d), {}).get("bytes", 0) - start.get((l.index, d), {}).get("bytes", 0)
            rate = l.shape(d).rate.bps
            per[f"{l.name} {d}"] = {"bytes": b, "rate_bps": rate,
                                    "drops": end.get((l.index, d), {}).get("drops", 0)
                                    - start.get((l.index, d), {}).get("drops", 0),
                                    "utilisation": b * 8 / duration / rate if duration > 0 else None}
            total += b
            util.append(per[f"{l.name} {d}"]["utilisation"] or 0)
    return {"bytes": total, "bytes_per_iteration": total / iters if iters else None,
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


def verify_crossed(summary: dict, run_dir: Path, expect_bytes: int | None = None, say=lambda m: None) -> None:
    """The tc-counter proof: the bottlenecks carried the collectives (and, given what each
    rank should send, each rank's own link carried its share). A run whose traffic went
    around them is marked "bypassed" in summary.json and refused; a run with nothing to
    compare with (the user's code, no payload_bytes in its records, no --expect-bytes) is
    marked as not proven."""
    per_rank = expect_bytes if expect_bytes is not None else \
        (summary.get("mean_payload_bytes") or 0) * (summary.get("iterations") or 0)
    if not per_rank:
        if summary.get("code"):
            summary["proof"] = "skipped: no payload_bytes in the records and no --expect-bytes"
            write_json(run_dir / "summary.json", summary)
            say("note: the tc-counter proof was skipped: the records carry no payload_bytes and --expect-bytes "
                "was not given")
        return
    wire = summary["bottleneck"]["bytes"]
    short = [(r, b) for r, b in (summary.get("rank_tx_bytes") or {}).items() if b < MIN_WIRE_FRACTION * per_rank]
    if wire >= MIN_WIRE_FRACTION * per_rank and not (summary.get("code") and short):
        summary["proof"] = "passed"
        write_json(run_dir / "summary.json", summary)
        return
    summary["status"] = "bypassed"
    summary["proof"] = "failed"
    write_json(run_dir / "summary.json", summary)
    if not (summary.get("code") and short):
        raise TrafficBypassed(
            f"the collective traffic did not cross the bottleneck links: they carried {wire} bytes while "
            f"each rank handed {per_rank:.0f} bytes to collectives", "the summary in "
            f"{run_dir} says which links were counted; are the ranks on both sides of a bottleneck?")
    rank, sent = short[0]
    node = next((w["node"] for w in _workers(run_dir) if str(w.get("rank")) == rank), "?")
    raise TrafficBypassed(
        f"rank {rank} (node {node}) put {sent} bytes on its link, under {MIN_WIRE_FRACTION:.0%} of the "
        f"{per_rank:.0f} bytes it should hand to collectives", "did it join the process group, and are its "
        "collectives pinned to the data plane (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, set by testbed)?")


def _workers(run_dir: Path) -> list[dict]:
    try:
        return read_json(run_dir / "run.json", "json", "run file").get("workers") or []
    except (OSError, ValueError, AttributeError, TestbedError):
        return []


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
