"""docs/results/gpu.md's tables, from benchmark results archived in ``docs/results/records/``
(``--record DIR`` of the benchmark on the GPU machine, then ``benchmarks.archive``).

``compute_time``: per model, forward + backward per iteration in fp32 and in bf16 autocast
(``benchmarks.compute_time``, with and without ``--amp``): the median and min-max of one run's
timed steps, with the device and torch each result names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmarks.archive import results_of

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


GENERATORS: dict[str, Callable[[Path], str]] = {"compute_time": compute_time}
"""This module's tables for ``benchmarks.regenerate``: name -> function(records folder) -> markdown."""
