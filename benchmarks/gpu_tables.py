"""docs/results/gpu.md's tables, from benchmark results archived in ``docs/results/records/``
(``--record DIR`` of the benchmark on the GPU machine, then ``benchmarks.archive``).

``compute_time``: per model, forward + backward per iteration in fp32 and in bf16 autocast
(``benchmarks.compute_time``, with and without ``--amp``): the median and min-max of one run's
timed steps, with the device and torch each result names.

``gpu_selftest``: ``testbed selftest --gpu``'s rows (``benchmarks.selftest --record``): every check,
what it expects, what it measured, its verdict. ``gpu_sweep``: the ResNet18 sweep's runs per
scheme and rate: mean and median iteration, what a rank sent per iteration, accuracy, proof."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmarks.archive import results_of, runs_of
from testbed.common.errors import TestbedError
from testbed.model.units import Rate

NAMES = {"resnet18": "ResNet18", "resnet152": "ResNet152", "vgg19": "VGG19", "vit_b16": "ViT-B/16 (4x4 patches)"}


def compute_time(folder: Path) -> str:
    results = results_of(folder, "compute_time")
    cells: dict[str, dict[bool, dict]] = {}
    for res in results:
        for m in res["rows"]:
            cells.setdefault(m["model"], {})[bool(m.get("amp"))] = m
    out = ["| model | parameters | fp32 ms, median [min-max] | bf16 autocast ms, median [min-max] |",
           "| --- | ---: | ---: | ---: |"]
    for model, by in cells.items():
        params = next(iter(by.values()))["params"]
        row = [f"{by[a]['median_s'] * 1e3:.1f} [{by[a]['min_s'] * 1e3:.1f}-{by[a]['max_s'] * 1e3:.1f}]"
               if a in by else "-" for a in (False, True)]
        out.append(f"| {NAMES.get(model, model)} | {params / 1e6:.1f} M | {row[0]} | {row[1]} |")
    where = "; ".join(sorted({f"{r.get('device')}, torch {r.get('torch')}, {r.get('iters')} timed steps"
                              for r in results}))
    return "\n".join(out + ["", f"Batch 32, 32x32 inputs, one run per column: {where}."]) + "\n"


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def gpu_selftest(folder: Path) -> str:
    """The self-test's rows as it printed them, and its verdict and duration."""
    results = results_of(folder, "selftest")
    if len(results) != 1:
        raise TestbedError(f"{folder}: {len(results)} self-test results", "archive one per table")
    res = results[0]
    out = ["| check | expected | measured | verdict |", "| --- | --- | --- | --- |"]
    for r in res["rows"]:
        measured = r["measured"] + (f" ({r['detail']})" if r["detail"] and r["verdict"] != "pass" else "")
        out.append("| " + " | ".join(_cell(x) for x in (r["check"], r["expected"], measured, r["verdict"])) + " |")
    nccl = [r["data"]["seconds"] for r in res["rows"] if r["check"].startswith("nccl ") and r["verdict"] == "pass"
            and isinstance(r["data"].get("seconds"), (int, float))]
    runs = f"{len(nccl)} NCCL runs passed, {min(nccl):.0f}-{max(nccl):.0f} s each" if nccl else "no NCCL run passed"
    return "\n".join(out + ["", f"The self-test {'passed' if res.get('ok') else 'FAILED'} in {res.get('seconds')} s; "
                            f"{runs}."]) + "\n"


def gpu_sweep(folder: Path) -> str:
    """Per rate and scheme: one run's mean and median iteration, bytes a rank sent per
    iteration, accuracy after the run, and the counter proof's verdict."""
    runs = sorted(runs_of(folder), key=lambda r: (Rate.parse(r.bw).bps, r.label))
    if not runs:
        raise TestbedError(f"{folder}: no runs", "archive the sweep's run directories")
    out = ["| rate | scheme | mean iteration s | median iteration s | sent per rank per iteration MB | accuracy | proof |",
           "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in runs:
        s = r.summary
        out.append(f"| {r.bw} | {r.label} | {s['mean_iter_s']:.3f} | {s['median_iter_s']:.3f} | "
                   f"{s['mean_wire_tx_bytes_per_iteration'] / 1e6:.1f} | {s['final_accuracy']:.3f} | {s.get('proof')} |")
    sizes = sorted({(x.summary.get("model"), x.summary.get("world_size"), x.summary.get("iterations"),
                     x.summary.get("backend"), x.summary.get("test_samples")) for x in runs}, key=str)
    what = "; ".join(f"{m}, {w} ranks ({b}), {i} iterations each, accuracy on {t} test images "
                     f"(one image = {100 / t:.2f} points)" for m, w, i, b, t in sizes)
    return "\n".join(out + ["", f"One run per row ({len(runs)} runs, {sum(x.status == 'ok' for x in runs)} ok): "
                            f"{what}."]) + "\n"


GENERATORS: dict[str, Callable[[Path], str]] = {"compute_time": compute_time, "gpu_selftest": gpu_selftest,
                                                "gpu_sweep": gpu_sweep}
"""This module's tables for ``benchmarks.regenerate``: name -> function(records folder) -> markdown."""
