"""Strong scaling as the PruneX paper measures it, in paper-scale mode (real bytes, stated compute).

    sudo python -m benchmarks.strong_scaling [--configs 4x2,8x2,8x4,16x4] [--model resnet18] [--width 0.5]
                                             [--bw 500mbit] [--global-compute 1.6] [--iters 4] [--repeats 1]
                                             [--schemes allreduce,hier-allreduce,prunex:0.5,topk:0.01]
                                             [--dilation K|auto|auto:FIRST-LAST] [--validate] [--no-refs]
                                             [--out runs/strong_scaling]
    python -m benchmarks.strong_scaling --analyse runs/strong_scaling/sweep-...   (re-read, no runs)

The PruneX paper scales a fixed problem from one node to 16 (64 GPUs) and reports the
speed-up over one node: PruneX 6.75x, dense all-reduce 5.81x, top-k 3.71x (ideal 16x).
Here a node is an edge switch: each configuration ``NxS`` is N ranks behind S edge
switches (N / S each, 10 Gbit access links), whose uplinks to one core switch run at
``--bw`` (the bottleneck). The reference is one switch's worth of ranks (N / S ranks
behind a single switch at 10 Gbit, nothing crossing an uplink) running dense all-reduce.

Strong scaling: the global batch is fixed, so a rank of N computes 1 / N of it, and
``--compute-time`` (``testbed sweep``'s paper-scale mode: real parameters, DDP buckets,
the schemes' hooks and collectives, synthetic gradients, no accuracy) is
``--global-compute`` / N: the seconds one rank would spend on the whole global batch,
divided by the ranks. Each run makes ``--iters`` iterations; the first is not timed
(first use of every buffer, DDP's bucket rebuild after it); PruneX's masks are fixed
after the first iteration (``--prunex-prune-at`` 0), so its timed iterations exchange
compacted buffers, as in the paper's pruned steady state.

It prints, per configuration and scheme: the median steady iteration time, the speed-up
over all-reduce on one switch's worth of ranks (and over the scheme's own one-switch
time), the ideal N / (N / S) = S, the bytes per timed iteration on the busiest uplink
direction, and peak resident memory per rank and over all ranks. The same table, computed
once (``table``), is the results pages' markdown (``markdown``: each iteration time with its
[min-max] over repeats), which ``python -m benchmarks.regenerate`` writes from committed
records (its generator ``strong_scaling``).

The default configuration fits a 2-core, 23 GB machine: ResNet18 at width 0.5 (2.8 M
parameters, 11 MB of gradients, a quarter of the paper's ResNets' smallest) and 16
ranks at most; ranks share the two cores, so the hooks' CPU work (top-k's selection,
gloo's reductions) weighs more than on GPUs.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
from pathlib import Path

import yaml

from benchmarks.paper_scale import testbed_argv, run_sweep, steady_iter_s, steady_wire
from testbed.runs.reports.report import RunData, find_runs

CONFIGS = "4x2,8x2,8x4,16x4"
SCHEMES = ("allreduce", "hier-allreduce", "prunex:0.5", "topk:0.01")
NAME = re.compile(r"^ss(\d+)x(\d+)$")


def parse_configs(spec: str) -> list[tuple[int, int]]:
    """'4x2,8x4' -> [(4, 2), (8, 4)]: ranks and switches, the ranks dividing evenly."""
    out = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        m = re.fullmatch(r"(\d+)x(\d+)", item)
        if not m or int(m[2]) < 1 or int(m[1]) % int(m[2]):
            raise SystemExit(f"--configs: {item!r} is not RANKSxSWITCHES with the switches dividing the ranks")
        out.append((int(m[1]), int(m[2])))
    return out


def topology(ranks: int, switches: int, bw: str) -> dict:
    """``ranks`` workers behind ``switches`` edge switches (consecutive ranks per switch),
    each switch's uplink to core s0 at ``bw`` (the bottleneck); access links 10 Gbit.
    One switch: no uplink, and w0's access link is marked as the bottleneck (run at
    10 Gbit), so the run's tc-counter proof has a link that the collectives cross."""
    defaults = {"backend": "netns", "link": {"rate": "10gbit"},
                "sysctls": {"net.ipv4.tcp_congestion_control": "reno"}}
    if switches == 1:
        return {"name": f"ss{ranks}x1", "defaults": defaults,
                "nodes": {"s1": {"kind": "switch"}, **{f"w{i}": {"kind": "worker"} for i in range(ranks)}},
                "links": [{"endpoints": [f"w{i}", "s1"], **({"bottleneck": True} if i == 0 else {})}
                          for i in range(ranks)]}
    per = ranks // switches
    nodes = {"s0": {"kind": "switch"}, **{f"s{j + 1}": {"kind": "switch"} for j in range(switches)},
             **{f"w{i}": {"kind": "worker"} for i in range(ranks)}}
    links = ([{"endpoints": [f"w{i}", f"s{i // per + 1}"]} for i in range(ranks)]
             + [{"endpoints": [f"s{j + 1}", "s0"], "rate": bw, "bottleneck": True} for j in range(switches)])
    return {"name": f"ss{ranks}x{switches}", "defaults": defaults, "nodes": nodes, "links": links}


def plan(configs: list[tuple[int, int]], refs: bool = True) -> list[tuple[int, int]]:
    """The configurations and their one-switch references (N / S ranks on one switch), once each
    (``refs`` False: the references come from an earlier run's sweeps, given to --analyse)."""
    refs = [(n // s, 1) for n, s in configs] if refs else []
    return sorted(set(configs) | set(refs), key=lambda c: (c[0], c[1]))


def run_sweeps(args) -> list[Path]:
    dirs = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, s in plan(parse_configs(args.configs), not args.no_refs):
            path = Path(tmp) / f"ss{n}x{s}.yaml"
            path.write_text(yaml.safe_dump(topology(n, s, args.bw), sort_keys=False))
            common = ["--topology", str(path), "--bw", args.bw if s > 1 else "10gbit", "--model", args.model,
                      "--width", str(args.width), "--compute-time", f"{args.global_compute / n:.6g}",
                      "--max-iters", str(args.iters), "--timeout", "900", "--no-exporter", "--json"]
            auto = ladder_for(args.dilation, n)
            k = find_dilation([*common, "--out", str(args.out)], f"{n}x{s}", auto) if auto else args.dilation
            dirs.append(run_sweep(sweep_argv(args, k, args.repeats, args.out, common), f"{n}x{s}"))
            if args.validate and auto:
                doubled = f"{2 * float(k):g}"
                check = run_sweep(sweep_argv(args, doubled, 1, args.out / "validate", common), f"{n}x{s} at 2K")
                VALIDATIONS.append((dirs[-1], check))
    return dirs


VALIDATIONS: list[tuple[Path, Path]] = []
"""(the sweep at K, the sweep at 2K) of --validate."""


def sweep_argv(args, k: str, repeats: int, out: Path, common: list[str]) -> list[str]:
    return [*testbed_argv(), "sweep", "--schemes", ",".join(args.schemes), "--repeats", str(repeats),
            "--dilation", str(k), *common, "--out", str(out), "--", "--prunex-prune-at", "0"]


def ladder_for(spec: str, ranks: int) -> str | None:
    """The ``--dilation auto:FIRST-LAST`` of a configuration (None: a fixed K). Plain
    ``auto`` starts at the power of two nearest below ranks / 2 and goes up to 512: on two
    cores, smaller K measured the machine at every size tried (64 ranks: 2025, 862, 717, 226,
    151, 117 and 67 ms at K = 1 to 64), and each rejected run costs the ranks' start-up."""
    if spec == "auto":
        first = 1
        while first * 2 <= ranks // 2:
            first *= 2
        return f"auto:{first}-512"
    return spec if spec.startswith("auto") else None


def find_dilation(common: list[str], what: str, auto: str) -> str:
    """``testbed run allreduce --dilation AUTO`` on the configuration: the K its sweep runs at
    (the validated one, or the largest tried when none agreed: said so)."""
    import json
    import subprocess

    cmd = [*testbed_argv(), "run", "allreduce", "--dilation", auto, *common]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    try:
        s = json.loads(p.stdout)
        k = s["dilation"]
    except (ValueError, KeyError):
        raise SystemExit(f"--dilation auto failed for {what} (exit {p.returncode}): {p.stdout[-2000:]}") from None
    curve = ", ".join(f"K {c['k']:g}: {c['median_iter_s'] * 1000:.1f} ms" for c in s["dilation_curve"])
    print(f"{what}: K = {k:g} ({'validated' if s['dilation_validated'] else 'NOT validated'}; {curve})", flush=True)
    return f"{k:g}"


def print_validations() -> None:
    """Each scheme's median iteration at K (its repeats) against its run at 2K: K, found by
    all-reduce, holds for the scheme when they agree within 5 % (the table the page's
    ``strong_scaling_validation`` block shows)."""
    if not VALIDATIONS:
        return
    print("\nK found by allreduce, checked per scheme at 2K:")
    runs = [r for r in find_runs([d for pair in VALIDATIONS for d in pair]) if r.status == "ok"]
    print(validation_markdown(runs))


def _median(values) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def table(runs: list[RunData]) -> tuple[dict, list[dict]]:
    """The strong-scaling table, computed once for the printed table and the markdown one:
    (a summary to name the model and the uplinks' rate by, one row per configuration and
    scheme). Iteration times are medians over the cell's runs, with their min and max."""
    cells: dict = {}
    for r in at_main_k(runs):
        m = NAME.match(str(r.summary.get("topology")))
        if m:
            cells.setdefault((int(m[1]), int(m[2]), _variant(r)), []).append(r)
    times = {k: [t for t in map(steady_iter_s, rs) if t is not None] for k, rs in cells.items()}
    t = {k: _median(ts) for k, ts in times.items()}
    shaped = [rs[0].summary for (_, switches, _), rs in cells.items() if switches > 1]  # not a reference's
    any_run = shaped[0] if shaped else next(iter(cells.values()))[0].summary if cells else {}
    order = [v for v in SCHEMES if any(k[2] == v for k in cells)] + sorted({k[2] for k in cells} - set(SCHEMES))
    rows = []
    for n, s in sorted({(k[0], k[1]) for k in cells}, key=lambda c: (c[1] > 1, c[0] // c[1], c[0])):
        ref = t.get((n // s, 1, "allreduce"))
        for v in order:
            rs = cells.get((n, s, v))
            if not rs:
                continue
            it, own = t[(n, s, v)], t.get((n // s, 1, v))
            wires = [steady_wire(r) for r in rs] if s > 1 else []  # one switch: no uplink
            wire = _median(w for w, _ in wires)
            rows.append({"ranks": n, "switches": s, "scheme": v, "runs": len(rs),
                         "compute_s": rs[0].summary.get("compute_time_s") or 0, "iter_s": it,
                         "iter_min": min(times[(n, s, v)], default=None),
                         "iter_max": max(times[(n, s, v)], default=None),
                         "speedup": ref / it if ref and it else None, "own": own / it if own and it else None,
                         "ideal": s, "uplink_mb": wire and wire / 1e6, "whole_run": any(not ok for _, ok in wires),
                         "rss_gb": (_median(r.summary.get("max_rss_bytes_per_rank") for r in rs) or 0) / 1e9,
                         "pss_gb": (_median(r.summary.get("pss_bytes_all_ranks") for r in rs) or 0) / 1e9,
                         "k": rs[0].summary.get("dilation") or 1})
    return any_run, rows


def _variant(r: RunData) -> str:
    return str(r.summary.get("variant") or r.summary.get("scheme"))


def _k(r: RunData) -> float:
    return float(r.summary.get("dilation") or 1)


def at_main_k(runs: list[RunData]) -> list[RunData]:
    """Per configuration (topology), the runs at the K most of its runs used: the sweep's,
    when the same records hold --dilation auto's ladder and --validate's runs at 2K."""
    by_topology: dict[str, list[RunData]] = {}
    for r in runs:
        by_topology.setdefault(str(r.summary.get("topology")), []).append(r)
    out = []
    for rs in by_topology.values():
        ks = [_k(r) for r in rs]
        main = max(sorted(set(ks)), key=ks.count)
        out += [r for r in rs if _k(r) == main]
    return out


def validation_markdown(runs: list[RunData]) -> str:
    """Per configuration and scheme, the median steady iteration at each K the records hold
    (the sweep's K, --validate's 2K, --dilation auto's ladder for all-reduce), and whether
    each K agrees with the one before it within 5 % (the page generator
    ``strong_scaling_validation``)."""
    cells: dict = {}
    for r in runs:
        m = NAME.match(str(r.summary.get("topology")))
        t = steady_iter_s(r)
        if m and t is not None:
            cells.setdefault((int(m[1]), int(m[2]), _variant(r)), {}).setdefault(_k(r), []).append(t)
    out = ["| ranks | switches | scheme | K: median iteration ms (runs) | K against the K before it |",
           "| ---: | ---: | --- | --- | --- |"]
    order = {v: i for i, v in enumerate(SCHEMES)}
    for (n, s, v), per_k in sorted(cells.items(), key=lambda c: (c[0][0], c[0][1], order.get(c[0][2], 99), c[0][2])):
        meds = {k: statistics.median(ts) for k, ts in sorted(per_k.items())}
        ks = list(meds)
        curve = ", ".join(f"{k:g}: {meds[k] * 1000:.1f} ({len(per_k[k])})" for k in ks)
        steps = ", ".join(f"{b:g} vs {a:g}: {(meds[b] - meds[a]) / meds[a] * 100:+.1f} % "
                          f"({'agree' if abs(meds[b] - meds[a]) <= 0.05 * meds[a] else 'differ'})"
                          for a, b in zip(ks, ks[1:]))
        out.append(f"| {n} | {s} | {v} | {curve} | {steps or '-'} |")
    return "\n".join(out) + "\n"


WHOLE_RUN = "timed iterations shorter than 3 s: uplink bytes are the whole run's average, start-up included"


def analyse(runs: list[RunData]) -> None:
    any_run, rows = table(runs)
    print(f"\nStrong scaling, paper-scale mode: {any_run.get('model')} (width as run), stated compute = "
          f"global compute / ranks; bottleneck = the edge switches' uplinks at {any_run.get('bw')}")
    print("speed-up = all-reduce's iteration time on one switch's worth of ranks / this one's (own: the "
          "scheme's own one-switch time); medians over runs\n")
    print(f"{'ranks':>5} {'switches':>8} {'scheme':<16} {'runs':>4} {'compute s':>9} {'iter s':>8} "
          f"{'speed-up':>8} {'own':>6} {'ideal':>5} {'uplink MB/iter':>14} {'RSS/rank GB':>11} {'PSS all GB':>10} "
          f"{'K':>4}")
    for w in rows:
        print(f"{w['ranks']:>5} {w['switches']:>8} {w['scheme']:<16} {w['runs']:>4} {w['compute_s']:9.3f} "
              f"{_f(w['iter_s'], '8.3f')} {_f(w['speedup'], '8.2f')} {_f(w['own'], '6.2f')} {w['ideal']:>5} "
              f"{_f(w['uplink_mb'], '13.2f')}{'*' if w['whole_run'] else ' '} {w['rss_gb']:11.2f} "
              f"{w['pss_gb']:10.2f} {w['k']:4g}")
    print(f"* {WHOLE_RUN}")


def markdown(runs: list[RunData]) -> str:
    """The table of :func:`analyse` as markdown, each iteration time with its [min-max] over
    the cell's runs (the page generator ``strong_scaling`` of benchmarks.regenerate)."""
    any_run, rows = table(runs)
    star = "\\*"  # a bare * may start emphasis
    out = [f"{any_run.get('model')}, stated compute = global compute / ranks, the edge switches' uplinks at "
           f"{any_run.get('bw')}; speed-up = all-reduce's iteration time on one switch's worth of ranks / this "
           "one's (own: the scheme's own one-switch time); iteration s: median [min-max] over runs", "",
           "| ranks | switches | scheme | runs | compute s | iteration s | speed-up | own | ideal | uplink MB/iter "
           "| PSS all GB | K |", "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for w in rows:
        spread = f" [{w['iter_min']:.3f}-{w['iter_max']:.3f}]" if w["runs"] > 1 and w["iter_min"] is not None else ""
        out.append(f"| {w['ranks']} | {w['switches']} | {w['scheme']} | {w['runs']} | {w['compute_s']:.3f} | "
                   f"{_f(w['iter_s'], '.3f')}{spread} | {_f(w['speedup'], '.2f')} | {_f(w['own'], '.2f')} | "
                   f"{w['ideal']} | {_f(w['uplink_mb'], '.2f')}{star if w['whole_run'] else ''} | "
                   f"{w['pss_gb']:.2f} | {w['k']:g} |")
    if any(w["whole_run"] for w in rows):
        out += ["", f"\\* {WHOLE_RUN}"]
    return "\n".join(out) + "\n"


def _f(x: float | None, fmt: str) -> str:
    width = int(fmt.split(".")[0] or 1)
    return format(x, fmt) if x is not None else f"{'-':>{width}}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=CONFIGS, help="RANKSxSWITCHES,... (one-switch references are added)")
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--model", default="resnet18")
    p.add_argument("--width", type=float, default=0.5, help="model width multiplier (1: the paper's size)")
    p.add_argument("--bw", default="500mbit", help="the uplinks' rate")
    p.add_argument("--global-compute", type=float, default=1.6,
                   help="seconds one rank would compute the whole global batch (an input, not a measurement)")
    p.add_argument("--iters", type=int, default=4, help="iterations per run (the first is not timed)")
    p.add_argument("--repeats", type=int, default=1, help="runs per cell (seed + k)")
    p.add_argument("--dilation", default="1", help="time dilation K of every run, or auto (auto:FIRST-LAST): "
                   "found per configuration by `testbed run allreduce --dilation auto:...`, then every scheme "
                   "runs at it")
    p.add_argument("--no-refs", action="store_true", help="leave out the one-switch references (already "
                   "measured: give their sweeps to --analyse with these)")
    p.add_argument("--validate", action="store_true", help="with auto: one more run of every scheme at 2K, "
                   "printed beside its runs at K")
    p.add_argument("--out", type=Path, default=Path("runs/strong_scaling"))
    p.add_argument("--analyse", type=Path, nargs="*", help="sweep directories to read instead of running")
    args = p.parse_args()
    args.schemes = [x.strip() for x in args.schemes.split(",") if x.strip()]
    dirs = args.analyse or run_sweeps(args)
    runs = [r for r in find_runs(dirs) if r.status == "ok"]
    print(f"\nsweep dirs: {', '.join(map(str, dirs))}")
    analyse(runs)
    print_validations()


if __name__ == "__main__":
    main()
