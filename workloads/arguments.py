"""The command line of ``python -m workloads.train``: flags, variant specs, validation, and
the hyper-parameters a run records.

The scheme flags (``--topk-ratio`` ...) are not written here: each comes from its
declaration in ``workloads.schemes.params`` (name, type, default, help, valid values).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import stat
import sys
from pathlib import Path

from workloads import schemes
from workloads.profiles import gpu_seconds
from workloads.names import DATASET_NAMES, MODEL_NAMES, DatasetError

DIST_BACKENDS = ("auto", "gloo", "nccl")
"""torch.distributed backends a run may ask for (auto: nccl when CUDA is available, else gloo)."""

DESCRIPTION = """Distributed data-parallel training with a choice of gradient-communication scheme.

    torchrun --nproc-per-node 2 -m workloads.train --scheme pactrain --dataset digits --out runs/x

Reads top to bottom: arguments -> process group -> data -> model (+ checkpoint, pruning)
-> DDP + scheme hook -> epochs (iterations, evaluations, records) -> summary -> teardown.
Rank, world size and the rendezvous come from torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT); without them it runs as a single process.
"""

DEFAULT_TARGETS = {"digits": 0.9}
"""--target-acc when none is given (and the run trains: not with --compute-time), per data
set: digits' 90 %, which the quick start's run (``testbed run pactrain --bw 100mbit``, 8
ranks) reaches at its 20th of 75 iterations (docs/results/network.md's records). None for the
others, whose targets depend on the model and the run's length: name one."""
TRAIN_PARAMS = ("model", "dataset", "width", "depth", "batch_size", "lr", "momentum", "weight_decay", "lr_schedule",
                "epochs", "max_iters", "bucket_cap_mb")
"""Arguments besides a scheme's own that change a run's results (the summary's ``hyper``)."""


class _Parser(argparse.ArgumentParser):
    raise_errors = False

    def error(self, message):
        if self.raise_errors:
            raise ValueError(message)
        super().error(message)


def parse_args(argv=None, raise_errors: bool = False) -> argparse.Namespace:
    """The train arguments (``raise_errors``: ValueError instead of usage and exit 2).
    ``--scheme NAME:VALUE...`` (a variant) sets its parameters' flags; ``args.variant`` keeps it."""
    p = _parser(raise_errors)
    args = p.parse_args(argv)
    _expand_variant(p, args, sys.argv[1:] if argv is None else list(argv))
    if args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    for flag, ok, what in _LIMITS:
        v = getattr(args, flag[2:].replace("-", "_"))
        if v is not None and not (math.isfinite(v) and ok(v)):
            p.error(f"{flag} must be {what}, got {v}")
    if args.target_acc is not None and not 0 < args.target_acc <= 1:
        p.error(f"--target-acc is a fraction in (0, 1], got {args.target_acc} (90%% is 0.9)")
    return args


def target(args: argparse.Namespace) -> float | None:
    """The accuracy time-to-accuracy is measured to: --target-acc, else the data set's
    default (:data:`DEFAULT_TARGETS`) when the run trains (not with --compute-time). Not
    written back into ``args``: the command line a sweep or a launcher renders stays the
    user's."""
    if args.target_acc is not None or args.compute_time is not None:
        return args.target_acc
    return DEFAULT_TARGETS.get(args.dataset)


def render(args: argparse.Namespace) -> list[str]:
    """The command line that :func:`parse_args` reads back as ``args`` (``parse_args(render(a))
    == a``): ``--scheme`` as given (a variant stays one), then every other flag whose value
    differs from its default (the flags a variant set are left to it)."""
    by_variant = set()
    if args.variant != args.scheme:
        by_variant = {schemes.parameter(k).name for k in schemes.parse_variant(args.variant)[1]}
    out = ["--scheme", args.variant]
    for a in _parser(True)._actions:
        if not a.option_strings or a.dest in ("help", "scheme") or a.dest in by_variant:
            continue
        value = getattr(args, a.dest)
        if value == a.default:
            continue
        flag = a.option_strings[0]
        if isinstance(a, argparse.BooleanOptionalAction):
            out.append(flag if value else a.option_strings[1])
        elif isinstance(a, argparse._StoreTrueAction):
            out.append(flag)
        else:
            out += [flag, repr(value) if isinstance(value, float) else str(value)]
    return out


def _parser(raise_errors: bool) -> _Parser:
    p = _Parser(prog="python -m workloads.train", description=DESCRIPTION,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.raise_errors = raise_errors
    p.add_argument("--scheme", default="allreduce",
                   help=f"one of: {', '.join(schemes.names())}; or {schemes.VARIANT_HELP}")
    p.add_argument("--model", default="cnn", help=f"one of: {', '.join(MODEL_NAMES)}")
    p.add_argument("--width", type=float, default=1.0, help="channel/embedding multiplier")
    p.add_argument("--depth", type=int, default=None, help="cap on blocks/convs/layers per stage")
    p.add_argument("--dataset", default="digits", help=f"one of: {', '.join(DATASET_NAMES)}")
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
    p.add_argument("--target-acc", type=float, default=None,
                   help="accuracy for time-to-accuracy (0-1; default: 0.9 on digits, none on the others)")
    p.add_argument("--stop-at-target", action="store_true", help="stop once --target-acc is reached")
    p.add_argument("--init", default=None, help="checkpoint from python -m workloads.pretrain")
    _add_scheme_flags(p)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size")
    p.add_argument("--compute-time", type=float, default=None,
                   help="paper-scale traffic: replace forward and backward by this many seconds per iteration "
                        "(e.g. measured on your GPU); the real model's parameters, DDP buckets, hooks and "
                        "collectives, synthetic gradients; no accuracy. Needs --max-iters")
    p.add_argument("--gpu-time", default=None, metavar="SECONDS|GPU",
                   help="real training at a GPU's speed: hold each iteration's real forward and backward to K x "
                        "this many seconds (K: --dilation), or a GPU's profile for the model and batch (h100); "
                        "iterations whose compute could not keep up are counted as overruns (workloads.pacing)")
    p.add_argument("--dilation", type=float, default=1.0, metavar="K",
                   help="time dilation (set by `testbed run --dilation`, which also slows every shaped link "
                        "K-fold): sleep K x --compute-time (or hold the real compute to K x --gpu-time), record "
                        "every duration divided by K")
    p.add_argument("--backend", choices=DIST_BACKENDS, default="auto",
                   help="auto: nccl when CUDA is available, else gloo")
    p.add_argument("--iface", default=None,
                   help="interface whose tx/rx counters are recorded (default: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per rank")
    p.add_argument("--out", default=None, help="run directory for records (none: no records)")
    p.add_argument("--log-every", type=int, default=10, help="print a line every N iterations (rank 0)")
    return p


_LIMITS = (  # flag, its check, what the error says it must be
    ("--epochs", lambda v: v > 0, "a number > 0"),
    ("--max-iters", lambda v: v >= 1, "an integer >= 1"),
    ("--eval-every", lambda v: v >= 0, "an integer >= 0 (0: each epoch)"),
    ("--log-every", lambda v: v >= 0, "an integer >= 0 (0: no progress lines)"),
    ("--lr", lambda v: v >= 0, "a number >= 0"),
    ("--momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("--weight-decay", lambda v: v >= 0, "a number >= 0"),
    ("--width", lambda v: 0 < v <= 64, "a number in (0, 64]"),
    ("--depth", lambda v: v >= 1, "an integer >= 1"),
    ("--bucket-cap-mb", lambda v: 0 < v <= 4096, "a number of MB in (0, 4096]"),
    ("--threads", lambda v: v >= 1, "an integer >= 1"),
)
"""Values the training flags take: a NaN, an infinity or a nonsense number is refused by
name here, not found by a rank mid-run (``--epochs nan`` died as "cannot convert float NaN")."""


def _add_scheme_flags(p: argparse.ArgumentParser) -> None:
    """One flag per declared scheme hyper-parameter (``workloads.schemes.parameters()``)."""
    group = p.add_argument_group("scheme hyper-parameters",
                                 "each changes only the schemes named before its colon;\n"
                                 "a variant (--scheme topk:0.1) sets them too")
    for param in schemes.parameters():
        text = f"{'/'.join(param.schemes)}: {param.help}".replace("%", "%%")
        if param.type is bool:
            group.add_argument(param.flag, action=argparse.BooleanOptionalAction, default=param.default,
                               help=f"{text} (default: {'on' if param.default else 'off'})")
        else:
            valid = f"{param.check}; " if param.check is not None else ""
            group.add_argument(param.flag, type=param.type, default=param.default,
                               help=f"{text} ({valid}default: %(default)s)")


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
        param = schemes.parameter(key)
        flags = (param.flag, param.no_flag) if param.type is bool else (param.flag,)
        if any(a == f or a.startswith(f + "=") for a in given for f in flags):
            p.error(f"{param.flag} is given twice, by the scheme variant {args.scheme!r} and on its own; keep one")
        if param.type is not bool:
            extra += [param.flag, val]
        elif flag := param.switch_flag(val):
            extra.append(flag)
        else:
            p.error(f"scheme variant {args.scheme!r}: {key}={val} is not a switch's value; write "
                    + " or ".join(f"{scheme.name}:{w}" for w in param.all_words or (f"{key}=true", f"{key}=false")))
    p.parse_args(extra, namespace=args)
    args.scheme = scheme.name


_PRETRAIN_SEED = re.compile(r"-s\d+(?=-e[^-/]*\.pt$)")
"""The seed in a sweep's checkpoint name (testbed.runs.sweeps.sweep.Pretraining.key + .pt)."""


def hyper_params(args: argparse.Namespace, scheme, pretrain_dataset: str | None = None) -> dict:
    """Every hyper-parameter that changes this run's results: report never averages runs
    whose ``hyper`` differ. The seed is left out (repeats differ in it on purpose), and so
    is the pre-training seed in a sweep checkpoint's name (repeat k starts from seed + k's);
    the summary's ``init`` keeps the whole name."""
    d = {k: getattr(args, k) for k in TRAIN_PARAMS}
    d.update(schemes.hyper(scheme, vars(args)))
    d["init"] = _PRETRAIN_SEED.sub("", Path(args.init).name) if args.init else None
    d["pretrain_dataset"] = pretrain_dataset
    if args.dilation != 1:  # runs at different K are compared, never averaged
        d["dilation"] = args.dilation
    if getattr(args, "gpu_time_s", None) is not None:  # the GPU a run stands for changes its times
        d["gpu_time_s"] = args.gpu_time_s
    return d


def prepare(args: argparse.Namespace):
    """Validate what can be checked before joining the group; (scheme, dataset).
    ValueError (a DatasetError is one) says what to fix."""
    from workloads import data  # torch: not for a launcher that only checks a command line

    return validate(args), data.load(args.dataset, args.data_dir)


CIFAR_FILES = {"cifar10": ("cifar-10-batches-py", [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]),
               "cifar100": ("cifar-100-python", ["train", "test"])}
"""The files of each CIFAR release that :func:`workloads.data.load` reads (its folder, its batches)."""


def validate(args: argparse.Namespace):
    """The checks that read no data set and build no model (cheap, for launchers that must
    refuse bad input first): the scheme and its values, the data set's name and files, the
    checkpoint a regular file. The scheme; ValueError says what to fix."""
    scheme = schemes.get(args.scheme)
    if args.scheme == "hook" and not args.hook:
        raise ValueError("scheme hook needs --hook package.module:factory (your DDP communication hook)")
    if args.dataset not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {args.dataset!r}; choose one of: {', '.join(DATASET_NAMES)}")
    if args.model not in MODEL_NAMES:
        raise ValueError(f"unknown model {args.model!r}; choose one of: {', '.join(MODEL_NAMES)}")
    if args.init:
        _check_checkpoint(Path(args.init))
    if args.dataset in CIFAR_FILES:
        _check_cifar(args.dataset, args.data_dir)
    schemes.check_values(vars(args))
    if args.dilation != 1.0:
        if not (math.isfinite(args.dilation) and 1 <= args.dilation <= MAX_DILATION):
            raise ValueError(f"--dilation is a factor in [1, {MAX_DILATION:g}], got {args.dilation}")
        if args.compute_time is None and args.gpu_time is None:
            raise ValueError("--dilation needs --compute-time or --gpu-time: real compute cannot be slowed K-fold, "
                             "only held to K x a stated time")
    if args.gpu_time is not None:
        _check_gpu_time(args)
    if args.compute_time is not None:
        if not (math.isfinite(args.compute_time) and 0 <= args.compute_time <= 3600):
            raise ValueError(f"--compute-time is seconds per iteration in [0, 3600], got {args.compute_time}")
        if not args.max_iters:
            raise ValueError("--compute-time needs --max-iters (there are no epochs without data)")
        for flag, given in (("--init", args.init), ("--target-acc", args.target_acc is not None),
                            ("--prune-method grasp", args.prune_method == "grasp" and scheme.prunes)):
            if given:
                raise ValueError(f"--compute-time measures traffic, not accuracy: {flag} does not apply")
    return scheme


def _check_gpu_time(args: argparse.Namespace) -> None:
    """--gpu-time resolved to seconds in ``args.gpu_time_s`` (a number, or a profile's)."""
    if args.compute_time is not None:
        raise ValueError("--gpu-time holds real compute to a GPU's time; --compute-time replaces it: give one")
    seconds = gpu_seconds(str(args.gpu_time), args.model, args.batch_size, args.width)
    if not (math.isfinite(seconds) and 0 < seconds <= 3600):
        raise ValueError(f"--gpu-time is seconds per iteration in (0, 3600], got {args.gpu_time}")
    args.gpu_time_s = seconds


def _regular(path: Path) -> bool:
    """A regular file (a FIFO or a device would block or never end a rank's read)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


MAX_DILATION = 1000.0
"""The largest time dilation: 1000 x a 10 Gbit link is 10 Mbit, still well above HTB's floor."""

CHECKPOINT_MAGIC = (b"PK\x03\x04", b"\x80")
"""How a file torch.load reads begins: torch.save's zip archive, or the legacy pickle."""


def _check_checkpoint(path: Path) -> None:
    """A regular file that begins as a checkpoint does (its first bytes only: loading it is
    the ranks' work, and what only loading finds each rank reports)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO planted there does not block
    except OSError:
        fd = -1
    try:
        head = os.read(fd, 4) if fd >= 0 and stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        if fd >= 0:
            os.close(fd)
    if head is None:
        raise ValueError(f"--init {path}: no such file (make one with python -m workloads.pretrain)")
    if not head.startswith(CHECKPOINT_MAGIC):
        raise ValueError(f"--init {path}: not a checkpoint (torch.save writes a zip archive; make one with "
                         f"python -m workloads.pretrain)")


def _check_cifar(name: str, data_dir: str | None) -> None:
    """``--data-dir`` holds the release's batches as regular files (their contents are the ranks' to read)."""
    sub, files = CIFAR_FILES[name]
    if not data_dir:
        raise DatasetError(f"--dataset {name} needs --data-dir: the directory holding {sub}/ (the python "
                           f"version from https://www.cs.toronto.edu/~kriz/cifar.html, extracted)")
    base = Path(data_dir)
    d = next((d for d in (base / sub, base) if d.is_dir() and any((d / f).exists() for f in files)), None)
    if d is None:
        raise DatasetError(f"--data-dir {data_dir}: no {sub}/ with CIFAR files found; extract the python "
                           f"version of {name} there (nothing is downloaded)")
    missing = [f for f in files if not _regular(d / f)]
    if missing:
        raise DatasetError(f"--data-dir {data_dir}: {d} lacks {', '.join(missing)} as regular files; "
                           f"extract the python version of {name} there again")
