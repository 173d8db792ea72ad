"""docs/results/claims.md's PruneX, SparDL and learning-rate tables, from the records of
``benchmarks.claims`` (the statistics and the verdict rule: ``benchmarks.claims_tables``)."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.archive import runs_of
from benchmarks.claims_tables import (
    RATE_NAMES,
    _acc,
    _head,
    _iter,
    _points,
    _reached,
    _resolution,
    _row,
    _target,
    _tta,
    _uplink,
    _wire,
    cell,
    paired,
    pick,
    spread,
    sweeps,
    unjudged,
    no_loss,
    verdict,
)
from benchmarks import strong_scaling
from testbed.common.errors import TestbedError
from testbed.runs.reports.stats import K_SUSTAINED, MIN_PAIRS_95, sustained_tta

RHO = 0.1
"""PruneX's default ADMM penalty; the ablation sets it against rho = 0."""


def _less(c: dict) -> str:
    """A ratio of bytes as 'x % less [a, b]'."""
    if c["mid"] is None:
        return "no pairs"
    text = f"{1 - c['mid']:.0%} less"
    kind = "" if c["n"] >= MIN_PAIRS_95 else ", min-max"
    return text + (f" [{1 - c['hi']:.0%}, {1 - c['lo']:.0%}] ({c['n']} pairs{kind})" if c["lo"] is not None
                   else " (one run)")


def _prunex_runs(folder: Path):
    runs = sweeps(folder, "prunex")
    rho = {x: [r for r in runs if r.summary.get("scheme") == "prunex"
               and (r.summary.get("hyper") or {}).get("prunex_rho") == x] for x in (0.0, RHO)}
    return runs, pick(runs, "allreduce"), pick(runs, "hier-allreduce"), rho


def prunex_claims(folder: Path, section: str = "prunex") -> str:
    """PruneX's volume and accuracy claims, and what its ADMM penalty does (rho 0 against 0.1,
    where the records hold both)."""
    runs, dense, hier, rho = _prunex_runs(folder)
    target, prunex = _target(runs), rho[RHO]
    bw = RATE_NAMES.get(prunex[0].bw, prunex[0].bw)
    vol = paired(prunex, dense, _uplink)
    acc = _points(paired(prunex, dense, _acc, diff=True))
    tta = paired(prunex, dense, _tta(target))
    out = _head("paper's claim", "metric", f"ours: PruneX (rho {RHO:g}, 50 % of channels) at {bw}, paired", "verdict")
    out.append(_row("about **60 % less** inter-node volume than a flat dense all-reduce", "bytes on the uplinks",
                    f"{_less(vol)}; of it, the hierarchy alone (hier-allreduce): "
                    f"{_less(paired(hier, dense, _uplink))}; pruning on top of the hierarchy: "
                    f"{_less(paired(prunex, hier, _uplink))}", verdict(vol, (0.35, 0.45))))
    out.append(_row("up to **50 %** channel sparsity without accuracy loss", "final accuracy",
                    f"{cell(acc, '+.1f', unit=' points')} against all-reduce; the time to a sustained {target:g} "
                    f"took {cell(tta)} all-reduce's ({_reached(prunex, target)} runs reached it, all-reduce "
                    f"{_reached(dense, target)})", no_loss(acc)))
    if rho[0.0]:
        gain = _points(paired(prunex, rho[0.0], _acc, diff=True))
        shown = unjudged(gain) or ("reproduced" if gain["lo"] > 0 else "not reproduced")
        out.append(_row("H-SADMM (the ADMM penalty, rho > 0) prunes with less loss than pruning by norm alone "
                        "(rho = 0; implied by the method, our ablation)", "final accuracy",
                        f"rho {RHO:g} minus rho 0: {cell(gain, '+.1f', unit=' points')}", shown))
    out += ["", f"Command: `sudo python -m benchmarks.claims --sections {section}`."]
    return "\n".join(out) + "\n"


def prunex_table(folder: Path) -> str:
    """Every PruneX-section run group: bytes, accuracy, time to target, and what H-SADMM did."""
    runs, dense, hier, rho = _prunex_runs(folder)
    target = _target(runs)
    out = _head("scheme", "runs", "uplink MB per iteration", "over all-reduce (paired)", "final accuracy",
                f"sustained {target:g} reached", "sustained TTA s", "ADMM updates", "compaction events (channels)")
    groups = [("allreduce", dense), ("hier-allreduce", hier), *((f"prunex rho {x:g}", rs) for x, rs in rho.items())]
    for name, rs in groups:
        if not rs:
            continue
        s = [r.summary for r in rs]
        admm = spread([x.get("admm_updates") for x in s], ".0f")
        comp = spread([x.get("compaction_events") for x in s], ".0f")
        chans = spread([x.get("compacted_channels") for x in s], ".0f")
        out.append(_row(name, str(len(rs)), spread([(_uplink(r) or 0) / 1e6 for r in rs], ".2f"),
                        cell(paired(rs, dense, _uplink), ".3f") if name != "allreduce" else "",
                        spread([_acc(r) for r in rs]), _reached(rs, target),
                        spread([r.tta_sustained(target) for r in rs], ".1f"), admm,
                        f"{comp} ({chans})" if comp != "-" else "-"))
    first = rho[RHO][0].summary if rho[RHO] else {}
    model = {"cnn": "The CNN", "resnet18": "ResNet18 (batch norm)"}.get(str(first.get("model")), first.get("model"))
    out += ["", f"{model} on {first.get('world_size')} ranks behind two switches, "
                f"{first.get('iterations')} iterations "
                f"({first.get('epochs'):g} epochs); the masks are fixed at 30 % of the run, after the ADMM updates "
                f"counted here. Uplink bytes are the tc counters of the switches' uplinks over the whole run "
                f"(start-up and evaluation included). Accuracy: {_resolution(runs)}."]
    return "\n".join(out) + "\n"


def spardl_claims(folder: Path) -> str:
    """SparDL's speed claim against the sparse baseline we have (the top-k all-gather), like for like."""
    runs = sweeps(folder, "spardl")
    target, spardl = _target(runs), [r for r in runs if r.summary.get("scheme") == "spardl"]
    world = spardl[0].summary.get("world_size")
    like = pick(runs, f"topk {0.01 / world:g}")
    same = pick(runs, "topk 0.01")
    out = _head("paper's claim", "metric", f"ours: SparDL (density 0.01, d = "
                f"{spread([r.summary.get('spardl_teams_used') for r in spardl], '.0f')}) over top-k all-gather, "
                f"{world} ranks at {RATE_NAMES.get(spardl[0].bw, spardl[0].bw)}, paired", "verdict")
    c_like, c_same = paired(like, spardl, _tta(target)), paired(same, spardl, _tta(target))
    out.append(_row("up to **4.9x** faster than sparse all-reduce methods", f"TTA ({target:g})",
                    f"like for like (top-k {0.01 / world:g}: {world} x k entries = SparDL's k): {cell(c_like)}; "
                    f"top-k at SparDL's density (0.01, {world}x the entries): {cell(c_same)}",
                    verdict(c_like, 4.9, up_to=True) + " (like for like)"))
    acc = _points(paired(spardl, pick(runs, "allreduce"), _acc, diff=True))
    out.append(_row("accuracy kept (global residual collection loses no gradient mass)", "final accuracy",
                    f"{cell(acc, '+.1f', unit=' points')} against all-reduce", no_loss(acc)))
    out += ["", "Command: `sudo python -m benchmarks.claims --sections spardl`."]
    return "\n".join(out) + "\n"


def spardl_table(folder: Path) -> str:
    runs = sweeps(folder, "spardl")
    target = _target(runs)
    spardl = [r for r in runs if r.summary.get("scheme") == "spardl"]
    out = _head("scheme", "runs", "wire KB per rank per iteration", "SparDL's bytes over it (paired)",
                "iteration s", f"sustained {target:g} reached", "sustained TTA s", "final accuracy")
    labels = sorted({r.label for r in runs}, key=lambda x: (x != "allreduce", x))
    for label in labels:
        rs = pick(runs, label)
        mine = label.startswith("spardl")
        out.append(_row(label, str(len(rs)), spread([(_wire(r) or 0) / 1e3 for r in rs], ".1f"),
                        "" if mine else cell(paired(spardl, rs, _wire), ".3f"), spread([_iter(r) for r in rs]),
                        _reached(rs, target), spread([r.tta_sustained(target) for r in rs], ".1f"),
                        spread([_acc(r) for r in rs])))
    out += ["", "Wire bytes: the mean over ranks of each rank's interface tx bytes per iteration (tc counters), "
                f"median [min-max] over runs. Accuracy: {_resolution(runs)}."]
    return "\n".join(out) + "\n"


def spardl_ranks_table(folder: Path) -> str:
    """SparDL against the top-k all-gather at the same density (0.01) on 2, 4 and 8 ranks
    (``benchmarks.paper_sweep --sections spardl``): wire bytes and iteration time, paired by
    repeat at each rank count, and final accuracy, at the shaped rate (the 10 Gbit runs
    those sweeps also hold are left out)."""
    runs = [r for r in runs_of(folder) if r.status == "ok" and r.summary.get("scheme") in ("topk", "spardl")
            and r.bw != "10gbit"]
    if not runs:
        raise TestbedError(f"{folder}: no topk or spardl runs", "python -m benchmarks.paper_sweep --sections spardl")
    out = _head("ranks", "runs", "top-k wire KB per rank per iteration", "SparDL", "top-k / SparDL bytes (paired)",
                "top-k iteration s", "SparDL iteration s", "top-k / SparDL time (paired)", "top-k final accuracy",
                "SparDL final accuracy", "SparDL's d")
    reps = 0
    for n in sorted({r.summary.get("world_size") for r in runs}):
        t = [r for r in runs if r.summary.get("world_size") == n and r.summary["scheme"] == "topk"]
        d = [r for r in runs if r.summary.get("world_size") == n and r.summary["scheme"] == "spardl"]
        reps = max(reps, len(t), len(d))
        out.append(_row(str(n), f"{len(t)} + {len(d)}", spread([(_wire(r) or 0) / 1e3 for r in t], ".1f"),
                        spread([(_wire(r) or 0) / 1e3 for r in d], ".1f"), cell(paired(t, d, _wire)),
                        spread([_iter(r) for r in t]), spread([_iter(r) for r in d]), cell(paired(t, d, _iter)),
                        spread([_acc(r) for r in t]), spread([_acc(r) for r in d]),
                        spread([r.summary.get("spardl_teams_used") for r in d], ".0f")))
    out += ["", f"At {RATE_NAMES.get(runs[0].bw, runs[0].bw)}, the workers split over two edge switches. Wire bytes: "
                "the mean over ranks of each rank's interface tx bytes per iteration (tc counters), median "
                f"[min-max] over runs. Accuracy: {_resolution(runs)}. Command: `sudo python -m "
                f"benchmarks.paper_sweep --sections spardl --repeats {reps}`."]
    return "\n".join(out) + "\n"


def lr_table(folder: Path) -> str:
    """Each scheme at three learning rates, with the bottleneck out of the way: iterations to
    the sustained target and final accuracy (convergence, not time)."""
    runs = sweeps(folder, "lr")
    target = _target(runs)
    rates = sorted({(r.summary.get("hyper") or {}).get("lr") for r in runs})
    out = _head("scheme", *(f"lr {x:g}: iterations to {target:g} / final accuracy" for x in rates))
    for label in sorted({r.label for r in runs}, key=lambda x: (x != "allreduce", x)):
        cells = []
        for x in rates:
            rs = pick(runs, label, lr=x)
            its = [sustained_tta(r.evals, target, at="iter") for r in rs]
            got = [i for i in its if i is not None]
            cells.append(f"{statistics.median(got):.0f} ({len(got)}/{len(rs)}) / {spread([_acc(r) for r in rs])}"
                         if got else f"not held (0/{len(rs)}) / {spread([_acc(r) for r in rs])}")
        out.append(_row(label, *cells))
    n = {len(pick(runs, r.label, lr=x)) for r in runs for x in rates}
    out += ["", f"{'/'.join(map(str, sorted(n)))} repeats per cell at {RATE_NAMES.get(runs[0].bw, runs[0].bw)} "
                f"(the links do not bind); iterations to the first of {K_SUSTAINED} evaluations in a row at or "
                f"above {target:g} (median over the repeats that held it; how many did in brackets)."]
    return "\n".join(out) + "\n"


def scaling_claims(folder: Path) -> str:
    """PruneX's strong-scaling claim from ``benchmarks.strong_scaling``'s records, at their
    largest configuration. Its runs are not paired across schemes (each cell ran on its
    own), so the range of a ratio is the widest the runs allow: [min / max, max / min]."""
    _, rows = strong_scaling.table([r for r in runs_of(folder) if r.status == "ok"])
    top = max(w["ranks"] for w in rows)
    cell_of = {w["scheme"]: w for w in rows if w["ranks"] == top}
    dense = cell_of["allreduce"]
    out = _head("paper's claim (64 GPUs, 16 nodes)", "metric", f"ours: {top} ranks behind {dense['switches']} "
                f"switches, dilated (K = {dense['k']:g}), stated compute", "verdict")
    for scheme, paper, claim in (("prunex:0.5", 6.75 / 5.81, "PruneX **6.75x** against dense **5.81x**"),
                                 ("topk:0.01", 3.71 / 5.81, "top-k **3.71x** against dense **5.81x**")):
        w = cell_of.get(scheme)
        if not w:
            out.append(_row(claim, "strong-scaling speed-up", "not measured", "not measured"))
            continue
        c = {"mid": dense["iter_s"] / w["iter_s"], "lo": dense["iter_min"] / w["iter_max"],
             "hi": dense["iter_max"] / w["iter_min"], "n": min(w["runs"], dense["runs"])}
        ours = (f"{w['speedup']:.2f}x against {dense['speedup']:.2f}x (ideal {w['ideal']}x): "
                f"{c['mid']:.2f} of dense's [{c['lo']:.2f}, {c['hi']:.2f}] over {w['runs']} and {dense['runs']} "
                f"runs; the paper's {paper:.2f}")
        out.append(_row(claim, "strong-scaling speed-up, over dense's", ours, verdict(c, paper)))
    out += ["", "Command: `sudo python -m benchmarks.strong_scaling` with the options in [strong scaling](scaling.md)."]
    return "\n".join(out) + "\n"
