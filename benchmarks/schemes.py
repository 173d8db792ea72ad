"""Each scheme's payload and compression cost, for ResNet18 at the paper's batch size 32.

For every scheme, in one process (a gloo group of one, so communication itself costs
next to nothing and what remains is the scheme's own work):

* payload: bytes handed to collectives per iteration (the scheme's own count, after
  PacTrain's tracker is stable and PowerSGD has started), relative to allreduce;
* hook time: the scheme's hook run to completion on every bucket of one iteration (the
  real buckets, captured from DDP after its rebuild, with the scheme's warmed-up state),
  relative to the backward pass. Timed outside backward, one bucket after the other: in
  a real run the hooks overlap backward on the same cores, which makes a subtraction
  of backward times mostly noise. allreduce is timed as torch's ``allreduce_hook`` (what
  DDP does without a hook); its time is the world-of-one all-reduce, the floor under
  every scheme. Iterations of all schemes are interleaved and medians taken, because
  these machines are noisy;
* for PacTrain also the pack/scatter work alone (index_select + zero + index_copy_ over
  its real buckets), timed directly, relative to backward.

    python -m benchmarks.schemes [--model resnet18] [--batch-size 32] [--reps 5]

Targets (issue 3): PacTrain's pack/scatter <= 5 % of backward; payload within 1 % of
(1 - prune ratio) x dense.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from workloads import pruning, schemes
from workloads.models import build_model
from workloads.schemes.pactrain import _scatter
from workloads.train import _free_port

VARIANTS = {  # label -> (scheme, options)
    "allreduce": ("allreduce", {}),
    "fp16": ("fp16", {}),
    "topk 0.1": ("topk", {"topk_ratio": 0.1}),
    "topk 0.01": ("topk", {"topk_ratio": 0.01}),
    "powersgd r4": ("powersgd", {"powersgd_rank": 4, "powersgd_start_iter": 2}),
    "terngrad": ("terngrad", {}),
    "pactrain 0.5": ("pactrain", {}),
    "pactrain 0.5 ternary": ("pactrain", {"ternary": True}),
}


def _capturing(hook, captured):
    def run(state, bucket):
        captured[bucket.index()] = bucket  # the latest GradBucket of each index
        return hook(state, bucket)
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--prune-ratio", type=float, default=0.5)
    p.add_argument("--reps", type=int, default=5, help="measured iterations per scheme")
    p.add_argument("--warmup", type=int, default=6)
    args = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    base = build_model(args.model, 10)
    masks = pruning.compute_masks(base, args.prune_ratio, "magnitude")
    x = torch.randn(args.batch_size, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch_size,))

    runs = {}  # label -> (ddp, state, hook, captured buckets, hook seconds, payloads)
    for label, (name, opts) in VARIANTS.items():
        model = build_model(args.model, 10)
        model.load_state_dict(base.state_dict())
        if name == "pactrain":
            pruning.apply_masks(model, masks)
        ddp = DDP(model, forward_sync_buffers=False)
        captured = {}
        hooks = {}
        real_register = ddp.register_comm_hook

        def register(state, hook, _hooks=hooks, _captured=captured, _real=real_register):
            _hooks["hook"] = hook
            _real(state, _capturing(hook, _captured))
        ddp.register_comm_hook = register
        state = schemes.get(name).attach(ddp, schemes.SchemeOptions(**opts), masks)
        if not hooks:  # allreduce: DDP's built-in reduction; time the equivalent torch hook
            hooks["hook"] = default_hooks.allreduce_hook
            real_register(None, _capturing(default_hooks.allreduce_hook, captured))
            hook_state = None
        else:
            hook_state = state
        runs[label] = (ddp, state, hooks["hook"], hook_state, captured, [], [])

    backward = []
    for _ in range(args.warmup):  # PacTrain's tracker settles, PowerSGD starts, buckets rebuild
        for ddp, state, *_rest in runs.values():
            loss = nn.functional.cross_entropy(ddp(x), y)
            t0 = time.perf_counter()
            loss.backward()
            backward.append(time.perf_counter() - t0)
            ddp.zero_grad(set_to_none=False)
            payloads = _rest[-1]
            payloads.append(state.take_payload_bytes())
    backward = statistics.median(backward[-len(runs) * 2:])  # after the rebuild
    for _ in range(args.reps):
        for _ddp, state, hook, hook_state, captured, times, _ in runs.values():
            t0 = time.perf_counter()
            for b in sorted(captured):
                hook(hook_state, captured[b]).wait()
            times.append(time.perf_counter() - t0)

    dense = runs["allreduce"][-1][-1]
    floor = statistics.median(runs["allreduce"][5])
    print(f"{args.model}, batch {args.batch_size}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"backward {backward * 1000:.0f} ms (median)")
    print(f"{'scheme':<22}{'payload/allreduce':>18}{'hook/backward':>15}{'(hook-allreduce)/backward':>27}")
    for label in VARIANTS:
        times, payloads = runs[label][5], runs[label][6]
        h = statistics.median(times)
        print(f"{label:<22}{payloads[-1] / dense:>18.4f}{h / backward:>15.3f}{(h - floor) / backward:>27.3f}")
    null = backward

    # PacTrain's pack/scatter alone, on its real (rebuilt, stable) buckets
    state = runs["pactrain 0.5"][1]
    buckets = [b for b in state._buckets.values() if b.kept is not None]
    bufs = [torch.randn(len(b.mask)) for b in buckets]
    samples = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        for buf, b in zip(bufs, buckets):
            _scatter(buf, b.kept, buf.index_select(0, b.kept))
        samples.append(time.perf_counter() - t0)
    pack = statistics.median(samples)
    kept = sum(int(m.sum()) for m in masks.values()) + sum(
        q.numel() for n, q in base.named_parameters() if n not in masks)
    expected = kept / sum(q.numel() for q in base.parameters())
    measured = runs["pactrain 0.5"][6][-1] / dense
    print(f"pactrain pack/scatter: {pack * 1000:.1f} ms per iteration over {len(buckets)} buckets = "
          f"{pack / null:.3f} of backward (target <= 0.05)")
    print(f"pactrain payload/dense {measured:.4f}; (1 - prune ratio) = {1 - args.prune_ratio:.4f}, "
          f"off by {abs(measured / (1 - args.prune_ratio) - 1):.2%} (target <= 1 %; biases and "
          f"batch-norm parameters are not pruned: kept/all = {expected:.4f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
