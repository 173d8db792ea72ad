"""`testbed report DIR...`: compare runs by time-to-accuracy, as the PacTrain paper does.

Reads run directories (or directories holding them, such as a sweep's), groups runs by
bottleneck bandwidth and scheme variant (the scheme with every hyper-parameter in the
summary's ``hyper``; repeats give the median and min-max), and writes:

    report.json, report.csv   one row per (bandwidth, variant)
    tta.png                   time-to-accuracy normalised to allreduce, per bandwidth (Fig. 3 style),
                              median with min-max over repeats
    accuracy.png              accuracy vs wall-clock training time per run (Fig. 5 style)
    prune_ratio.png           final accuracy vs pruning ratio (Fig. 6 style), when runs span ratios
    bytes.png                 payload and bottleneck bytes per iteration per variant
    utilisation.png           bottleneck utilisation over time per run

Runs that never reached the target are shown as "not reached", never dropped.
"""

from __future__ import annotations

import csv
import re
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import read_jsonl, write_json
from testbed.model.units import Rate


@dataclass
class RunData:
    path: Path
    summary: dict
    evals: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.summary.get("status", "unknown")

    @property
    def bw(self) -> str:
        return str(self.summary.get("bw") or "as configured")

    @property
    def label(self) -> str:
        s = self.summary
        name = s.get("scheme", "?")
        if name == "topk" and s.get("topk_ratio") is not None:
            name += f" {s['topk_ratio']:g}"
        if name == "spardl" and s.get("spardl_density") is not None:
            name += f" {s['spardl_density']:g}"
        if name == "prunex" and s.get("prunex_sparsity") is not None:
            name += f" {s['prunex_sparsity']:g}"
        if name == "pactrain":
            if s.get("prune_ratio") is not None:
                name += f" {s['prune_ratio']:g}"
            if s.get("ternary"):
                name += " ternary"
        return name

    def tta(self, target: float | None) -> float | None:
        """Training seconds to ``target`` (from the evaluation records), else the run's own."""
        if target is None:
            return self.summary.get("time_to_target_s")
        for e in self.evals:
            if e["accuracy"] >= target:
                return e["train_s"]
        return None


def _json_file(path: Path, warn) -> dict | None:
    """A run's JSON file, or None (with a warning) when it is torn or not a JSON object."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warn(f"skipped {path.parent}: {path.name} is unreadable or torn ({e})")
        return None
    if not isinstance(d, dict):
        warn(f"skipped {path.parent}: {path.name} is not a JSON object")
        return None
    return d


def find_runs(dirs: list[Path], warn=lambda m: None) -> list[RunData]:
    runs = []
    for d in dirs:
        if not d.is_dir():
            raise TestbedError(f"{d}: no such directory", "give run directories (runs/<id>) or a sweep directory")
        candidates = [d] if (d / "run.json").exists() else sorted(p.parent for p in d.glob("*/run.json"))
        if not candidates:
            raise TestbedError(f"{d}: no runs found (no run.json here or one level below)",
                               "give run directories made by `testbed run` or `testbed sweep`")
        for c in candidates:
            summary = _json_file(c / "summary.json", warn)
            if summary is None:
                continue
            if not summary:
                run = _json_file(c / "run.json", warn)
                try:
                    summary = {"run_id": run["run_id"], "status": "incomplete", "scheme": run["request"]["scheme"],
                               "bw": run["request"]["bw"]}
                except (TypeError, KeyError):
                    if run is not None:
                        warn(f"skipped {c}: run.json lacks run_id/request")
                    continue
            runs.append(RunData(c, summary, read_jsonl(c / "eval.jsonl"), read_jsonl(c / "links.jsonl")))
    return runs


def _is_rate(value) -> bool:
    from testbed.model.units import UnitError
    try:
        Rate.parse(str(value))
        return True
    except UnitError:
        return False


def _bw_key(bw: str) -> float:
    from testbed.model.units import Rate, UnitError
    try:
        return Rate.parse(bw).bps
    except UnitError:
        return float("inf")


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _spread(xs) -> tuple:
    """(median, min, max) of the numbers in xs, or Nones."""
    xs = [x for x in xs if isinstance(x, (int, float))]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)


_TRAIN_KEYS = ("model", "dataset", "width", "depth", "batch_size", "lr", "momentum", "weight_decay", "lr_schedule",
               "epochs", "max_iters", "bucket_cap_mb", "init", "pretrain_dataset")
"""Keys of a summary's ``hyper`` that are the training's, not the scheme's: a variant is
compared with the allreduce run that shares them."""


def _hyper(r: RunData) -> dict:
    h = r.summary.get("hyper")
    return h if isinstance(h, dict) else {}


def _freeze(d: dict) -> str:
    return json.dumps(d, sort_keys=True, default=str)


def _labels(groups: dict) -> dict:
    """Display label per group key: the scheme's short label, plus the hyper-parameters that
    tell it apart from other groups with the same short label (never merged, never alike)."""
    by_label: dict[str, set[str]] = {}
    for (_, _, label, hyper) in groups:
        by_label.setdefault(label, set()).add(hyper)
    out = {}
    for key in groups:
        _, _, label, hyper = key
        variants = [json.loads(h) for h in sorted(by_label[label])]
        if len(variants) < 2:
            out[key] = label
            continue
        mine = json.loads(hyper)
        keys = sorted({k for v in variants for k in v})
        differ = [k for k in keys if len({_freeze({k: v.get(k)}) for v in variants}) > 1]
        out[key] = label + " [" + ", ".join(f"{k}={mine.get(k)}" for k in differ) + "]"
    return out


def table(runs: list[RunData], target: float | None = None) -> list[dict]:
    """One row per (bandwidth, world size, variant), a variant being the scheme with all its
    hyper-parameters (the summary's ``hyper``: model, dataset, batch, lr, prune ratio, ...):
    runs differing in any of them are never averaged together. Repeats give the median and
    the min-max. Rows are compared with the allreduce row at the same bandwidth, world size
    and training hyper-parameters; when the runs span several world sizes, the scheme
    column names it ("spardl 0.01 (4 ranks)")."""
    groups: dict[tuple[str, int, str, str], list[RunData]] = {}
    for r in runs:
        groups.setdefault((r.bw, _world(r), r.label, _freeze(_hyper(r))), []).append(r)
    labels = _labels(groups)
    several = len({w for _, w, _, _ in groups}) > 1
    rows = []
    for key, rs in groups.items():
        bw, world, _, hyper = key
        label = labels[key]
        ok = [r for r in rs if r.status == "ok"]
        ttas = [r.tta(target) for r in ok]
        reached = [t for t in ttas if t is not None]
        ordered = sorted(reached) + [float("inf")] * (len(ttas) - len(reached))  # not reached: after all
        tta_median = statistics.median(ordered) if ordered else None
        acc, it = _spread(r.summary.get("final_accuracy") for r in ok), _spread(r.summary.get("mean_iter_s") for r in ok)
        rows.append({
            "bw": bw, "scheme": f"{label} ({world} ranks)" if several else label, "variant": label,
            "base_scheme": str(rs[0].summary.get("scheme", "?")), "world_size": world or None,
            "runs": len(rs), "ok": len(ok),
            "target_accuracy": target if target is not None else _mean(r.summary.get("target_accuracy") for r in ok),
            "reached": len(reached),
            "tta_s": tta_median if tta_median is not None and tta_median != float("inf") else None,
            "tta_min_s": min(reached) if reached else None,
            "tta_max_s": max(reached) if reached and len(reached) == len(ok) else None,
            "final_accuracy": acc[0], "final_accuracy_min": acc[1], "final_accuracy_max": acc[2],
            "mean_iter_s": it[0], "mean_iter_min_s": it[1], "mean_iter_max_s": it[2],
            "payload_bytes_per_iter": _mean(r.summary.get("mean_payload_bytes") for r in ok),
            "wire_bytes_per_iter": _mean((r.summary.get("bottleneck") or {}).get("bytes_per_iteration") for r in ok),
            "hyper": json.loads(hyper), "paths": [str(r.path) for r in rs],
            "failed": [f"{r.path.name}: {r.status}" for r in rs if r.status != "ok"],
        })
    for row in rows:  # normalise to allreduce at the same bandwidth (the paper's Fig. 3)
        base = _baseline(row, rows)
        row["tta_vs_allreduce"] = (row["tta_s"] / base["tta_s"] if base and base["tta_s"] and row["tta_s"] is not None
                                   else None)
        row["iter_time_vs_allreduce"] = (row["mean_iter_s"] / base["mean_iter_s"]
                                         if base and base["mean_iter_s"] and row["mean_iter_s"] else None)
    rows.sort(key=lambda x: (_bw_key(x["bw"]), x["world_size"] or 0, x["base_scheme"] != "allreduce", x["variant"]))
    return rows


def _baseline(row: dict, rows: list[dict]) -> dict | None:
    """The allreduce row this row is compared with: same bandwidth, world size and training
    hyper-parameters (model, dataset, batch, lr, checkpoint, ...)."""
    train = {k: row["hyper"].get(k) for k in _TRAIN_KEYS}
    same = [x for x in rows if x["bw"] == row["bw"] and x["world_size"] == row["world_size"]
            and x["base_scheme"] == "allreduce" and {k: x["hyper"].get(k) for k in _TRAIN_KEYS} == train]
    return same[0] if len(same) == 1 else None


def _world(r: RunData) -> int:
    w = r.summary.get("world_size")
    return w if type(w) is int and w > 0 else 0


def write(runs: list[RunData], out: Path, target: float | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows = table(runs, target)
    write_json(out / "report.json", {"rows": rows, "runs": [str(r.path) for r in runs]})
    with open(out / "report.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "failed"] + ["failed"])
        w.writeheader()
        for row in rows:
            w.writerow({**row, "failed": "; ".join(row["failed"]), "hyper": _freeze(row["hyper"]),
                        "paths": "; ".join(row["paths"])})
    plots = _plots(runs, rows, out, target)
    return {"rows": rows, "out": str(out), "files": ["report.json", "report.csv", *plots]}


def _plots(runs, rows, out: Path, target) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bws = sorted({r["bw"] for r in rows}, key=_bw_key)
    files = []

    def panels():
        fig, axes = plt.subplots(1, len(bws), figsize=(4.5 * len(bws), 3.6), squeeze=False)
        return fig, list(zip(axes[0], bws))

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)

    # normalised time-to-accuracy per bandwidth
    fig, axes = panels()
    for ax, bw in axes:
        rs = [r for r in rows if r["bw"] == bw]
        vals = [r["tta_vs_allreduce"] for r in rs]
        xs = range(len(rs))
        lo, hi = [], []  # min-max over repeats, normalised like the median
        for r, v in zip(rs, vals):
            base = r["tta_s"] / v if v else None
            lo.append(v - r["tta_min_s"] / base if base and r["tta_min_s"] is not None else 0)
            hi.append(r["tta_max_s"] / base - v if base and r["tta_max_s"] is not None else 0)
        ax.bar(xs, [v if v is not None else 0 for v in vals], color="tab:blue", yerr=[lo, hi], capsize=3)
        for x, v in zip(xs, vals):
            ax.text(x, (v or 0) + 0.02, f"{v:.2f}" if v is not None else "not\nreached", ha="center", va="bottom",
                    fontsize=8)
        ax.set_xticks(list(xs), [r["scheme"] for r in rs], rotation=30, ha="right", fontsize=8)
        ax.set_title(f"bottleneck {bw}")
        ax.set_ylabel("TTA / allreduce")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    save(fig, "tta.png")

    # accuracy vs training time (every run; repeats of a variant share a colour and a legend entry)
    colour = {row["variant"]: f"C{i % 10}" for i, row in enumerate(dict((x["variant"], x) for x in rows).values())}
    fig, axes = panels()
    for ax, bw in axes:
        named = set()
        for r in runs:
            if r.bw == bw and r.evals:
                v = next((x["variant"] for x in rows if x["bw"] == bw and r.path.name in
                          {Path(p).name for p in x["paths"]}), r.label)
                ax.plot([e["train_s"] for e in r.evals], [e["accuracy"] for e in r.evals], marker=".",
                        color=colour.get(v), label=None if v in named else v, lw=1)
                named.add(v)
        if target is not None:
            ax.axhline(target, color="grey", lw=0.8, ls="--")
        ax.set_title(f"bottleneck {bw}")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy")
        ax.legend(fontsize=7)
    save(fig, "accuracy.png")

    # bytes per iteration
    fig, axes = panels()
    for ax, bw in axes:
        rs = [r for r in rows if r["bw"] == bw]
        xs = list(range(len(rs)))
        ax.bar([x - 0.2 for x in xs], [(r["payload_bytes_per_iter"] or 0) / 1e6 for r in rs], 0.4, label="payload/rank")
        ax.bar([x + 0.2 for x in xs], [(r["wire_bytes_per_iter"] or 0) / 1e6 for r in rs], 0.4,
               label="bottleneck wire")
        ax.set_xticks(xs, [r["scheme"] for r in rs], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("MB per iteration")
        ax.set_title(f"bottleneck {bw}")
        ax.legend(fontsize=7)
    save(fig, "bytes.png")

    # final accuracy vs pruning ratio (the PacTrain paper's Fig. 6), where runs span ratios
    prunes = [x for x in rows if x["base_scheme"] == "pactrain" and x["hyper"].get("prune_ratio") is not None]
    if len({x["hyper"]["prune_ratio"] for x in prunes}) > 1:
        fig, axes = panels()
        for ax, bw in axes:
            lines: dict[str, list] = {}
            for x in prunes:
                if x["bw"] == bw and x["final_accuracy"] is not None:
                    name = "pactrain ternary" if x["hyper"].get("ternary") else "pactrain"
                    lines.setdefault(name, []).append(x)
            for name, xs in sorted(lines.items()):
                xs.sort(key=lambda x: x["hyper"]["prune_ratio"])
                ax.errorbar([x["hyper"]["prune_ratio"] for x in xs], [x["final_accuracy"] for x in xs],
                            yerr=[[x["final_accuracy"] - x["final_accuracy_min"] for x in xs],
                                  [x["final_accuracy_max"] - x["final_accuracy"] for x in xs]],
                            marker="o", capsize=3, label=name)
            for x in rows:
                if x["bw"] == bw and x["base_scheme"] == "allreduce" and x["final_accuracy"] is not None:
                    ax.axhline(x["final_accuracy"], color="grey", lw=0.8, ls="--", label="allreduce")
                    break
            ax.set_xlabel("pruning ratio")
            ax.set_ylabel("final test accuracy")
            ax.set_title(f"bottleneck {bw}")
            ax.legend(fontsize=7)
        save(fig, "prune_ratio.png")

    # bottleneck utilisation over time (the busiest bottleneck direction at each sample)
    fig, axes = panels()
    for ax, bw in axes:
        for r in runs:
            if r.bw != bw or not r.links:
                continue
            by_t: dict[float, float] = {}
            for x in r.links:
                by_t[x["time"]] = max(by_t.get(x["time"], 0.0), x["utilisation"])
            t0 = min(by_t)
            ts = sorted(by_t)
            ax.plot([t - t0 for t in ts], [by_t[t] * 100 for t in ts], label=r.label, lw=1)
        ax.set_ylim(0, 105)
        ax.set_xlabel("time since start (s)")
        ax.set_ylabel("busiest bottleneck direction (%)")
        ax.set_title(f"bottleneck {bw}")
        ax.legend(fontsize=7)
    save(fig, "utilisation.png")

    # runs whose links changed under them (a trace) or were shared (cross-traffic): capacity,
    # throughput and the flows' rates over time, and the iteration times below
    for r in runs:
        if not (r.summary.get("bw_trace") or r.summary.get("cross_traffic")) or not r.links:
            continue
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, height_ratios=[3, 2])
        t0 = min(x["time"] for x in r.links)
        series: dict[str, list] = {}
        for x in r.links:
            series.setdefault(f"{x['link']} {x['direction']}", []).append(x)
        steps = [(x["time"] - t0, float(Rate.parse(str(x["rate"])).bps)) for x in read_jsonl(r.path / "trace.jsonl")
                 if x.get("event") == "step" and isinstance(x.get("time"), (int, float)) and _is_rate(x.get("rate"))]
        shown = []
        for n, (name, xs) in enumerate(sorted(series.items())[:4]):
            ts = [x["time"] - t0 for x in xs]
            top.plot(ts, [x["bytes_per_s"] * 8 / 1e6 for x in xs], lw=1, color=f"C{n}",
                     label=f"{name} throughput (all traffic)")
            shown += [x["bytes_per_s"] * 8 for x in xs]
        if steps:  # the trace's steps at the times they were applied (all bottleneck links)
            end = max(x["time"] for x in r.links) - t0
            xs_ = [0.0] + [t for t, _ in steps] + [end]
            first = r.links[0]["rate_bps"]
            ys = [first] + [v for _, v in steps] + [steps[-1][1]]
            top.step(xs_, [v / 1e6 for v in ys], where="post", lw=1.6, ls="--", color="k", alpha=0.7,
                     label="capacity (trace)")
            shown += [v for _, v in steps]
        else:
            for n, (name, xs) in enumerate(sorted(series.items())[:4]):
                top.step([x["time"] - t0 for x in xs], [x["rate_bps"] / 1e6 for x in xs], where="post", lw=1.6,
                         ls="--", color=f"C{n}", alpha=0.7, label=f"{name} capacity")
                shown += [x["rate_bps"] for x in xs]
        flows: dict[str, list] = {}
        for x in read_jsonl(r.path / "traffic.jsonl"):
            if isinstance(x.get("bits_per_second"), (int, float)) and isinstance(x.get("time"), (int, float)):
                flows.setdefault(str(x.get("label", x.get("flow")))[:60], []).append(x)
        for name, xs in flows.items():
            top.plot([x["time"] - t0 for x in xs], [x["bits_per_second"] / 1e6 for x in xs], ls="none", marker="o",
                     ms=3, label=f"cross-traffic {name} (per second; none: off)")
        top.set_ylabel("Mbit/s")
        top.set_ylim(0, 1.15 * max(shown + [1e6]) / 1e6)
        top.legend(fontsize=7, ncol=2)
        top.set_title(f"{r.label} at {r.bw}: {r.path.name}", fontsize=9)
        it = [x for x in read_jsonl(r.path / "rank0.jsonl")
              if isinstance(x.get("time"), (int, float)) and isinstance(x.get("iter_s"), (int, float))]
        bottom.plot([x["time"] - t0 for x in it], [x["iter_s"] for x in it], marker=".", lw=0.8, color="k")
        bottom.set_ylabel("iteration time (s)")
        bottom.set_xlabel("time since the run started (s)")
        bottom.set_ylim(bottom=0)
        save(fig, "timeline-" + re.sub(r"[^A-Za-z0-9._-]", "_", r.path.name)[:100] + ".png")
    return files
