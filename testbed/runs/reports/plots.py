"""The report's figures, one function each (PNG files in the report's directory):

    tta.png            time-to-accuracy normalised to allreduce, per bandwidth (median, min-max;
                       first crossing and sustained)
    accuracy.png       accuracy vs training time, every run
    bytes.png          payload and bottleneck bytes per iteration per variant
    prune_ratio.png    final accuracy vs pruning ratio, when PacTrain runs span ratios
    utilisation.png    the busiest bottleneck direction over time, every run
    timeline-<run>.png a run whose links changed (a trace) or were shared (cross-traffic):
                       capacity, throughput and the flows' rates over time, iteration times below

matplotlib is imported (with the Agg backend) only when a report draws.
"""

from __future__ import annotations

import re
from pathlib import Path

from testbed.common.files import read_jsonl
from testbed.common.outdir import OutDir
from testbed.model.units import Rate, UnitError
from testbed.runs.reports.rundata import RunData
from testbed.runs.reports.tables import bw_key


def plots(runs: list[RunData], rows: list[dict], out: OutDir, target: float | None) -> list[str]:
    """Draws every figure into ``out``; the names of the files written, in order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = _Figures(plt, sorted({r["bw"] for r in rows}, key=bw_key), out)
    _tta(figs, rows)
    _accuracy(figs, runs, rows, target)
    _bytes(figs, rows)
    _prune_ratio(figs, rows)
    _utilisation(figs, runs)
    for r in runs:
        if (r.summary.get("bw_trace") or r.summary.get("cross_traffic")) and r.links:
            _timeline(figs, r)
    return figs.files


class _Figures:
    """Makes figures (one panel per bandwidth) and saves them, keeping the names written."""

    def __init__(self, plt, bws: list[str], out: OutDir):
        self.plt, self.bws, self.out = plt, bws, out
        self.files: list[str] = []

    def panels(self):
        """A figure with one panel per bandwidth, and (panel, bandwidth) pairs."""
        fig, axes = self.plt.subplots(1, len(self.bws), figsize=(4.5 * len(self.bws), 3.6), squeeze=False)
        return fig, list(zip(axes[0], self.bws))

    def save(self, fig, name: str) -> None:
        fig.tight_layout()
        try:
            with self.out.create(name, f"the figures before it are written ({', '.join(self.files) or 'none'})") as f:
                fig.savefig(f, format="png", dpi=110)
        finally:
            self.plt.close(fig)
        self.files.append(name)


def _tta(figs: _Figures, rows: list[dict]) -> None:
    """Normalised time-to-accuracy per bandwidth: the first crossing (with its min-max over
    repeats) and, beside it, the sustained one (3 evaluations in a row)."""
    fig, axes = figs.panels()
    for ax, bw in axes:
        rs = [r for r in rows if r["bw"] == bw]
        vals = [r["tta_vs_allreduce"] for r in rs]
        held = [r.get("tta_sustained_vs_allreduce") for r in rs]
        xs = range(len(rs))
        lo, hi = [], []  # min-max over repeats, normalised like the median
        for r, v in zip(rs, vals):
            base = r["tta_s"] / v if v else None
            lo.append(v - r["tta_min_s"] / base if base and r["tta_min_s"] is not None else 0)
            hi.append(r["tta_max_s"] / base - v if base and r["tta_max_s"] is not None else 0)
        left = [x - 0.2 for x in xs]
        ax.bar(left, [v if v is not None else 0 for v in vals], width=0.4, color="tab:blue", yerr=[lo, hi],
               capsize=3, label="first crossing")
        ax.bar([x + 0.2 for x in xs], [v if v is not None else 0 for v in held], width=0.4, color="tab:orange",
               label="sustained (3 in a row)")
        for x, v, h in zip(xs, vals, held):
            for at, y in ((x - 0.2, v), (x + 0.2, h)):
                ax.text(at, (y or 0) + 0.02, f"{y:.2f}" if y is not None else "not\nreached", ha="center",
                        va="bottom", fontsize=7)
        ax.legend(fontsize=7)
        ax.set_xticks(list(xs), [r["scheme"] for r in rs], rotation=30, ha="right", fontsize=8)
        ax.set_title(f"bottleneck {bw}")
        ax.set_ylabel("TTA / allreduce")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    figs.save(fig, "tta.png")


def _accuracy(figs: _Figures, runs: list[RunData], rows: list[dict], target: float | None) -> None:
    """Accuracy vs training time (every run; repeats of a variant share a colour and a legend entry)."""
    colour = {row["variant"]: f"C{i % 10}" for i, row in enumerate(dict((x["variant"], x) for x in rows).values())}
    fig, axes = figs.panels()
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
        if named:  # no evaluation (--compute-time runs): no legend, and no matplotlib warning
            ax.legend(fontsize=7)
    figs.save(fig, "accuracy.png")


def _bytes(figs: _Figures, rows: list[dict]) -> None:
    """Bytes per iteration: what one rank handed to collectives, what crossed the bottleneck."""
    fig, axes = figs.panels()
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
    figs.save(fig, "bytes.png")


def _prune_ratio(figs: _Figures, rows: list[dict]) -> None:
    """Final accuracy vs pruning ratio (the PacTrain paper's Fig. 6), where runs span ratios."""
    prunes = [x for x in rows if x["base_scheme"] == "pactrain" and x["hyper"].get("prune_ratio") is not None]
    if len({x["hyper"]["prune_ratio"] for x in prunes}) <= 1:
        return
    fig, axes = figs.panels()
    for ax, bw in axes:
        lines: dict[str, list] = {}
        for x in prunes:
            if x["bw"] == bw and x["final_accuracy"] is not None:
                name = {True: "pactrain ternary", False: "pactrain exact"}.get(x["hyper"].get("ternary"), "pactrain")
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
    figs.save(fig, "prune_ratio.png")


def _utilisation(figs: _Figures, runs: list[RunData]) -> None:
    """Bottleneck utilisation over time (the busiest bottleneck direction at each sample)."""
    fig, axes = figs.panels()
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
    figs.save(fig, "utilisation.png")


def _timeline(figs: _Figures, r: RunData) -> None:
    """A run whose links changed under it (a trace) or were shared (cross-traffic): capacity,
    throughput and the flows' rates over time above, the iteration times below."""
    fig, (top, bottom) = figs.plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, height_ratios=[3, 2])
    t0 = min(x["time"] for x in r.links)
    shown = _throughput_and_capacity(top, r, t0)
    _cross_traffic(top, r, t0)
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
    figs.save(fig, "timeline-" + re.sub(r"[^A-Za-z0-9._-]", "_", r.path.name)[:100] + ".png")


def _throughput_and_capacity(ax, r: RunData, t0: float) -> list[float]:
    """Up to four bottleneck directions' throughput, and the capacity: the trace's steps when
    it followed one, else each direction's configured rate. Returns the values drawn (bit/s)."""
    series: dict[str, list] = {}
    for x in r.links:
        series.setdefault(f"{x['link']} {x['direction']}", []).append(x)
    steps = [(x["time"] - t0, float(Rate.parse(str(x["rate"])).bps)) for x in read_jsonl(r.path / "trace.jsonl")
             if x.get("event") == "step" and isinstance(x.get("time"), (int, float)) and _is_rate(x.get("rate"))]
    shown = []
    for n, (name, xs) in enumerate(sorted(series.items())[:4]):
        ts = [x["time"] - t0 for x in xs]
        ax.plot(ts, [x["bytes_per_s"] * 8 / 1e6 for x in xs], lw=1, color=f"C{n}",
                label=f"{name} throughput (all traffic)")
        shown += [x["bytes_per_s"] * 8 for x in xs]
    if steps:  # the trace's steps at the times they were applied (all bottleneck links)
        end = max(x["time"] for x in r.links) - t0
        xs_ = [0.0] + [t for t, _ in steps] + [end]
        first = r.links[0]["rate_bps"]
        ys = [first] + [v for _, v in steps] + [steps[-1][1]]
        ax.step(xs_, [v / 1e6 for v in ys], where="post", lw=1.6, ls="--", color="k", alpha=0.7,
                label="capacity (trace)")
        shown += [v for _, v in steps]
    else:
        for n, (name, xs) in enumerate(sorted(series.items())[:4]):
            ax.step([x["time"] - t0 for x in xs], [x["rate_bps"] / 1e6 for x in xs], where="post", lw=1.6,
                    ls="--", color=f"C{n}", alpha=0.7, label=f"{name} capacity")
            shown += [x["rate_bps"] for x in xs]
    return shown


def _cross_traffic(ax, r: RunData, t0: float) -> None:
    """Each cross-traffic flow's received rate, one point per second (none while it is off)."""
    flows: dict[str, list] = {}
    for x in read_jsonl(r.path / "traffic.jsonl"):
        if isinstance(x.get("bits_per_second"), (int, float)) and isinstance(x.get("time"), (int, float)):
            flows.setdefault(str(x.get("label", x.get("flow")))[:60], []).append(x)
    for name, xs in flows.items():
        ax.plot([x["time"] - t0 for x in xs], [x["bits_per_second"] / 1e6 for x in xs], ls="none", marker="o",
                ms=3, label=f"cross-traffic {name} (per second; none: off)")


def _is_rate(value) -> bool:
    try:
        Rate.parse(str(value))
        return True
    except UnitError:
        return False
