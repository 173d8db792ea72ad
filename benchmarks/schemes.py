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

    python -m benchmarks.schemes [--model resnet18] [--batch-size 32] [--reps 5] [--ranks 4]
                                 [--device cpu|cuda] [--record DIR]

``--device cuda`` times the single-process part on the GPU (a NCCL group of one; the
times are taken after a device synchronise); the grouped part below stays on CPU (gloo).

Then the schemes that need other ranks to mean anything (SparDL's rounds, PruneX's and
hier-allreduce's leaders) in a gloo group of ``--ranks`` processes on this machine, in two
"switch" domains as testbed run places them, next to allreduce and topk in the same
group: payload per rank and what leaders send between domains, relative to allreduce's
payload, and the iteration time (forward, backward with the hooks, step; an iteration
lasts until its slowest rank is done; the median over --reps) relative to allreduce's.
All ranks share this machine's cores, so the times say what the schemes' own work costs,
not what a network would.

SparDL is run once per ``--spardl-d`` value (its d teams, the paper's latency-bandwidth
knob): payload and what crosses domains per rank, messages (latency-bound rounds) per rank
and iteration, and the iteration time, each against d.

    python -m benchmarks.schemes --ranks 4 --spardl-d 1 2 4 --grouped-only

``--spardl-buckets`` adds SparDL once per DDP bucket (as the hook runs it) against once
over the whole model's gradient (as the paper does), on the same gradients: k per block,
how much of the dense average each result holds, time and messages.

Targets (issue 3): PacTrain's pack/scatter <= 5 % of backward; payload within 1 % of
(1 - prune ratio) x dense.

``--record DIR`` writes both parts' measurements (every timed rep, the payloads, PacTrain's
pack/scatter) to DIR/result.json, which ``python -m benchmarks.archive DIR --name NAME``
archives for docs/results/training.md's tables (``benchmarks.training_tables``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from benchmarks import spardl_buckets
from benchmarks.archive import record
from workloads import compat, placement, pruning, schemes
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
    "pactrain 0.5 exact": ("pactrain", {"ternary": False}),
    "pactrain 0.5 ternary": ("pactrain", {"ternary": True}),
}


def _capturing(hook, captured):
    def run(state, bucket):
        captured[bucket.index()] = bucket  # the latest GradBucket of each index
        return hook(state, bucket)
    return run


GROUPED = {  # label -> (scheme, options): run in a group of --ranks processes
    "allreduce": ("allreduce", {}),
    "hier-allreduce": ("hier-allreduce", {}),
    "prunex 0.5": ("prunex", {"prunex_sparsity": 0.5, "prunex_prune_at": 0.0}),  # masks fixed after iteration 1
    "topk 0.01": ("topk", {"topk_ratio": 0.01}),
}


def _grouped_variants(args: argparse.Namespace) -> dict:
    out = dict(GROUPED)
    for d in args.spardl_d:
        out[f"spardl 0.01 d={d}"] = ("spardl", {"spardl_density": 0.01, "spardl_d": d})
    return out


def _grouped_rank(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    half = world // 2
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TESTBED_SWITCH_INDEX=str(rank // half),
                      TESTBED_SWITCH_RANK=str(rank % half), TESTBED_SWITCH_SIZE=str(half),
                      TESTBED_SWITCH=f"s{rank // half + 1}")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    where = placement.discover()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch_size, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.batch_size,), generator=g)
    rows, messages = {}, {}
    for label, (name, opts) in _grouped_variants(args).items():
        torch.manual_seed(0)
        ddp = compat.ddp(build_model(args.model, 10), forward_sync_buffers=False)
        state = schemes.get(name).attach(ddp, schemes.SchemeOptions(placement=where, total_iters=100, **opts), None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        times, payload = [], []
        inter0 = msg0 = 0
        for i in range(args.warmup + args.reps):
            if i == args.warmup:
                inter0, msg0 = getattr(state, "inter_payload_bytes", 0), getattr(state, "messages", 0)
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(ddp(x), y).backward()
            if hasattr(state, "before_step"):
                state.before_step()
            opt.step()
            if hasattr(state, "after_step"):
                state.after_step(opt)
            times.append(time.perf_counter() - t0)
            payload.append(state.take_payload_bytes())  # once per iteration, as the train loop does
        between = (getattr(state, "inter_payload_bytes", 0) - inter0) / args.reps
        mine = torch.tensor([statistics.fmean(payload[args.warmup:]), between, *times[args.warmup:]], dtype=torch.float64)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        reps = [max(float(t[2 + i]) for t in every) for i in range(args.reps)]  # each iteration's slowest rank
        rows[label] = (statistics.median(reps), sum(float(t[0]) for t in every) / world,
                       sum(float(t[1]) for t in every) if name in ("prunex", "hier-allreduce", "spardl") else None, reps)
        if name == "spardl":
            messages[label] = (getattr(state, "messages", 0) - msg0) / args.reps
        del ddp, state, opt
    buckets = spardl_buckets.compare(args.model, where, x, y) if args.spardl_buckets else []
    if rank == 0:
        base_t, base_p = rows["allreduce"][0], rows["allreduce"][1]
        print(f"\n{world} ranks in two domains {[list(d) for d in where.groups]}, {args.model}, batch "
              f"{args.batch_size}/rank, 1 thread per rank; allreduce iteration {base_t * 1000:.0f} ms")
        print(f"{'scheme':<22}{'payload/allreduce':>18}{'between domains/allreduce':>27}{'iter/allreduce':>16}")
        for label, (t, pay, inter, _) in rows.items():
            between = "-" if inter is None else f"{inter / base_p:.4f}"
            print(f"{label:<22}{pay / base_p:>18.4f}{between:>27}{t / base_t:>16.3f}")
        print("(between domains: bytes all leaders hand to the leaders' all-reduce per iteration, for SparDL "
              "the bytes all ranks send to other domains; a flat all-reduce's share depends on gloo's "
              "algorithm, so it is measured on the wire by `testbed run`, not here)")
        for label, n in messages.items():
            t, pay, inter, _ = rows[label]
            print(f"{label}: {pay / 1e3:.1f} kB sent per rank and iteration, {inter / 1e3:.1f} kB between domains "
                  f"(all ranks), {n:.0f} messages per rank (rank 0), iteration {t * 1000:.0f} ms")
        if args.rows_file:  # for --record, read back by the parent
            Path(args.rows_file).write_text(json.dumps([
                {"part": "grouped", "scheme": label, "ranks": world, "payload_bytes": pay, "between_bytes": inter,
                 "messages": messages.get(label), "iter_s": reps} for label, (_, pay, inter, reps) in rows.items()]
                + buckets))
    dist.barrier()
    dist.destroy_process_group()


def grouped(args: argparse.Namespace) -> list[dict]:
    """The grouped part's rows (for --record; empty without it)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        args.rows_file = str(Path(tmp) / "rows.json") if args.record else None
        mp.spawn(_grouped_rank, args=(args.ranks, _free_port(), args), nprocs=args.ranks, join=True)
        return json.loads(Path(args.rows_file).read_text()) if args.rows_file else []


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--prune-ratio", type=float, default=0.5)
    p.add_argument("--reps", type=int, default=5, help="measured iterations per scheme")
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--ranks", type=int, default=4, help="group size for spardl/prunex/hier-allreduce (even; 0: skip)")
    p.add_argument("--spardl-d", type=int, nargs="*", default=[1, 2],
                   help="SparDL's number of teams d, one grouped run each (each must divide --ranks)")
    p.add_argument("--grouped-only", action="store_true", help="skip the single-process part")
    p.add_argument("--spardl-buckets", action="store_true",
                   help="also SparDL per DDP bucket vs over the whole model, on the same gradients")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the single-process part runs (cuda: a NCCL group of one)")
    p.add_argument("--record", type=Path, metavar="DIR", help="write every measurement to DIR/result.json")
    args = p.parse_args()
    if args.ranks and (args.ranks < 2 or args.ranks % 2):
        p.error("--ranks must be an even number >= 2, or 0")
    if args.device == "cuda" and not args.grouped_only and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU")
    return args


def _group_of_one(device: str) -> torch.device:
    """A process group of this process alone (NCCL on the GPU, gloo on the CPU); its device."""
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    else:
        dist.init_process_group("gloo", rank=0, world_size=1)
    return dev


def _attach_all(args: argparse.Namespace, dev: torch.device, base: nn.Module, masks: dict) -> dict:
    """label -> [ddp, state, hook, hook's state, captured buckets, hook seconds, payloads],
    every variant on its own copy of ``base``."""
    runs = {}
    for label, (name, opts) in VARIANTS.items():
        model = build_model(args.model, 10).to(dev)
        model.load_state_dict(base.state_dict())
        if name == "pactrain":
            pruning.apply_masks(model, masks)
        ddp = compat.ddp(model, device_ids=[dev] if dev.type == "cuda" else None, forward_sync_buffers=False)
        captured = {}
        hooks = {}
        real_register = ddp.register_comm_hook

        def register(state, hook, _hooks=hooks, _captured=captured, _real=real_register):
            _hooks["hook"] = hook
            _real(state, _capturing(hook, _captured))
        ddp.register_comm_hook = register
        state = schemes.get(name).attach(ddp, schemes.SchemeOptions(device=str(dev), **opts), masks)
        if not hooks:  # allreduce: DDP's built-in reduction; time the equivalent torch hook
            hooks["hook"] = default_hooks.allreduce_hook
            real_register(None, _capturing(default_hooks.allreduce_hook, captured))
            hook_state = None
        else:
            hook_state = state
        runs[label] = (ddp, state, hooks["hook"], hook_state, captured, [], [])
    return runs


def _timed(sync, fn) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def _warm_and_time(args: argparse.Namespace, runs: dict, x, y, sync) -> list[float]:
    """Warm every variant up (PacTrain's tracker settles, PowerSGD starts, buckets rebuild),
    recording payloads and backward times, then time each hook over its captured buckets;
    the backward times after the rebuild (the last two of each variant)."""
    backward = []
    for _ in range(args.warmup):
        for ddp, state, *_rest in runs.values():
            loss = nn.functional.cross_entropy(ddp(x), y)
            backward.append(_timed(sync, loss.backward))
            ddp.zero_grad(set_to_none=False)
            _rest[-1].append(state.take_payload_bytes())
    for _ in range(args.reps):
        for _ddp, _state, hook, hook_state, captured, times, _ in runs.values():
            times.append(_timed(sync, lambda hook=hook, hs=hook_state, c=captured:
                                [hook(hs, c[b]).wait() for b in sorted(c)]))
    return backward[-len(runs) * 2:]


def _pack_scatter(args: argparse.Namespace, runs: dict, base: nn.Module, masks: dict, backward: float,
                  dev: torch.device, sync) -> dict:
    """PacTrain's pack/scatter alone, on its real (rebuilt, stable) buckets, and its payload
    against (1 - prune ratio) x dense; the times and the kept fraction, for --record."""
    state = runs["pactrain 0.5 exact"][1]
    buckets = [b for b in state._buckets.values() if b.kept is not None]
    bufs = [torch.randn(b.size, device=dev) for b in buckets]

    def pack():
        for buf, b in zip(bufs, buckets):
            _scatter(buf, b.kept, buf.index_select(0, b.kept))
    pack_s = [_timed(sync, pack) for _ in range(args.reps)]
    took = statistics.median(pack_s)
    kept = sum(int(m.sum()) for m in masks.values()) + sum(
        q.numel() for n, q in base.named_parameters() if n not in masks)
    expected = kept / sum(q.numel() for q in base.parameters())
    measured = runs["pactrain 0.5 exact"][6][-1] / runs["allreduce"][-1][-1]
    print(f"pactrain pack/scatter: {took * 1000:.1f} ms per iteration over {len(buckets)} buckets = "
          f"{took / backward:.3f} of backward (target <= 0.05)")
    print(f"pactrain payload/dense {measured:.4f}; (1 - prune ratio) = {1 - args.prune_ratio:.4f}, "
          f"off by {abs(measured / (1 - args.prune_ratio) - 1):.2%} (target <= 1 %; biases and "
          f"batch-norm parameters are not pruned: kept/all = {expected:.4f})")
    return {"pack_s": pack_s, "buckets": len(buckets), "kept_fraction": expected}


def main() -> None:
    args = _parse()
    extra = {"model": args.model, "batch_size": args.batch_size, "reps": args.reps, "warmup": args.warmup,
             "load_before": os.getloadavg()[0]}
    if args.grouped_only:
        if args.ranks and (rows := grouped(args)):
            print("recorded:", record(args.record, "schemes", rows, **extra, load_after=os.getloadavg()[0]))
        return
    dev = _group_of_one(args.device)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    torch.manual_seed(0)
    base = build_model(args.model, 10).to(dev)
    masks = pruning.compute_masks(base, args.prune_ratio, "magnitude")
    x = torch.randn(args.batch_size, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch_size,), device=dev)
    runs = _attach_all(args, dev, base, masks)
    backwards = _warm_and_time(args, runs, x, y, sync)
    backward = statistics.median(backwards)

    dense = runs["allreduce"][-1][-1]
    floor = statistics.median(runs["allreduce"][5])
    where = torch.cuda.get_device_name(dev) if cuda else f"{torch.get_num_threads()} threads"
    print(f"{args.model}, batch {args.batch_size}, torch {torch.__version__}, {where}; "
          f"backward {backward * 1000:.0f} ms (median)")
    print(f"{'scheme':<22}{'payload/allreduce':>18}{'hook/backward':>15}{'(hook-allreduce)/backward':>27}")
    for label in VARIANTS:
        times, payloads = runs[label][5], runs[label][6]
        h = statistics.median(times)
        print(f"{label:<22}{payloads[-1] / dense:>18.4f}{h / backward:>15.3f}{(h - floor) / backward:>27.3f}")
    pack = _pack_scatter(args, runs, base, masks, backward, dev, sync)
    dist.destroy_process_group()
    rows = [{"part": "one process", "scheme": label, "payload_bytes": runs[label][6][-1], "hook_s": runs[label][5]}
            for label in VARIANTS]
    rows += grouped(args) if args.ranks else []
    if args.record:
        print("recorded:", record(args.record, "schemes", rows, **extra, load_after=os.getloadavg()[0], device=where,
                                  torch=torch.__version__, prune_ratio=args.prune_ratio, backward_s=backwards, **pack))


if __name__ == "__main__":
    main()
