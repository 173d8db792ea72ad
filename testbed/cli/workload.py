"""The training options ``run`` and ``sweep`` share, and the workload's command line built
from them (``python -m workloads.train ...``; no shell ever sees it).

The scheme hyper-parameter flags (``--topk-ratio``, ``--prune-method`` ...) are not listed
here: each comes from its declaration in ``workloads.schemes.parameters()`` (flag, type,
help, valid values), and its value is checked against that declaration when the command
line is parsed. The other options are the workload's own (model, data, schedule).
"""

from __future__ import annotations

import functools
import inspect
import math
from pathlib import Path
from typing import Optional

import typer

from testbed.cli.params import Choices, choice
from testbed.common.errors import TestbedError

# What the plain `testbed run SCHEME` trains: a bundled real dataset and a model that finish
# in a few minutes on a 2-core CPU machine with eight ranks.
RUN_DEFAULTS = {"model": "cnn", "dataset": "digits", "epochs": 15.0, "batch_size": 32}


def _models():
    from workloads.names import MODEL_NAMES

    return MODEL_NAMES


def _datasets():
    from workloads.names import DATASET_NAMES

    return DATASET_NAMES


def _dist_backends():
    from workloads.arguments import DIST_BACKENDS

    return DIST_BACKENDS


MODELS = Choices("model", _models, metavar="MODEL")
DIST_BACKENDS = Choices("backend", _dist_backends, metavar="auto|gloo|nccl")
DATASETS = Choices("dataset", _datasets, metavar="DATASET")

_GENERAL = [  # (name, type, typer option), in --help order
    ("model", str, choice(RUN_DEFAULTS["model"], "--model", choices=MODELS, help="Model to train.")),
    ("width", Optional[float], typer.Option(None, "--width", metavar="NUMBER", help="Model width multiplier.")),
    ("depth", Optional[int], typer.Option(None, "--depth", metavar="INT", help="Model depth cap.")),
    ("dataset", str, choice(RUN_DEFAULTS["dataset"], "--dataset", choices=DATASETS,
                            help="Dataset (digits is bundled; cifar10/cifar100 need --data-dir).")),
    ("data_dir", Optional[Path], typer.Option(None, "--data-dir", metavar="DIR",
                                              help="Directory with the CIFAR python-pickle folders.")),
    ("epochs", float, typer.Option(RUN_DEFAULTS["epochs"], "--epochs", metavar="NUMBER",
                                   help="Epochs (fractions allowed).")),
    ("max_iters", Optional[int], typer.Option(None, "--max-iters", metavar="INT",
                                              help="Stop after this many iterations.")),
    ("batch_size", int, typer.Option(RUN_DEFAULTS["batch_size"], "--batch-size", metavar="INT", help="Per worker.")),
    ("lr", Optional[float], typer.Option(None, "--lr", metavar="NUMBER", help="Learning rate (workload default 0.05).")),
    ("target_acc", Optional[float], typer.Option(None, "--target-acc", metavar="FRACTION",
                                                 help="Accuracy (0-1) for time-to-accuracy.")),
    ("stop_at_target", bool, typer.Option(False, "--stop-at-target", help="Stop once --target-acc is reached.")),
    ("seed", int, typer.Option(0, "--seed", metavar="INT")),
    ("init", Optional[Path], typer.Option(None, "--init", metavar="FILE",
                                          help="Checkpoint from python -m workloads.pretrain.")),
    ("backend", str, choice("auto", "--backend", choices=DIST_BACKENDS, help="The workload's torch.distributed "
                            "backend (auto: nccl when CUDA is available, else gloo).")),
    ("eval_every", Optional[int], typer.Option(None, "--eval-every", metavar="INT",
                                               help="Iterations between evaluations (default: each epoch).")),
    ("compute_time", Optional[float], typer.Option(None, "--compute-time", metavar="SECONDS", help="Paper-scale "
                                                   "traffic: forward and backward replaced by this many seconds per "
                                                   "iteration (e.g. measured on your GPU); real parameters, buckets, "
                                                   "hooks and collectives; no accuracy. Needs --max-iters.")),
    ("gpu_time", Optional[str], typer.Option(None, "--gpu-time", metavar="SECONDS|GPU", help="Real training at a "
                                             "GPU's speed: each iteration's real forward and backward held to K x "
                                             "this many seconds (K: --dilation; a GPU profile for the model and "
                                             "batch: h100). Iterations the CPU could not keep up with are counted; "
                                             "the run is validated only without any (docs/dilation.md).")),
]
_FLAGS = {"width": "--width", "depth": "--depth", "data_dir": "--data-dir", "max_iters": "--max-iters",
          "lr": "--lr", "target_acc": "--target-acc", "init": "--init", "eval_every": "--eval-every",
          "compute_time": "--compute-time", "gpu_time": "--gpu-time"}
"""The general options passed on only when given (the workload's defaults apply otherwise)."""


def _scheme_options() -> list[tuple]:
    """One option per declared scheme hyper-parameter (``workloads.schemes.parameters()``)."""
    from workloads.schemes import Choice, parameters

    opts = []
    for p in parameters():
        where = ", ".join(p.schemes)
        if p.type is bool:
            opts.append((p.name, Optional[bool], typer.Option(
                None, f"{p.flag}/{p.no_flag}", show_default=False,
                help=f"{where}: {p.help} (default {'on' if p.default else 'off'}).")))
            continue
        rule = f"{p.check}; " if p.check is not None else ""
        text = f"{where}: {p.help} ({rule}default {p.default})." if p.default != "" else f"{where}: {p.help}."
        if isinstance(p.check, Choice):
            named = Choices(p.name.replace("_", " "), p.check.values)
            opts.append((p.name, Optional[str], choice(None, p.flag, choices=named, help=text)))
        else:
            opts.append((p.name, Optional[p.type], typer.Option(None, p.flag, parser=_checked(p), help=text,
                                                                metavar=_METAVARS.get(p.type, "TEXT"))))
    return opts


_METAVARS = {int: "INT", float: "NUMBER"}


def _checked(p):
    """Read and check one hyper-parameter's value as its declaration says (a usage error if not)."""
    def parse(text: str):
        try:
            value = p.type(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not {'an integer' if p.type is int else 'a number'}") from None
        try:
            p.validate(value)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        return value

    return parse


WORKLOAD_OPTIONS = _GENERAL + _scheme_options()


def with_workload_options(fn):
    """Add the workload options to a command; it receives them as one dict, ``workload``."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.name != "workload"]
    taken = {p.name for p in own} & {n for n, _, _ in WORKLOAD_OPTIONS}
    assert not taken, f"{fn.__name__}: options {taken} are also workload options"
    extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=o, annotation=t)
             for n, t, o in WORKLOAD_OPTIONS]
    cut = next(i for i, p in enumerate(own) if p.name == "as_json")  # --json stays last in --help
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if i >= cut else p for i, p in enumerate(own)]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        workload = {n: kwargs.pop(n) for n, _, _ in WORKLOAD_OPTIONS}
        return fn(*args, workload=workload, **kwargs)

    # typeshed's functools._Wrapped declares no __signature__ (a function takes any attribute; inspect reads it)
    wrapper.__signature__ = sig.replace(parameters=own[:cut] + extra + own[cut:])  # type: ignore[attr-defined]
    return wrapper


def workload_args(w: dict, extra=()) -> list[str]:
    """The command line of `python -m workloads.train` (without --scheme/--out/--iface)."""
    from workloads.schemes import parameters

    args = ["--model", w["model"], "--dataset", w["dataset"], "--epochs", str(w["epochs"]), "--batch-size",
            str(w["batch_size"]), "--seed", str(w["seed"]), "--backend", w["backend"]]
    for name, flag in _FLAGS.items():
        if w[name] is not None:
            args += [flag, str(w[name])]
    for p in parameters():  # only what was given: the workload's defaults apply otherwise
        if w[p.name] is not None:
            args += [(p.flag if w[p.name] else p.no_flag)] if p.type is bool else [p.flag, str(w[p.name])]
    if w["stop_at_target"]:
        args.append("--stop-at-target")
    return args + list(extra)


def workload_spec(scheme: str, w: dict, extra=()):
    """The workload's typed options (testbed.runs.spec.WorkloadSpec): ``w`` and what followed
    `--` read once by the workload's own parser and checked without loading any data."""
    from testbed.runs.spec import WorkloadSpec

    return WorkloadSpec.parse(scheme, workload_args(w, extra))


def check_timeout(timeout: float) -> None:
    if not math.isfinite(timeout) or timeout <= 0:
        raise TestbedError(f"--timeout must be a number of seconds > 0, got {timeout}", "e.g. --timeout 300")


def pretraining(spec, dataset: Optional[str], epochs: float):
    """The shared checkpoint's description (testbed.runs.sweeps.sweep.Pretraining) for the runs of
    ``spec`` (a WorkloadSpec), checked."""
    from testbed.runs.sweeps.sweep import Pretraining

    if not (math.isfinite(epochs) and epochs > 0):
        raise TestbedError(f"--pretrain-epochs must be a number > 0, got {epochs}")
    o = spec.options
    return Pretraining(model=o.model, dataset=dataset or o.dataset, epochs=epochs, width=o.width, depth=o.depth,
                       data_dir=Path(o.data_dir) if o.data_dir else None, seed=o.seed)


def wants_pretraining(scheme: str, pretrain: Optional[bool], pretrain_dataset: Optional[str], spec) -> bool:
    """Whether ``testbed run`` starts from a pre-trained checkpoint: as asked, else (auto)
    when the scheme prunes a trained network or --pretrain-dataset is given; contradictions refused."""
    from workloads.schemes import parse_variant

    init, compute_time = spec.init, spec.options.compute_time
    if pretrain is False and init is not None:
        raise TestbedError("--no-pretrain and --init contradict each other", "give one of them")
    if pretrain is None:
        pretrain = pretrain_dataset is not None or (parse_variant(scheme)[0].prunes and init is None
                                                    and compute_time is None)
    if pretrain and compute_time is not None:
        raise TestbedError("--compute-time measures traffic, not accuracy: pre-training does not apply",
                           "drop --pretrain/--pretrain-dataset")
    if pretrain_dataset is not None and not pretrain:
        raise TestbedError("--pretrain-dataset needs pre-training", "drop --no-pretrain")
    return pretrain


def with_prune_ratios(names: list[str], ratios: str) -> list[str]:
    """Each pactrain entry once per ratio: ``pactrain:exact`` x 0.3,0.5 -> ``pactrain:0.3:exact``, ..."""
    from workloads.schemes import parse_variant

    values = [x.strip() for x in ratios.split(",") if x.strip()]
    for v in values:
        try:
            ok = 0 <= float(v) < 1
        except ValueError:
            ok = False
        if not ok:
            raise TestbedError(f"--prune-ratios: {v!r} is not a ratio in [0, 1)", "e.g. --prune-ratios 0.1,0.3,0.5,0.7,0.9")
    if not values:
        raise TestbedError("--prune-ratios is empty", "e.g. --prune-ratios 0.1,0.3,0.5,0.7,0.9")
    out = []
    for name in names:
        base, *rest = name.split(":")
        if base != "pactrain":
            out.append(name)
            continue
        try:
            sets_ratio = "prune_ratio" in parse_variant(name)[1]
        except ValueError as e:
            raise TestbedError(f"--schemes: {e}") from None
        if sets_ratio:
            raise TestbedError(f"--schemes {name!r} sets a pruning ratio and --prune-ratios gives them too",
                               "write the pactrain entry without a ratio (e.g. pactrain or pactrain:exact)")
        out += [":".join(["pactrain", v, *rest]) for v in values]
    if out == names:
        raise TestbedError("--prune-ratios needs a pactrain entry in --schemes", "e.g. --schemes allreduce,pactrain")
    return out
