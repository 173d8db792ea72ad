"""Distributed data-parallel training with a choice of gradient-communication scheme.

    torchrun --nproc-per-node 2 -m workloads.train --scheme pactrain --dataset digits --out runs/x

Reads top to bottom: arguments -> process group -> data -> model (+ checkpoint, pruning)
-> DDP + scheme hook -> epochs (iterations, evaluations, records) -> summary -> teardown.
Rank, world size and the rendezvous come from torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT); without them it runs as a single process.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from workloads import compat, data, placement, pruning, records, schemes
from workloads.checkpoint import CheckpointError, load_into
from workloads.models import MODELS, build_model


class _Parser(argparse.ArgumentParser):
    raise_errors = False

    def error(self, message):
        if self.raise_errors:
            raise ValueError(message)
        super().error(message)


def parse_args(argv=None, raise_errors: bool = False) -> argparse.Namespace:
    p = _Parser(prog="python -m workloads.train", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.raise_errors = raise_errors
    p.add_argument("--scheme", default="allreduce",
                   help=f"one of: {', '.join(schemes.SCHEMES)}; or {schemes.VARIANT_HELP}")
    p.add_argument("--model", default="cnn", help=f"one of: {', '.join(MODELS)}")
    p.add_argument("--width", type=float, default=1.0, help="channel/embedding multiplier")
    p.add_argument("--depth", type=int, default=None, help="cap on blocks/convs/layers per stage")
    p.add_argument("--dataset", default="digits", help=f"one of: {', '.join(data.DATASETS)}")
    p.add_argument("--data-dir", default=None, help="directory holding the CIFAR python-pickle folders")
    p.add_argument("--epochs", type=float, default=3, help="epochs to train (fractions allowed)")
    p.add_argument("--max-iters", type=int, default=None, help="stop after this many iterations")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--lr-schedule", choices=["const", "cosine"], default="const")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=0, help="iterations between evaluations (0: each epoch)")
    p.add_argument("--target-acc", type=float, default=None, help="accuracy for time-to-accuracy (0-1)")
    p.add_argument("--stop-at-target", action="store_true", help="stop once --target-acc is reached")
    p.add_argument("--init", default=None, help="checkpoint from python -m workloads.pretrain")
    p.add_argument("--prune-ratio", type=float, default=0.5, help="pactrain: fraction of conv/linear weights removed")
    p.add_argument("--prune-method", default="magnitude", help=f"pactrain: one of {', '.join(pruning.METHODS)}")
    p.add_argument("--grasp-batches", type=int, default=2, help="pactrain + grasp: batches scored")
    p.add_argument("--ternary", action="store_true", help="pactrain: ternary-quantise the compact tensor")
    p.add_argument("--stable-iters", type=int, default=3, help="pactrain: K iterations of an unchanged mask")
    p.add_argument("--topk-ratio", type=float, default=0.01, help="topk: fraction of elements sent")
    p.add_argument("--terngrad-clip", type=float, default=2.5, help="terngrad: clip to N std deviations (0: off)")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--powersgd-start-iter", type=int, default=10)
    p.add_argument("--spardl-density", type=float, default=0.01,
                   help="spardl: fraction of each block's entries sent (the paper's experiments: 0.01)")
    p.add_argument("--spardl-teams", default="auto",
                   help="spardl: 1 (one team, as the published code), switch (a team per switch) or auto")
    p.add_argument("--prunex-sparsity", type=float, default=0.5, help="prunex: fraction of output channels removed")
    p.add_argument("--prunex-rho", type=float, default=0.1, help="prunex: ADMM penalty weight")
    p.add_argument("--prunex-admm-every", type=int, default=10, help="prunex: iterations between Z/U updates")
    p.add_argument("--prunex-prune-at", type=float, default=0.3,
                   help="prunex: fraction of the run after which channel masks are fixed")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size")
    p.add_argument("--compute-time", type=float, default=None,
                   help="paper-scale traffic: replace forward and backward by this many seconds per iteration "
                        "(e.g. measured on your GPU); the real model's parameters, DDP buckets, hooks and "
                        "collectives, synthetic gradients; no accuracy. Needs --max-iters")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl when CUDA is available, else gloo")
    p.add_argument("--iface", default=None,
                   help="interface whose tx/rx counters are recorded (default: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per rank")
    p.add_argument("--out", default=None, help="run directory for records (none: no records)")
    p.add_argument("--log-every", type=int, default=10, help="print a line every N iterations (rank 0)")
    args = p.parse_args(argv)
    _expand_variant(p, args, sys.argv[1:] if argv is None else list(argv))
    if args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    if args.epochs <= 0:
        p.error("--epochs must be > 0")
    if args.target_acc is not None and not 0 < args.target_acc <= 1:
        p.error(f"--target-acc is a fraction in (0, 1], got {args.target_acc} (90%% is 0.9)")
    return args


def _expand_variant(p: argparse.ArgumentParser, args: argparse.Namespace, given: list[str]) -> None:
    """``--scheme topk:0.1`` -> scheme topk with --topk-ratio 0.1; ``args.variant`` keeps the spec."""
    args.variant = args.scheme
    if ":" not in args.scheme:
        return
    try:
        scheme, values = schemes.parse_variant(args.scheme)
    except ValueError as e:
        p.error(str(e))
    extra = []
    for key, val in values.items():
        flag = "--" + key.replace("_", "-")
        if any(a == flag or a.startswith(flag + "=") for a in given):
            p.error(f"{flag} is given twice, by the scheme variant {args.scheme!r} and on its own; keep one")
        if key == "ternary":
            if val.lower() not in ("true", "yes", "1", "on"):
                p.error(f"scheme variant {args.scheme!r}: ternary takes no value (write pactrain:0.5:ternary)")
            extra.append(flag)
        else:
            extra += [flag, val]
    p.parse_args(extra, namespace=args)
    args.scheme = scheme.name


TRAIN_PARAMS = ("model", "dataset", "width", "depth", "batch_size", "lr", "momentum", "weight_decay", "lr_schedule",
                "epochs", "max_iters", "bucket_cap_mb")
"""Arguments besides a scheme's own that change a run's results (the summary's ``hyper``)."""


def hyper_params(args: argparse.Namespace, scheme, pretrain_dataset: str | None = None) -> dict:
    """Every hyper-parameter that changes this run's results: report never averages runs
    whose ``hyper`` differ. The seed is left out (repeats differ in it on purpose)."""
    d = {k: getattr(args, k) for k in TRAIN_PARAMS}
    d.update({k: getattr(args, k) for k in scheme.params})
    if scheme.name == "pactrain" and not args.ternary:
        d.pop("terngrad_clip")
    d["init"] = Path(args.init).name if args.init else None
    d["pretrain_dataset"] = pretrain_dataset
    return d


# ---------------------------------------------------------------- process group
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str) -> tuple[int, int, torch.device, str]:
    """Join the process group described by torchrun's environment (or a group of one)."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("--backend nccl needs a CUDA GPU, and torch sees none; use --backend gloo")
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return rank, world, device, backend


def set_determinism(seed: int, threads: int | None, deterministic: bool = True) -> None:
    """Seed, and (``deterministic``) make the compute deterministic. A synthetic run has no
    compute to make deterministic and leaves it off: ``use_deterministic_algorithms`` costs
    about a second of CPU per rank to import, and fills every new tensor (DDP's buckets of
    hundreds of MB included) with NaN."""
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    if threads:
        torch.set_num_threads(threads)
    elif "OMP_NUM_THREADS" not in os.environ:  # share the cores among this host's ranks
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def _max_rss_bytes() -> float:
    """This process's peak resident memory (Linux reports kilobytes)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


class _SyntheticGrad(torch.autograd.Function):
    """Backward of one parameter's term: wait its share of the stated backward time, then
    hand over the synthetic gradient (DDP's hooks see it as they would a real one)."""

    @staticmethod
    def forward(ctx, p, grad, delay):
        ctx.grad, ctx.delay = grad, delay
        return p.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        if ctx.delay > 0:
            time.sleep(ctx.delay)
        return ctx.grad, None, None


class SyntheticCompute(nn.Module):
    """Paper-scale traffic without the compute: wraps the real model (its parameters, hence
    DDP's buckets, are real) and replaces forward and backward by a stated time.

    Forward sleeps a third of ``seconds``; backward spends the other two thirds, spread over
    the parameters in proportion to their size, and makes the gradients ready one parameter
    at a time in reverse order, as a real backward pass does, so DDP launches each bucket's
    collective while later "compute" is still under way. Gradients are seeded random values
    (different per rank), views of one pool the size of the largest parameter. Sleeping is
    what a GPU's compute looks like to the CPU: the communication threads run meanwhile.
    """

    def __init__(self, model: nn.Module, seconds: float, seed: int):
        super().__init__()
        self.model = model
        self.seconds = seconds
        params = [p for p in model.parameters() if p.requires_grad]
        total = sum(p.numel() for p in params)
        pool = torch.randn(max(p.numel() for p in params), generator=torch.Generator().manual_seed(seed)) * 1e-2
        self._grads = [pool[:p.numel()].view_as(p).to(p.device) for p in params]
        self._delays = [2 * seconds / 3 * p.numel() / total for p in params]
        self._params = params

    def forward(self) -> torch.Tensor:
        if self.seconds > 0:
            time.sleep(self.seconds / 3)
        # terms made in parameter order: autograd runs the later ones first (reverse order)
        return torch.stack([_SyntheticGrad.apply(p, g, d) for p, g, d in
                            zip(self._params, self._grads, self._delays)]).sum()


class DDPTimes:
    """This iteration's forward/backward compute and communication seconds, from DDP's own
    runtime timers (they see every bucket's collective, with or without a hook)."""

    def __init__(self, ddp: DDP):
        self._ddp = ddp
        try:
            ddp._set_ddp_runtime_logging_sample_rate(1)  # time every iteration
            self._ok = True
        except (AttributeError, RuntimeError):  # private API moved: record nulls
            self._ok = False

    def read(self) -> tuple[float | None, float | None, float | None]:
        if not self._ok:
            return None, None, None
        self._ddp.logger.set_runtime_stats_and_log()
        d = self._ddp._get_ddp_logging_data()
        ns = 1e-9
        compute = (d.get("forward_compute_time", 0) + d.get("backward_compute_time", 0)) * ns
        return compute, d.get("backward_comm_time", 0) * ns, d.get("backward_compute_comm_overlap_time", 0) * ns


# ---------------------------------------------------------------- evaluation
@torch.no_grad()
def sync_buffers(model: nn.Module, world: int) -> None:
    """Average BN running statistics over ranks (buffers are not broadcast every iteration,
    so that all per-iteration traffic is the scheme's own)."""
    for b in model.buffers():
        if b.is_floating_point():
            dist.all_reduce(b)
            b.div_(world)


@torch.no_grad()
def evaluate(model: nn.Module, ds: data.Dataset, rank: int, world: int, device, batch_size: int = 256):
    """Top-1 accuracy and mean loss over the whole test set; each rank scores its slice."""
    model.eval()
    idx = torch.arange(rank, len(ds.y_test), world)
    stats = torch.zeros(3, dtype=torch.float64, device=device)  # correct, count, loss sum
    for s in range(0, len(idx), batch_size):
        b = idx[s:s + batch_size]
        x, y = ds.x_test[b].to(device), ds.y_test[b].to(device)
        out = model(x)
        stats[0] += (out.argmax(1) == y).sum()
        stats[1] += len(b)
        stats[2] += nn.functional.cross_entropy(out, y, reduction="sum")
    dist.all_reduce(stats)
    model.train()
    return float(stats[0] / stats[1]), float(stats[2] / stats[1])


# ---------------------------------------------------------------- main
def _prepare(args):
    """Validate what can be checked before joining the group; (scheme, dataset)."""
    scheme = schemes.get(args.scheme)
    if args.init and not Path(args.init).is_file():
        raise ValueError(f"--init {args.init}: no such file (make one with python -m workloads.pretrain)")
    if scheme.prunes:
        if not 0 <= args.prune_ratio < 1:
            raise ValueError(f"--prune-ratio must be in [0, 1), got {args.prune_ratio}")
        if args.prune_method not in pruning.METHODS:
            raise ValueError(f"unknown --prune-method {args.prune_method!r}; choose one of: {', '.join(pruning.METHODS)}")
    if not 0 < args.topk_ratio <= 1:
        raise ValueError(f"--topk-ratio must be in (0, 1], got {args.topk_ratio}")
    if args.powersgd_start_iter < 2:
        raise ValueError(f"--powersgd-start-iter must be >= 2, got {args.powersgd_start_iter}")
    if not 0 < args.spardl_density <= 1:
        raise ValueError(f"--spardl-density must be in (0, 1], got {args.spardl_density}")
    if args.spardl_teams not in ("1", "switch", "auto"):
        raise ValueError(f"--spardl-teams must be 1, switch or auto, got {args.spardl_teams!r}")
    if not 0 <= args.prunex_sparsity < 1:
        raise ValueError(f"--prunex-sparsity must be in [0, 1), got {args.prunex_sparsity}")
    if not (math.isfinite(args.prunex_rho) and args.prunex_rho >= 0):
        raise ValueError(f"--prunex-rho must be a number >= 0, got {args.prunex_rho}")
    if args.prunex_admm_every < 1:
        raise ValueError(f"--prunex-admm-every must be >= 1, got {args.prunex_admm_every}")
    if not 0 <= args.prunex_prune_at <= 1:
        raise ValueError(f"--prunex-prune-at is a fraction of the run in [0, 1], got {args.prunex_prune_at}")
    if args.compute_time is not None:
        if not (math.isfinite(args.compute_time) and 0 <= args.compute_time <= 3600):
            raise ValueError(f"--compute-time is seconds per iteration in [0, 3600], got {args.compute_time}")
        if not args.max_iters:
            raise ValueError("--compute-time needs --max-iters (there are no epochs without data)")
        for flag, given in (("--init", args.init), ("--target-acc", args.target_acc is not None),
                            ("--prune-method grasp", args.prune_method == "grasp" and scheme.prunes)):
            if given:
                raise ValueError(f"--compute-time measures traffic, not accuracy: {flag} does not apply")
    return scheme, data.load(args.dataset, args.data_dir)


def check(argv) -> argparse.Namespace:
    """Validate a command line without training (raises ValueError saying what to fix).

    For launchers (``testbed run``) that must refuse bad input before building anything.
    """
    args = parse_args(argv, raise_errors=True)
    _, ds = _prepare(args)
    model = build_model(args.model, ds.num_classes, 3, args.width, args.depth)
    if args.init:
        load_into(model, args.init, args.model)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        scheme, ds = _prepare(args)
    except ValueError as e:  # DatasetError is one
        print(f"error: {e}", file=sys.stderr)
        return 2
    set_determinism(args.seed, args.threads, deterministic=args.compute_time is None)
    rank, world, device, backend = init_distributed(args.backend)
    try:
        return train(args, scheme, ds, rank, world, device, backend)
    except (ValueError, CheckpointError) as e:
        print(f"error (rank {rank}): {e}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()


def train(args, scheme, ds, rank, world, device, backend) -> int:
    out = Path(args.out) if args.out else None
    iface = records.iface_from_env(args.iface)
    counters = records.IfaceCounters(iface) if iface else None
    if out:
        out.mkdir(parents=True, exist_ok=True)

    # model: same initial weights everywhere (seeded; DDP also broadcasts rank 0's)
    model = build_model(args.model, ds.num_classes, 3, args.width, args.depth)
    pretrained = None  # from scratch
    if args.init:
        pretrained = {}
        for note in load_into(model, args.init, args.model, pretrained):
            if rank == 0:
                print(f"init: {note}")
        pretrained["checkpoint"] = str(args.init)
    model.to(device)

    synthetic = SyntheticCompute(model, args.compute_time, args.seed * 1000 + rank) \
        if args.compute_time is not None else None
    masks = None
    if scheme.prunes:
        gen = torch.Generator().manual_seed(args.seed)
        grasp = [(x.to(device), y.to(device)) for _, (x, y) in
                 zip(range(args.grasp_batches), data.batches(ds, 0, 1, 0, args.seed, args.batch_size, gen))]
        # a synthetic run's ranks hold the same seeded weights and score them alike (magnitude
        # only): no broadcast of the mask, which would put one byte per weight through the
        # emulated links before the first iteration (ViT-B/16: 4 x 86 MB over an uplink, an
        # estimated 27 s at 100 Mbit). PacTrain's own agreement check still compares every
        # bucket's mask.
        masks = pruning.compute_masks(model, args.prune_ratio, args.prune_method, grasp,
                                      broadcast=synthetic is None)
        pruning.apply_masks(model, masks)
        if rank == 0:
            kept = sum(int(m.sum()) for m in masks.values())
            total = sum(m.numel() for m in masks.values())
            print(f"pruned {total - kept}/{total} conv/linear weights ({args.prune_method})")

    per_epoch = data.iterations_per_epoch(ds, world, args.batch_size)
    if per_epoch == 0:
        raise ValueError(f"--batch-size {args.batch_size} x {world} ranks exceeds the "
                         f"{len(ds.y_train)} training samples; use a smaller batch")
    total = math.ceil(args.epochs * per_epoch)
    if args.max_iters:
        total = min(total, args.max_iters)
    if synthetic:
        total, per_epoch = args.max_iters, args.max_iters
        if masks is not None:  # the DDP module is the wrapper: its names carry a prefix
            masks = {f"model.{k}": v for k, v in masks.items()}
    where = placement.discover()
    # every rank seeded the same initial weights: a synthetic run skips DDP's broadcast of
    # them (hundreds of MB through the emulated links before the first iteration)
    # A synthetic run's gradients arrive in exactly reverse order, so it can bucket from the
    # first iteration (DDP's default first iteration is one bucket of the whole model: a
    # transient copy of everything per rank, which 8 ranks of ViT-B/16 cannot afford here)
    # and take gradients as views of the buckets (one copy less)
    ddp = compat.ddp(synthetic or model, device_ids=[device] if device.type == "cuda" else None,
              bucket_cap_mb=args.bucket_cap_mb, forward_sync_buffers=False,
              **({} if synthetic is None else
                 {"init_sync": False, "gradient_as_bucket_view": True, "bucket_cap_mb_list": [args.bucket_cap_mb]}))
    opts = schemes.SchemeOptions(device=str(device), seed=args.seed, topk_ratio=args.topk_ratio,
                                 powersgd_rank=args.powersgd_rank, powersgd_start_iter=args.powersgd_start_iter,
                                 terngrad_clip=args.terngrad_clip, ternary=args.ternary, stable_iters=args.stable_iters,
                                 placement=where, total_iters=total, spardl_density=args.spardl_density,
                                 spardl_teams=args.spardl_teams, prunex_sparsity=args.prunex_sparsity,
                                 prunex_rho=args.prunex_rho, prunex_admm_every=args.prunex_admm_every,
                                 prunex_prune_at=args.prunex_prune_at)
    state = scheme.attach(ddp, opts, masks)
    before_step = getattr(state, "before_step", None)
    after_step = getattr(state, "after_step", None)
    timers = DDPTimes(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, total) if args.lr_schedule == "cosine" else None)
    eval_every = args.eval_every or per_epoch
    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)

    if rank == 0:
        print(f"{scheme.name}: {args.model} on {ds.name}, {world} ranks ({backend}), {total} iterations "
              f"of batch {args.batch_size}/rank, {per_epoch} per epoch; records in {out or '(none)'}")
        if out:
            records.write_json(out / "config.json", {
                "args": vars(args), "world_size": world, "backend": backend, "iterations": total,
                "iterations_per_epoch": per_epoch, "dense_bytes": dense_bytes,
                "torch": torch.__version__, "device": str(device), "placement": where.to_dict(),
                "compute_time_s": args.compute_time, "accuracy_measured": synthetic is None,
                "fields": {"iteration": records.ITER_FIELDS, "eval": records.EVAL_FIELDS}})
    it_log = records.JsonlWriter(out / f"rank{rank}.jsonl") if out else None
    ev_log = records.JsonlWriter(out / "eval.jsonl") if out and rank == 0 and synthetic is None else None

    aug = torch.Generator().manual_seed(args.seed * 1000 + rank)
    iter_s, payloads = [], []
    acc = None
    tta = None
    it = 0
    train_s = 0.0
    start = time.time()
    done = False
    epoch = 0
    while not done:
        batches = (data.batches(ds, rank, world, epoch, args.seed, args.batch_size, aug) if synthetic is None
                   else ((None, None) for _ in range(total)))
        for x, y in batches:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            if synthetic is None:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = nn.functional.cross_entropy(ddp(x), y)
            else:
                loss = ddp()  # sleeps the stated forward time; backward: the stated rest
            loss.backward()  # DDP's hooks communicate; returns when all buckets are reduced
            if before_step:
                before_step()
            if synthetic is None:  # (a synthetic run's optimizer step is part of the stated time)
                opt.step()
            if after_step:
                after_step(opt)
            if sched:
                sched.step()
            loss_v = loss.item()  # synchronises the device
            dt = time.perf_counter() - t0
            it += 1
            train_s += dt
            compute_s, comm_s, overlap_s = timers.read()
            payload = state.take_payload_bytes()
            iter_s.append(dt)
            payloads.append(payload)
            if synthetic is not None:
                loss_v = None  # no loss without a forward pass
            elif not math.isfinite(loss_v):
                raise ValueError(f"loss is {loss_v} at iteration {it}; lower --lr")
            if it_log:
                tx, rx = counters.read() if counters else (None, None)
                it_log.write({"rank": rank, "iter": it, "epoch": epoch, "time": time.time(), "iter_s": dt,
                              "compute_s": compute_s, "comm_s": comm_s, "overlap_s": overlap_s, "loss": loss_v,
                              "payload_bytes": payload, "tx_bytes": tx, "rx_bytes": rx})
            if rank == 0 and args.log_every and it % args.log_every == 0:
                print(f"epoch {epoch} iter {it}/{total} loss {loss_v if loss_v is None else round(loss_v, 4)} "
                      f"{dt * 1000:.0f} ms "
                      f"payload {payload} B", flush=True)
            if synthetic is None and (it % eval_every == 0 or it == total):
                sync_buffers(model, world)
                acc, test_loss = evaluate(model, ds, rank, world, device)
                if args.target_acc is not None and tta is None and acc >= args.target_acc:
                    tta = train_s
                if rank == 0:
                    print(f"eval: iteration {it} accuracy {acc:.4f} loss {test_loss:.4f}", flush=True)
                    if ev_log:
                        ev_log.write({"iter": it, "epoch": epoch, "time": time.time(), "train_s": train_s,
                                      "accuracy": acc, "loss": test_loss})
                if tta is not None and args.stop_at_target:
                    done = True
            if it >= total or done:
                done = True
                break
            if synthetic is not None and it == 1:
                # DDP rebuilds its buckets once, at the start of the second iteration; a
                # synthetic run times single iterations, so it does that here, off the clock
                compat.rebuild_buckets_now(ddp)
        epoch += 1

    # mean payload over all ranks and iterations, and of the last iteration
    pay = torch.tensor([sum(payloads), len(payloads), payloads[-1]], dtype=torch.float64, device=device)
    dist.all_reduce(pay)
    rss = torch.tensor([_max_rss_bytes()], dtype=torch.float64, device=device)
    rss_sum = rss.clone()
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    dist.all_reduce(rss_sum)
    if rank == 0 and out:
        records.write_json(out / "summary.json", {
            "scheme": scheme.name, "variant": args.variant,
            "hyper": hyper_params(args, scheme, (pretrained or {}).get("dataset")),
            "seed": args.seed, "model": args.model, "dataset": ds.name, "world_size": world,
            "backend": backend, "iterations": it, "epochs": round(it / per_epoch, 4),
            "wall_s": time.time() - start, "train_s": train_s, "final_accuracy": acc,
            "target_accuracy": args.target_acc, "time_to_target_s": tta,
            "mean_iter_s": statistics.fmean(iter_s), "median_iter_s": statistics.median(iter_s),
            "mean_payload_bytes": float(pay[0] / pay[1]), "final_payload_bytes": float(pay[2] / world),
            "dense_bytes": dense_bytes, "prune_ratio": args.prune_ratio if scheme.prunes else None,
            "ternary": args.ternary if scheme.name == "pactrain" else None,
            "topk_ratio": args.topk_ratio if scheme.name == "topk" else None,
            "spardl_density": args.spardl_density if scheme.name == "spardl" else None,
            "prunex_sparsity": args.prunex_sparsity if scheme.name == "prunex" else None,
            "kept_fraction": state.kept_fraction() if hasattr(state, "kept_fraction") else None,
            "init": pretrained, "from_scratch": pretrained is None,
            "compute_time_s": args.compute_time, "accuracy_measured": synthetic is None,
            "max_rss_bytes_per_rank": float(rss[0]), "max_rss_bytes_all_ranks": float(rss_sum[0]),
            "placement": where.to_dict()})
    for log in (it_log, ev_log):
        if log:
            log.close()
    # DDP holds gloo work in reference cycles: free it while the group exists, on all ranks
    del ddp, state
    gc.collect()
    dist.barrier()
    return 0


def _exit(code: int) -> None:
    """Leave without the interpreter's teardown: the records are closed and the group is
    destroyed, and tearing down torch's modules and freeing every tensor one by one takes
    about a second of CPU per rank (seconds per run when 8 ranks share 2 cores)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
