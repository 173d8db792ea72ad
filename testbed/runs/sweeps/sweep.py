"""`testbed sweep`: every scheme (or the user's own code) x bandwidth x parameter-grid point
(x repeats), the built-in schemes from pre-trained checkpoints.

Repeat k of a run uses the workload's seed + k (data order, augmentation, stochastic
rounding) and starts from the checkpoint pre-trained with seed + k, so the spread over
repeats is training's and pre-training's, not only the clock's, while repeat k of every
scheme starts from the same weights (the pairs of ``report``'s intervals).
A checkpoint is made once per (model, width, depth, pre-training dataset, seed, epochs) by
``python -m workloads.pretrain`` and cached under ``OUT/checkpoints/`` (``--init`` gives
one for every repeat instead). All runs share one
testbed (brought up here unless ``--testbed`` names a running one) and land in
``OUT/sweep-<time>/``, with ``sweep.json`` listing them. A failed run is recorded and the
sweep goes on; the sweep then exits non-zero.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from testbed.common import locks, procs
from testbed.common.files import write_json
from testbed.common.errors import TestbedError
from testbed.common.outdir import own_dir
from testbed.runs.sweeps import grid
from testbed.runs.dilation import check as check_dilation
from testbed.runs.checks import discard_out
from testbed.runs.experiment import RunRequest, Status, check_out, obtain_testbed, run, variant_slug
from testbed.runs.interrupts import RunInterrupted, ignore_interrupts, install_signals
from testbed.runs.preflight import check_target
from testbed.runs.proof import TrafficBypassed, TrafficUnproven
from testbed.runs.request import UserCode
from testbed.runs.spec import WorkloadSpec
from testbed.model.units import Rate


@dataclass
class SweepRequest:
    schemes: list[str]
    bws: list[Rate]
    workload_args: list[str]
    repeats: int = 1
    topology: Path | None = None
    testbed: str | None = None
    out: Path = Path("runs")
    timeout: float = 300.0
    init: Path | None = None
    pretrain: Pretraining | None = None
    """The shared checkpoint to make (or reuse) when ``init`` is None (None: none, as for
    ``--compute-time`` runs, which measure traffic only)."""
    exporter: bool = True
    tensorboard: bool = False
    """Every run writes TensorBoard event files into its own directory (RunRequest.tensorboard)."""
    params: dict[str, list[str]] = field(default_factory=dict)
    """The parameter grid (:mod:`testbed.runs.sweeps.grid`): every run gets one of its points."""
    code: UserCode | None = None
    """The user's own script or module instead of ``schemes`` (its label is the one scheme)."""
    dilation: float = 1.0
    """Every run's time dilation K (:mod:`testbed.runs.dilation`)."""
    _specs: dict = field(default_factory=dict, repr=False, compare=False)

    def spec(self, scheme: str, point: dict) -> WorkloadSpec | None:
        """The typed options of ``scheme``'s runs at grid ``point``, parsed once (None: the user's
        code, whose arguments pass through); a repeat changes only its seed."""
        if self.code is not None:
            return None
        key = (scheme, tuple(sorted(point.items())))
        if key not in self._specs:
            self._specs[key] = WorkloadSpec.parse(scheme, [*self.workload_args, *grid.argv(point, builtin=True)])
        return self._specs[key]

    def check(self) -> None:
        """Every scheme at every grid point, and ``init``, checked (TestbedError) before anything is built."""
        for scheme in self.schemes:
            for point in grid.for_scheme(self.params, None if self.code else scheme):
                self.spec(scheme, point)
        if self.init is not None and self.code is None:
            WorkloadSpec.parse("allreduce", ["--init", str(self.init)])
        if self.dilation != 1:  # refused as a run would refuse it, before the first run
            for scheme in self.schemes:
                spec = self.spec(scheme, grid.for_scheme(self.params, None if self.code else scheme)[0])
                check_dilation(RunRequest(scheme=scheme, spec=spec, code=self.code, dilation=self.dilation,
                                          cross_traffic=[]))


@dataclass(frozen=True)
class Pretraining:
    """What the shared checkpoint is: a model pre-trained on ``dataset`` (which may differ
    from the runs' dataset: the paper pre-trains, then fine-tunes on another task)."""

    model: str
    dataset: str
    epochs: float = 2.0
    width: float | None = None
    depth: int | None = None
    data_dir: Path | None = None
    seed: int = 0

    @property
    def key(self) -> str:
        return (f"{self.model}-w{self.width or 1:g}-d{self.depth or 'full'}-{self.dataset}-s{self.seed}"
                f"-e{self.epochs:g}")

    def args(self) -> list[str]:
        a = ["--model", self.model, "--dataset", self.dataset, "--seed", str(self.seed), "--epochs", str(self.epochs)]
        for flag, value in (("--width", self.width), ("--depth", self.depth), ("--data-dir", self.data_dir)):
            if value is not None:
                a += [flag, str(value)]
        return a


PRETRAIN_WAIT_S = 3600.0
"""How long a run waits for the checkpoint another process is pre-training."""


def checkpoint(out: Path, pre: Pretraining, say: Callable[[str], None]) -> Path:
    """The checkpoint for ``pre`` under ``out/checkpoints/``, made once by
    ``python -m workloads.pretrain`` and reused by every later run and sweep."""
    path = out / "checkpoints" / f"{pre.key}.pt"
    own_dir(path.parent)  # ours: a checkpoint someone else can replace is not loaded
    busy = f"another sweep has pre-trained {path} for an hour"
    with locks.held(locks.open_lock(path.parent / f".{pre.key}.lock"), PRETRAIN_WAIT_S, busy):
        return _checkpoint_locked(path, pre, say)  # the elements of a Slurm sweep make it once


def _checkpoint_locked(path: Path, pre: Pretraining, say: Callable[[str], None]) -> Path:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise TestbedError(f"cached checkpoint {path} is not a file of yours (a link, or another user's)",
                               "remove it (the next sweep pre-trains again), or --out a directory of your own")
        say(f"using cached checkpoint {path}")
        return path
    say(f"pre-training {pre.model} on {pre.dataset} for {pre.epochs:g} epochs -> {path}")
    p = subprocess.run(procs.python_argv("workloads.pretrain", *pre.args(), "--out", str(path)),
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise TestbedError(f"pre-training failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}")
    say(p.stdout.strip())
    return path


@dataclass(frozen=True)
class Point:
    """One run of a sweep: repeat ``repeat`` (seed + repeat) of ``scheme`` at ``bw`` with grid
    point ``params``."""

    bw: Rate
    scheme: str
    params: dict
    repeat: int

    @property
    def run_id(self) -> str:
        return "-".join(x for x in (variant_slug(self.scheme), str(self.bw), grid.slug(self.params),
                                    f"r{self.repeat}") if x)

    def entry(self, init: Path | None) -> dict:
        """Its line in ``sweep.json`` before its status."""
        return {"run_id": self.run_id, "scheme": self.scheme, "bw": str(self.bw), "params": self.params,
                "repeat": self.repeat, "checkpoint": str_or_none(init)}


def plan(req: SweepRequest) -> list[Point]:
    """The sweep's runs in the order a local sweep runs them. Repeat k of every scheme runs
    back to back, so that a pair (stats.pair_key) shares the machine's load at that moment as
    well as its seed and checkpoint (a pair's seed and checkpoint are its repeat's whatever
    the order: a Slurm array runs the same points in the queue's order)."""
    return [Point(bw, scheme, point, rep) for bw in req.bws for rep in range(req.repeats) for scheme in req.schemes
            for point in grid.for_scheme(req.params, None if req.code else scheme)]


def run_point(req: SweepRequest, p: Point, init: Path | None, testbed: str, sweep_dir: Path,
              on_status: Callable[[Status], None] | None, say: Callable[[str], None]) -> dict:
    """Run ``p`` on ``testbed`` into ``sweep_dir``; its entry in ``sweep.json`` with its status
    (a failed run is an entry; RunInterrupted, Ctrl-C or SIGTERM, is raised)."""
    entry = p.entry(init)
    try:
        run(_request(req, p.scheme, p.params, p.repeat, init, testbed, p.bw, sweep_dir, p.run_id),
            on_status=on_status, on_message=say)
        entry["status"] = "ok"
    except TrafficBypassed as e:
        entry.update(status="bypassed", error=e.message)
        say(f"run {p.run_id} bypassed the links: {e.message.splitlines()[0]}")
    except TrafficUnproven as e:
        entry.update(status="unproven", error=e.message)
        say(f"run {p.run_id} is unproven: {e.message.splitlines()[0]}")
    except RunInterrupted:
        raise
    except TestbedError as e:
        entry.update(status="failed", error=e.message)
        say(f"run {p.run_id} failed: {e.message.splitlines()[0]}")
    return entry


def sweep(req: SweepRequest, on_status: Callable[[Status], None] | None = None,
          on_message: Callable[[str], None] | None = None) -> dict:
    made = check_out(req.out)
    try:
        return _sweep_checked(req, on_status, on_message or (lambda m: None))
    except BaseException:
        discard_out(req.out, made)  # only what stayed empty: a refused sweep leaves no --out behind
        raise


def _sweep_checked(req: SweepRequest, on_status, say: Callable[[str], None]) -> dict:
    sweep_dir = new_dir(req.out)
    tb, created = None, False
    index = index_head(req)
    points = plan(req)
    restore_signals = install_signals()  # SIGTERM and SIGHUP unwind like Ctrl-C, between runs too
    try:
        req.check()  # every run's options, then the testbed's names: before anything is built
        check_target(req.testbed, req.topology)
        tb, created = obtain_testbed(req.testbed, req.topology, say, req.exporter)  # before pre-training
        inits = Checkpoints(req, say)
        index["checkpoint"] = str_or_none(inits.get(0))
        for k, p in enumerate(points, 1):
            where = "".join(f", {key}={v}" for key, v in p.params.items())
            say(f"[{k}/{len(points)}] {p.scheme} at {p.bw}{where}, repeat {p.repeat + 1}/{req.repeats}")
            try:
                entry = run_point(req, p, inits.get(p.repeat), tb.name, sweep_dir, on_status, say)
            except RunInterrupted as e:  # Ctrl-C or SIGTERM ends the sweep, not only its run
                index["runs"].append({**p.entry(inits.get(p.repeat)), "status": "interrupted", "error": e.message})
                write_json(sweep_dir / "sweep.json", index)
                raise
            index["runs"].append(entry)
            write_json(sweep_dir / "sweep.json", index)
    except BaseException:
        with contextlib.suppress(OSError):
            sweep_dir.rmdir()  # when no run got as far as its directory
        raise
    finally:
        ignore_interrupts()  # the cleanup runs to the end
        try:
            if created and tb is not None:
                tb.down()
        finally:
            restore_signals()
    index["dir"] = str(sweep_dir)
    return index


def index_head(req: SweepRequest) -> dict:
    """``sweep.json`` before its runs."""
    index = {"checkpoint": None, "schemes": req.schemes, "bws": [str(b) for b in req.bws],
             "params": req.params, "repeats": req.repeats, "runs": []}
    if req.code is not None:
        index["code"] = req.code.to_dict()
    return index


class Checkpoints:
    """Repeat k's starting point: ``--init`` for every repeat, else the checkpoint
    pre-trained with seed + k (made when its repeat first runs, cached), so the spread over
    repeats includes pre-training's and paired repeats share their start."""

    def __init__(self, req: SweepRequest, say: Callable[[str], None]):
        self.req, self.say = req, say
        self.made: dict[int, Path] = {}

    def get(self, rep: int) -> Path | None:
        if self.req.init is not None or self.req.pretrain is None:
            return self.req.init
        if rep not in self.made:
            pre = replace(self.req.pretrain, seed=self.req.pretrain.seed + rep)
            self.made[rep] = checkpoint(self.req.out, pre, self.say)
        return self.made[rep]


def str_or_none(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def new_dir(out: Path) -> Path:
    sweep_dir = out / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while sweep_dir.exists():
        n += 1
        sweep_dir = out / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    own_dir(sweep_dir, fresh=True)  # private, as a run's directory is
    return sweep_dir


def _request(req: SweepRequest, scheme: str, point: dict, rep: int, init: Path | None, testbed: str, bw: Rate,
             sweep_dir: Path, run_id: str) -> RunRequest:
    """One run of the sweep: repeat ``rep`` (seed + rep) of ``scheme`` at ``bw`` with grid ``point``."""
    spec = req.spec(scheme, point)
    if spec is not None:
        spec = spec.replace(seed=spec.seed + rep, **({"init": init} if init else {}))
    return RunRequest(scheme=scheme, workload_args=req.workload_args, spec=spec, params=point, code=req.code,
                      testbed=testbed, bw=bw, out=sweep_dir, timeout=req.timeout, run_id=run_id,
                      extra={"repeat": rep, "sweep": sweep_dir.name}, exporter=req.exporter, dilation=req.dilation,
                      tensorboard=req.tensorboard)
