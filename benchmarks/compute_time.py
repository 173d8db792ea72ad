"""Forward + backward seconds per iteration of the paper's models, measured on this machine's
device: the figure ``--compute-time`` (paper-scale mode) asks for.

    python -m benchmarks.compute_time [--models resnet18,resnet152,vgg19,vit_b16]
                                      [--batch-size 32] [--classes 10] [--iters 20]
                                      [--device auto|cuda|cpu] [--amp] [--json] [--record DIR]

For each model, built as training builds it (32x32 inputs, ``workloads.models``), one
training step is timed: zero_grad, forward, cross-entropy, backward (no optimiser step, no
communication: those are what a run measures itself). Three warm-up steps first (cuDNN
autotuning, allocator), then ``--iters`` timed steps, each ended by a device synchronise;
the median and min-max are printed, with the line to paste into
``benchmarks.paper_scale --compute-time``. ``--amp`` runs the forward pass in bf16
autocast (CUDA only).

Run it on the GPU your experiments stand in for; one run's figures, because machines are
noisy: repeat and compare before publishing. ``--record DIR`` writes the rows, the device and
torch's version to DIR/result.json for ``benchmarks.archive`` (docs/results/gpu.md's table,
``benchmarks.gpu_tables``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.archive import record
from workloads.models import MODELS, build_model


def time_model(name: str, device: torch.device, batch: int, classes: int, iters: int, amp: bool) -> dict:
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = build_model(name, classes).to(device).train()
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, classes, (batch,), device=device)
    params = sum(p.numel() for p in model.parameters())

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):
        step()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"model": name, "params": params, "gradient_bytes": 4 * params, "batch": batch,
            "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "peak_gpu_bytes": peak}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(m for m in MODELS if m != "cnn"))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--amp", action="store_true", help="bf16 autocast forward (CUDA)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--record", type=Path, metavar="DIR", help="write the rows to DIR/result.json")
    a = p.parse_args(argv)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise SystemExit(f"--models: unknown {', '.join(bad)}; choose from {', '.join(MODELS)}")
    if a.batch_size < 1 or a.iters < 1:
        raise SystemExit("--batch-size and --iters must be >= 1")
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    if kind == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU")
    device = torch.device(kind)
    if kind == "cuda":
        torch.backends.cudnn.benchmark = True
    where = torch.cuda.get_device_name(device) if kind == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    rows = [time_model(m, device, a.batch_size, a.classes, a.iters, a.amp) for m in models]
    if a.record:
        print(f"recorded: {record(a.record, 'compute_time', [dict(r, amp=a.amp) for r in rows], device=where, torch=torch.__version__, iters=a.iters)}")
    if a.json:
        print(json.dumps({"device": where, "torch": torch.__version__, "amp": a.amp, "rows": rows}, indent=2))
        return 0
    print(f"{where}, torch {torch.__version__}, batch {a.batch_size}, 32x32, "
          f"{'bf16 autocast' if a.amp else 'fp32'}, {a.iters} timed steps")
    print(f"{'model':<10} {'params':>12} {'fwd+bwd s (median)':>19} {'min-max':>17} {'peak GPU MB':>12}")
    for r in rows:
        peak = f"{r['peak_gpu_bytes'] / 2**20:.0f}" if r["peak_gpu_bytes"] is not None else "-"
        print(f"{r['model']:<10} {r['params']:>12,} {r['median_s']:>19.4f} "
              f"{r['min_s']:>8.4f}-{r['max_s']:<8.4f} {peak:>12}")
    print("--compute-time " + ",".join(f"{r['model']}={r['median_s']:.4f}" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
