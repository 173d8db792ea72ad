"""Paper-scale traffic on a CPU machine: the PacTrain paper's models at full size, every byte real.

    sudo python -m benchmarks.paper_scale [--models resnet18,resnet152,vgg19,vit_b16]
                                          [--bws 100mbit,500mbit,1gbit] [--iters 2]
                                          [--compute-time resnet152=0.1,...] [--out runs/paper_scale]
    python -m benchmarks.paper_scale --analyse runs/paper_scale/sweep-...   (re-read, no runs)

On a 2-core machine 8 CPU ranks cannot compute like 8 GPUs, so the forward and backward
pass are replaced by a stated compute time (``testbed sweep --compute-time``): each model's
real parameters at full size, DDP's real buckets, the schemes' real hooks and collectives
through the emulated links, synthetic gradients, no accuracy. For each model it runs
``testbed sweep`` on topologies/three_switch.yaml (8 gloo ranks, two edge switches of four,
the uplinks shaped) for allreduce, fp16, topk 0.01, pactrain 0.5 exact and pactrain 0.5 ternary
(stable after 1 iteration: the mask is fixed before training), at 100 Mbit, 500 Mbit and
1 Gbit, and prints per model and rate:

* the iteration time: the mean of the iterations after the first (first use of every
  buffer; DDP's one-time bucket rebuild happens between the first and the second, off the
  clock), from rank 0's records;
* speedup over allreduce, fp16 and topk (their time / this scheme's);
* each scheme's efficiency against its own two bounds (``benchmarks.bounds``): the
  perfect-overlap bound max(C, W / R) and the no-overlap time C + W / R, C the stated
  compute time, W the bytes per timed iteration on the busiest shaped direction (tc
  counters sampled each second, interpolated to the timed iterations' start and end:
  start-up traffic left out), R the rate;
* peak resident memory per rank and of all 8 ranks together.

The compute times are inputs, not measurements: the defaults are estimates for one A40
(the paper's GPU) at batch 32 on 32x32 images; give yours with --compute-time. What the
hooks themselves cost on this CPU (quantisation, top-k selection, copies: work a GPU does
in milliseconds) is in the measured time and shows as a no-overlap efficiency below 1.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path

import yaml

from benchmarks import bounds
from benchmarks.paper_sweep import THREE, busiest_bytes_per_iter, median_of, run_sweep, testbed_argv
from testbed.common.files import read_jsonl
from testbed.runs.reports.report import RunData, find_runs
from testbed.model.units import Rate

MODELS = ("resnet18", "resnet152", "vgg19", "vit_b16")
BWS = ("100mbit", "500mbit", "1gbit")
SCHEMES = ("allreduce", "fp16", "topk:0.01", "pactrain:0.5:exact", "pactrain:0.5:ternary")
COMPUTE_S = {"resnet18": 0.02, "resnet152": 0.10, "vgg19": 0.02, "vit_b16": 0.03}
"""Assumed forward + backward seconds per iteration (A40, batch 32, 32x32 images): estimates."""
NAME = "pscale"


def _compute_times(spec: str | None) -> dict[str, float]:
    times = dict(COMPUTE_S)
    for item in filter(None, (x.strip() for x in (spec or "").split(","))):
        model, _, value = item.partition("=")
        try:
            times[model] = float(value)
        except ValueError:
            raise SystemExit(f"--compute-time: {item!r} is not MODEL=SECONDS") from None
    return times


def steady_iter_s(r: RunData) -> float | None:
    """Rank 0's mean iteration time after the first iteration (or the only one)."""
    its = [x["iter_s"] for x in read_jsonl(r.path / "rank0.jsonl") if isinstance(x.get("iter_s"), (int, float))]
    if not its:
        return None
    return statistics.fmean(its[1:]) if len(its) > 1 else its[-1]


def _interp(samples: list[tuple[float, float]], t: float) -> float | None:
    """Cumulative bytes at time t, linear between the two samples around it."""
    for (ta, ba), (tb, bb) in zip(samples, samples[1:]):
        if ta <= t <= tb:
            return ba + (bb - ba) * ((t - ta) / (tb - ta) if tb > ta else 1.0)
    return None


def steady_wire(r: RunData) -> tuple[float, bool]:
    """(bytes per timed iteration on the busiest shaped direction, whether that is from the
    timed iterations alone). The tc byte counters are sampled each second (``links.jsonl``);
    over timed iterations that span at least 3 s they are interpolated to the iterations'
    start and end, so start-up traffic (the pruning mask's broadcast, DDP's checks) is left
    out. Shorter windows take the whole run's average (start-up included)."""
    window = timed_window(read_jsonl(r.path / "rank0.jsonl"), r.summary.get("dilation") or 1)
    series: dict[tuple, list] = {}
    for x in read_jsonl(r.path / "links.jsonl"):
        if isinstance(x.get("time"), (int, float)) and isinstance(x.get("bytes"), (int, float)):
            series.setdefault((x.get("link"), x.get("direction")), []).append((x["time"], x["bytes"]))
    if window and window[1] - window[0] >= 3.0:
        t0, t1, n = window
        spans = []
        for samples in series.values():
            samples.sort()
            a, b = _interp(samples, t0), _interp(samples, t1)
            if a is not None and b is not None:
                spans.append(b - a)
        if spans:
            return max(spans) / n, True
    return busiest_bytes_per_iter(r), False


def timed_window(records: list[dict], k: float) -> tuple[float, float, int] | None:
    """(start, end, count) of the timed iterations (all but the first) of rank 0's records,
    on the wall clock: records' "time" is the wall clock, a dilated run's iter_s is emulated
    (/ K). None without iteration records."""
    its = [x for x in records if isinstance(x.get("iter_s"), (int, float)) and isinstance(x.get("time"), (int, float))]
    timed = its[1:] if len(its) > 1 else its[-1:]
    if not timed:
        return None
    return timed[0]["time"] - timed[0]["iter_s"] * k, timed[-1]["time"], len(timed)


def run_sweeps(args, times: dict[str, float]) -> list[Path]:
    dirs = []
    with tempfile.TemporaryDirectory() as tmp:
        topo = yaml.safe_load(THREE.read_text())
        topo["name"] = NAME
        path = Path(tmp) / f"{NAME}.yaml"
        path.write_text(yaml.safe_dump(topo, sort_keys=False))
        up = subprocess.run([*testbed_argv(), "up", str(path), "--no-exporter", "--json"], stdout=subprocess.PIPE, text=True)
        if up.returncode != 0:
            raise SystemExit(f"testbed up failed (exit {up.returncode})")
        try:
            for model in args.models:
                cmd = [*testbed_argv(), "sweep", "-t", NAME, "--schemes", ",".join(args.schemes), "--bw", ",".join(args.bws),
                       "--model", model, "--compute-time", str(times[model]), "--max-iters", str(args.iters),
                       "--repeats", str(args.repeats), "--out", str(args.out), "--timeout", "900",
                       "--no-exporter", "--json", "--",
                       "--stable-iters", "1"]
                dirs.append(run_sweep(cmd, model, partial_ok=True))
        finally:
            subprocess.run([*testbed_argv(), "down", NAME], stdout=subprocess.DEVNULL)
    return dirs


OTHERS = ("allreduce", "fp16", "topk:0.01")
"""The schemes every row's speed-up is taken over."""


def _cells(runs: list[RunData]) -> dict[tuple, dict[str, list[RunData]]]:
    """Runs by (model, rate), models in ``MODELS`` order then the others, rates by speed;
    within a cell by scheme (its sweep variant, e.g. ``pactrain:0.5:ternary``)."""
    by: dict[tuple, dict[str, list[RunData]]] = {}
    for r in runs:
        s = r.summary
        by.setdefault((s.get("model"), r.bw), {}).setdefault(s.get("variant") or s.get("scheme"), []).append(r)
    order = {m: i for i, m in enumerate(MODELS)}
    return dict(sorted(by.items(), key=lambda kv: (order.get(kv[0][0], len(order)), str(kv[0][0]),
                                                   Rate.parse(kv[0][1]).bps)))


def _times(cells: dict[str, list[RunData]]) -> dict[str, float | None]:
    """Each scheme's median steady iteration time in a cell."""
    return {v: median_of(steady_iter_s(r) for r in rs) for v, rs in cells.items()}


def _schemes(cells: dict) -> list[str]:
    return [x for x in SCHEMES if x in cells] + sorted(set(cells) - set(SCHEMES))


def _measured(rs: list[RunData]) -> tuple[float, bool, float | None, float]:
    """A cell's W (median bytes per timed iteration), whether every run's W is from its timed
    window alone, the stated C, and the median peak RSS per rank in GB."""
    wires = [steady_wire(r) for r in rs]
    rss = (median_of(r.summary.get("max_rss_bytes_per_rank") for r in rs) or 0) / 1e9
    return (statistics.median(x for x, _ in wires), all(ok for _, ok in wires),
            rs[0].summary.get("compute_time_s"), rss)


def analyse(runs: list[RunData]) -> None:
    print("\nPaper-scale traffic: gloo ranks on three_switch, stated compute time, real buckets and hooks")
    print("speedup = other scheme's iteration time / this one's (medians over runs); C = the stated compute time, "
          "W = bytes per timed iteration on the busiest shaped direction")
    print(bounds.LEGEND + "\n")
    print(f"{'model':<10} {'rate':>8} {'scheme':<21} {'vs allreduce':>12} {'vs fp16':>8} {'vs topk':>8} "
          f"{'RSS/rank GB':>11} {'RSS all GB':>10} {bounds.HEADER}")
    last = None
    for (model, bw), cells in _cells(runs).items():
        if last is not None and model != last:
            print()
        last = model
        t = _times(cells)
        for v in _schemes(cells):
            print(f"{model:<10} {bw:>8} {v:<21} " + _row(cells[v], t, v, Rate.parse(bw).bps / 8))
    print()
    print("* W over the whole run, start-up included (timed iterations shorter than 3 s: the counters are "
          "sampled each second), so no bound")


def _row(rs: list[RunData], t: dict, v: str, rate: float) -> str:
    it = t[v]
    ratio = {o: (t[o] / it if t.get(o) and it else float("nan")) for o in OTHERS}
    w, steady, c, rss = _measured(rs)
    rss_all = (median_of(r.summary.get("max_rss_bytes_all_ranks") for r in rs) or 0) / 1e9
    eff = bounds.row([steady_iter_s(r) for r in rs], c if steady else None, w, rate)
    return (f"{ratio['allreduce']:12.2f} {ratio['fp16']:8.2f} {ratio['topk:0.01']:8.2f} {rss:11.2f} {rss_all:10.2f} "
            + eff + ("" if steady else " *"))


MODEL_NAMES = {"resnet18": "ResNet18", "resnet152": "ResNet152", "vgg19": "VGG19", "vit_b16": "ViT-B/16"}


def markdown(runs: list[RunData], bw: str) -> str:
    """docs/results/training.md's paper-scale table at rate ``bw``, from the records: per model
    and scheme the median iteration time over the cell's runs, the speed-ups over allreduce,
    fp16 and topk 0.01 (their time / this one's), W and both efficiencies (``bounds.cells``;
    '*' where the timed window is under 3 s and W is the whole run's average: no bound), and
    the peak resident memory per rank."""
    rate = Rate.parse(bw).bps / 8
    out = ["| model (gradients) | scheme | runs | iteration s | vs allreduce | vs fp16 | vs topk 0.01 | W MB | "
           "no-overlap eff | overlap eff | RSS / rank GB |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (model, b), cells in _cells(runs).items():
        if b != bw:
            continue
        t = _times(cells)
        grads = (median_of(r.summary.get("dense_bytes") for r in next(iter(cells.values()))) or 0) / 1e6
        name = f"{MODEL_NAMES.get(model, model)} ({grads:.0f} MB)"
        for v in _schemes(cells):
            out.append(_markdown_row(name, v, cells[v], t, rate))
            name = ""
    return "\n".join(out) + "\n"


def speedups_markdown(runs: list[RunData], scheme: str = "pactrain:0.5:ternary") -> str:
    """docs/results/claims.md's not-comparable rows: ``scheme``'s iteration-time speed-up over
    allreduce, fp16 and topk 0.01 per model and rate (medians over each cell's runs)."""
    out = [f"| model | rate | {scheme.replace(':', ' ')}: iteration-time speed-up over allreduce | over fp16 | "
           "over topk 0.01 | runs per cell |", "| --- | --- | ---: | ---: | ---: | --- |"]
    for (model, bw), cells in _cells(runs).items():
        t = _times(cells)
        mine = t.get(scheme)
        if model not in MODELS or not mine:
            continue
        ratio = [f"{t[o] / mine:.2f}x" if t.get(o) else "-" for o in OTHERS]
        n = sorted({len(rs) for rs in cells.values()})
        out.append(f"| {MODEL_NAMES.get(model, model)} | {bw} | " + " | ".join(ratio) + f" | {'/'.join(map(str, n))} |")
    return "\n".join(out) + "\n"


def _markdown_row(model: str, v: str, rs: list[RunData], t: dict, rate: float) -> str:
    it = t[v]
    ratio = [f"{t[o] / it:.2f}" if t.get(o) and it else "-" for o in OTHERS]
    w, steady, c, rss = _measured(rs)
    eff = bounds.cells([steady_iter_s(r) for r in rs], c if steady else None, w, rate)
    wire = f"{w / 1e6:.1f}" if steady else f"({w / 1e6:.1f})*"
    return (f"| {model} | {v.replace(':', ' ')} | {len(rs)} | {eff[1]} | " + " | ".join(ratio)
            + f" | {wire} | {eff[8]} | {eff[7]} | {rss:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    p.add_argument("--bws", default=",".join(BWS))
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--iters", type=int, default=2, help="iterations per run (the first is not timed)")
    p.add_argument("--repeats", type=int, default=1, help="runs per cell (seed + k); tables show the spread")
    p.add_argument("--compute-time", default=None, help="MODEL=SECONDS,... (defaults: " +
                   ", ".join(f"{k}={v}" for k, v in COMPUTE_S.items()) + ", estimates)")
    p.add_argument("--out", type=Path, default=Path("runs/paper_scale"))
    p.add_argument("--analyse", type=Path, nargs="*", help="sweep directories to read instead of running")
    args = p.parse_args()
    args.models = [x.strip() for x in args.models.split(",") if x.strip()]
    args.bws = [x.strip() for x in args.bws.split(",") if x.strip()]
    args.schemes = [x.strip() for x in args.schemes.split(",") if x.strip()]
    times = _compute_times(args.compute_time)
    for m in args.models:
        if m not in times:
            p.error(f"no compute time for {m}: give --compute-time {m}=SECONDS")
    dirs = args.analyse or run_sweeps(args, times)
    runs = [r for r in find_runs(dirs) if r.status == "ok"]
    print(f"\nsweep dirs: {', '.join(map(str, dirs))}; compute times (s): "
          + ", ".join(f"{m}={times[m]}" for m in args.models))
    analyse(runs)


if __name__ == "__main__":
    main()
