"""GPU compute profiles: forward + backward seconds per iteration of a model on a GPU, for
``--gpu-time NAME`` (``workloads.pacing``), from ``benchmarks.compute_time`` run on that GPU.

``h100``: the committed records ``docs/results/records/compute-time-h100-2026-11-28``
(compute-fp32: an NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, 20 timed steps, the median;
32x32 inputs, 10 classes, width 1, batch 32 per rank). A unit test holds this table to those
records. Any other model, width, batch or GPU: state the seconds (``--gpu-time 0.0072``),
measured with ``python -m benchmarks.compute_time`` on that GPU.
"""

from __future__ import annotations

PROFILES: dict[str, dict[tuple[str, int], float]] = {
    "h100": {("resnet18", 32): 0.007203148000002102, ("resnet152", 32): 0.059685605499993244,
             ("vgg19", 32): 0.007505298500007029, ("vit_b16", 32): 0.03578252549999661},
}
"""Per GPU: (model, batch per rank) -> median seconds of one step (width 1, 10 classes, fp32)."""
CLASSES, WIDTH = 10, 1.0


def gpu_seconds(spec: str, model: str, batch: int, width: float = 1.0, classes: int = 10) -> float:
    """The seconds ``spec`` stands for: a number of seconds, or a profile's figure for this
    model and batch. ValueError naming what is missing and how to state it instead."""
    try:
        seconds = float(spec)
    except ValueError:
        seconds = None
    if seconds is not None:
        return seconds
    table = PROFILES.get(spec.lower())
    if table is None:
        raise ValueError(f"--gpu-time {spec[:40]!r} is neither seconds nor a GPU profile; profiles: "
                         f"{', '.join(PROFILES)}")
    if (model, batch) not in table or width != WIDTH or classes != CLASSES:
        known = ", ".join(f"{m} at batch {b}" for m, b in table)
        raise ValueError(f"the {spec} profile has {known} (width 1, {CLASSES} classes), not {model} at batch {batch}"
                         f"{'' if width == WIDTH else f', width {width:g}'}"
                         f"{'' if classes == CLASSES else f', {classes} classes'}: state the seconds with "
                         "--gpu-time SECONDS (python -m benchmarks.compute_time on that GPU)")
    return table[(model, batch)]
