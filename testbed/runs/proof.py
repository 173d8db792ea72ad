"""The proof that a run's collectives crossed the shaped links, and its verdict.

Every rank counts what it handed to torch.distributed (``collectives{R}.json``, written by
workloads.collectives); testbed.runs.bounds turns the counts into the bytes each link must
have carried in each direction; the links' tc counters, read before the first rank started
and after the last one exited (nothing in flight at either reading), say what they carried.

    passed     every link carried at least its bound in each direction (within TOLERANCE)
    bypassed   a link carried less: the collectives went around it (named with its direction,
               bound, measured bytes and the ranks on each side)
    unproven   nothing to compare with: the training issued no collective across the network,
               a rank left no counts, or the recorder was off; or (the built-in trainer) an
               iteration's gradients did not all reach collectives carrying what the scheme
               must send for them (testbed.runs.volume names the rank, iteration and shortfall)

Only a run that passed is ``ok``. The counters are L2 bytes (headers included), so any
honest run measures more than the payload bound; TOLERANCE covers counters of links on
other hosts, read a few milliseconds apart, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import read_json
from testbed.model.shapes import DIRECTIONS
from testbed.runs import volume
from testbed.runs.bounds import Bound, Cut, Totals, bound, cuts, unbounded

TOLERANCE = 0.01
"""A link passes when it measured at least (1 - TOLERANCE) of its bound in a direction."""
MAX_GROUPS = 4096
MAX_ENTRIES = 100_000


class TrafficBypassed(TestbedError):
    pass


class TrafficUnproven(TestbedError):
    pass


@dataclass
class Counts:
    """The ranks' counts, merged, and what the proof must know about them."""

    totals: Totals
    train_calls: int
    """Calls during training, in groups of two or more ranks, that carry data."""
    by_kind: dict
    uncounted: int
    missing: list[int]
    """Ranks whose file is missing, damaged or written without the recorder."""
    volumes: dict = field(default_factory=dict)
    """rank -> its gradient volume's digest (testbed.runs.volume.parse; None: its file has none)."""


def read_counts(run_dir: Path, world: int) -> Counts:
    totals = Totals()
    by_kind: dict[str, dict[str, dict[str, int]]] = {"train": {}, "other": {}}  # phase -> kind -> calls, bytes
    train_calls = uncounted = 0
    missing, volumes = [], {}
    for r in range(world):
        try:
            # "records": 64 MiB, for the built-in trainer's per-iteration volume (about 30 bytes an iteration)
            doc = read_json(run_dir / f"collectives{r}.json", "records", "collectives file")
            groups, ops, sends, lost = _parse(doc)
            volumes[r] = volume.parse(doc, r)  # its digest: the lists go with the document
            del doc
        except (OSError, ValueError, TypeError, KeyError, RecursionError, TestbedError):
            missing.append(r)
            continue
        uncounted += lost
        for name, members in groups.items():
            if totals.groups.setdefault(name, members) != members:
                raise TrafficUnproven(f"the ranks disagree about the members of process group {name}",
                                      f"see {run_dir}/collectives*.json")
        for phase, group, kind, count, inb, outb in ops:
            c = totals.ops.setdefault((group, kind), {}).setdefault(r, [0, 0, 0])
            c[0], c[1], c[2] = c[0] + count, c[1] + inb, c[2] + outb
            k = by_kind[phase].setdefault(kind, {"calls": 0, "bytes": 0})
            k["calls"], k["bytes"] = k["calls"] + count, k["bytes"] + inb
        for phase, dst, count, b in sends:
            totals.sends[(r, dst)] = totals.sends.get((r, dst), 0) + b
            k = by_kind[phase].setdefault("send", {"calls": 0, "bytes": 0})
            k["calls"], k["bytes"] = k["calls"] + count, k["bytes"] + b
            train_calls += count if phase == "train" and dst != r else 0
        train_calls += sum(o[3] for o in ops if o[0] == "train" and o[2] not in ("barrier",)
                           and len(groups.get(o[1], totals.groups.get(o[1], ()))) > 1)
    return Counts(totals, train_calls, by_kind, uncounted, missing, volumes)


def _parse(doc) -> tuple[dict, list, list, int]:
    """One rank's file, checked field by field (it is written inside code testbed does not
    control): ValueError or TypeError when anything is not as workloads.collectives writes it."""
    if not isinstance(doc, dict) or _int(doc.get("recorder_entries")) <= 0:
        raise ValueError("no recorder")
    groups = {str(k): tuple(sorted({_int(r) for r in v})) for k, v in _items(doc.get("groups"), MAX_GROUPS)}
    ops = [(_phase(o["phase"]), str(o["group"]), str(o["kind"]), _int(o["count"]), _int(o["in_bytes"]),
            _int(o["out_bytes"])) for o in _list(doc.get("ops"))]
    sends = [(_phase(s["phase"]), _int(s["dst"]), _int(s["count"]), _int(s["bytes"])) for s in _list(doc.get("sends"))]
    return groups, ops, sends, _int(doc.get("uncounted", 0))


def _int(v) -> int:
    if type(v) is not int or not 0 <= v < 10**18:
        raise ValueError(f"not a count: {v!r:.40}")
    return v


def _phase(v) -> str:
    if v not in ("train", "other"):
        raise ValueError(f"not a phase: {v!r:.40}")
    return v


def _items(v, limit: int):
    if not isinstance(v, dict) or len(v) > limit:
        raise ValueError("groups")
    return [(k, v2) for k, v2 in v.items() if isinstance(v2, list) and len(v2) <= MAX_ENTRIES]


def _list(v) -> list:
    if not isinstance(v, list) or len(v) > MAX_ENTRIES or not all(isinstance(x, dict) for x in v):
        raise ValueError("list")
    return v


def judge(counts: Counts, run_cuts: list[Cut], measured: dict[tuple[int, str], int | None],
          bottlenecks: dict[int, str] | None = None, workload: str = "code") -> dict:
    """The verdict and, per cut link and direction, bound and measured bytes. ``bottlenecks``
    (index -> name): the links the run shapes; a run none of whose collectives had to cross
    any of them proves nothing about them. ``workload``: what the ranks ran
    (testbed.runs.volume.WORKLOADS: the built-in trainer's ranks must each show their
    gradients' volume, which is checked wherever the files hold one)."""
    links, short, crossing = {}, [], set()
    for cut in run_cuts:
        b = bound(cut, counts.totals)
        rows = _rows(cut, b, measured)
        links.update(rows)
        short += _short(cut, b, rows)
        if b.forward or b.reverse or b.shared:
            crossing.add(cut.index)
    grads = volume.judge(counts.volumes, workload) if not counts.missing else None
    proof = {"verdict": "passed", "reason": "", "tolerance": TOLERANCE, "links": links,
             "collectives": counts.by_kind, "uncounted": counts.uncounted,
             "unbounded": unbounded(counts.totals), "gradients": grads}
    if counts.missing:
        ranks = ", ".join(map(str, counts.missing[:8]))
        proof.update(verdict="unproven", reason=f"rank(s) {ranks} left no collective counts (collectives*.json "
                                                "missing or damaged, or torch's flight recorder was off)")
    elif counts.train_calls == 0:
        proof.update(verdict="unproven", reason="the training issued no collective between ranks: nothing it did "
                                                "had to cross a link")
    elif grads and grads["reason"]:
        proof.update(verdict="unproven", reason=f"the gradients did not all reach the collectives: {grads['reason']}")
    elif bottlenecks and not crossing & set(bottlenecks):
        names = ", ".join(sorted(bottlenecks.values()))
        proof.update(verdict="unproven", reason=f"no collective had to cross the bottleneck link(s) {names}: "
                                                "no rank of a collective is behind them")
    elif short:
        proof.update(verdict="bypassed", reason=short[0])
    return proof


def _rows(cut: Cut, b: Bound, measured: dict) -> dict:
    rows = {}
    for d, need, src, dst in (("forward", b.forward, cut.a, cut.b), ("reverse", b.reverse, cut.b, cut.a)):
        rows[f"{cut.name} {d}"] = {"bound_bytes": need, "shared_bound_bytes": b.shared,
                                   "measured_bytes": measured.get((cut.index, d)),
                                   "from_ranks": sorted(src), "to_ranks": sorted(dst)}
    return rows


def _short(cut: Cut, b: Bound, rows: dict) -> list[str]:
    """Why ``cut`` fails its bound (empty when it does not)."""
    fwd, rev = (rows[f"{cut.name} {d}"]["measured_bytes"] for d in DIRECTIONS)
    out = []
    for d, need, got, src, dst in (("forward", b.forward, fwd, cut.a, cut.b),
                                   ("reverse", b.reverse, rev, cut.b, cut.a)):
        if need and (got is None or got < need * (1 - TOLERANCE)):
            out.append(f"link {cut.name} {d} carried {_n(got)} bytes, under the {need:,} bytes the run's collectives "
                       f"must move from ranks {_ranks(src)} to ranks {_ranks(dst)}")
    total_need = b.forward + b.reverse + b.shared
    if b.shared and not out and (fwd or 0) + (rev or 0) < total_need * (1 - TOLERANCE):
        out.append(f"link {cut.name} carried {_n((fwd or 0) + (rev or 0))} bytes both ways, under the {total_need:,} "
                   f"bytes the run's collectives must move across it (ranks {_ranks(cut.a)} | {_ranks(cut.b)})")
    return out


def _n(v) -> str:
    return "no counted" if v is None else f"{v:,}"


def _ranks(rs) -> str:
    rs = sorted(rs)
    return ",".join(map(str, rs)) if len(rs) <= 8 else f"{rs[0]}..{rs[-1]} ({len(rs)})"


def prove(run_dir: Path, topology, workers: dict[str, int], start: dict, end: dict, workload: str = "code") -> dict:
    """The proof of a finished run: its ranks' counts against the counters of every link
    (and, where they recorded one, their gradients' volume; ``workload``: what the ranks
    ran, testbed.runs.volume.WORKLOADS: the built-in trainer's must have)."""
    measured = {}
    for l in topology.links:
        for d in DIRECTIONS:
            s, e = start.get((l.index, d)), end.get((l.index, d))
            measured[(l.index, d)] = e["bytes"] - s["bytes"] if s and e else None
    try:
        counts = read_counts(run_dir, len(workers))
    except TrafficUnproven as e:
        return {"verdict": "unproven", "reason": e.message, "tolerance": TOLERANCE, "links": {}}
    return judge(counts, cuts(workers, topology.links), measured,
                 {l.index: l.name for l in topology.links if l.bottleneck}, workload)


def apply(summary: dict, proof: dict) -> None:
    """The verdict into the summary: status ok only when the proof passed."""
    summary["proof"] = proof["verdict"]
    summary["proof_reason"] = proof["reason"]
    summary["proof_links"] = proof["links"]
    summary["collectives"] = {k: proof.get(k) for k in ("collectives", "uncounted", "unbounded", "tolerance")}
    summary["proof_gradients"] = proof.get("gradients")
    summary["status"] = {"passed": "ok", "bypassed": "bypassed", "unproven": "unproven"}[proof["verdict"]]


def refuse(summary: dict, run_dir: Path) -> None:
    """A run that is not proven ends in one error naming why (its summary keeps the detail)."""
    if summary["proof"] == "bypassed":
        raise TrafficBypassed(f"the collectives did not cross the shaped links: {summary['proof_reason']}",
                              "did every rank's collectives use its own link (GLOO_SOCKET_IFNAME / "
                              f"NCCL_SOCKET_IFNAME, set by testbed)? per link: proof_links in {run_dir}/summary.json")
    if summary["proof"] == "unproven":
        raise TrafficUnproven(f"the run is unproven: {summary['proof_reason']}",
                              f"a run is ok only when its collectives crossed the links; see {run_dir}/summary.json")
