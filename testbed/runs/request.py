"""What `testbed run` is asked to do, what it shows while it runs, and how runs are named.

    RunRequest   the run's inputs (scheme, the workload's typed options, testbed, --bw / --bw-trace, ...)
    UserCode     a user's own script (--script FILE) or module (-m MOD) the ranks run instead
    Status       what the progress display shows, refreshed about twice a second
    new_run_id   runs/<time>-<scheme variant>-<bw>, unique in the output directory

The built-in workload's options are one typed value (:class:`testbed.runs.spec.WorkloadSpec`),
parsed once and rendered to the ranks' argv once; the user's own code's arguments pass through.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.hosts.runplace import CodeTree
from testbed.model.units import Rate
from testbed.runs.sweeps import grid
from testbed.runs.spec import WorkloadSpec


@dataclass(frozen=True)
class UserCode:
    """The user's own training code each rank runs (``python -m workloads.userscript``), as
    torchrun would: a script file, or a module importable from ``path``."""

    kind: str
    """"script" or "module"."""
    target: str
    """The script's absolute path, or the module's dotted name."""
    path: Path
    """The script's directory; for a module, the directory `testbed run` was started from."""

    @classmethod
    def script(cls, file: Path) -> "UserCode":
        f = file.resolve()
        return cls("script", str(f), f.parent)

    @classmethod
    def module(cls, name: str, cwd: Path) -> "UserCode":
        return cls("module", name, cwd.resolve())

    def argv(self) -> list[str]:
        """workloads.userscript's arguments before the user's own."""
        if self.kind == "script":
            return [self.target]
        return ["--module", self.target, "--path", str(self.path)]

    @property
    def label(self) -> str:
        """How runs of it are named in run ids, summaries and reports."""
        return f"script:{Path(self.target).name}" if self.kind == "script" else f"module:{self.target}"

    def tree(self, out: Path) -> CodeTree:
        """What another host needs of this code: a script's whole directory (it may import its
        siblings), a module's top-level package or file when it lies in ``path`` (else the
        workers' Python has it); never the runs' output directory ``out``."""
        if self.kind == "script":
            return CodeTree(self.path, (self.path,), (out.resolve(),))
        top = self.target.split(".")[0]
        found = [p for p in (self.path / top, self.path / f"{top}.py") if p.exists()]
        return CodeTree(self.path, tuple(found[:1]), (out.resolve(),))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "target": self.target, "path": str(self.path)}


@dataclass
class RunRequest:
    scheme: str
    workload_args: list[str] = field(default_factory=list)
    """Arguments of the workload other than --scheme/--out (parsed into ``spec`` for
    workloads.train; the user's own code's, or another module's, passed on unchanged)."""
    topology: Path | None = None
    testbed: str | None = None
    bw: Rate | None = None
    out: Path = Path("runs")
    timeout: float = 300.0
    run_id: str | None = None
    extra: dict = field(default_factory=dict)
    """Stored in summary.json under "request" (e.g. the sweep's repeat number)."""
    module: str = "workloads.train"
    """The workload each rank runs (``python -m MODULE``); only workloads.train takes --scheme."""
    bw_trace: Path | None = None
    """A trace (CSV or Mahimahi, :mod:`testbed.model.trace`) the bottleneck links follow during the run."""
    trace_format: str = "auto"
    trace_window: float = 1.0
    trace_loop: bool = False
    cross_traffic: list | None = None
    """Cross-traffic flows (:class:`testbed.runs.traffic.Flow`) during the run; None: the
    topology's ``traffic:``, [] none."""
    code: UserCode | None = None
    """The user's own script or module instead of a built-in scheme (``scheme`` is its label;
    ``workload_args`` are its arguments)."""
    params: dict[str, str] = field(default_factory=dict)
    """A sweep's grid point (:mod:`testbed.runs.sweeps.grid`): passed as ``--KEY VALUE`` after
    ``workload_args``, kept in the summary's ``params`` and grouped by in reports."""
    exporter: bool = True
    """Serve the run's training metrics (and a testbed brought up here, its link metrics) to
    Prometheus, announced through file-SD target files."""
    dilation: float = 1.0
    """Time dilation K (:mod:`testbed.runs.dilation`): every link and the stated compute K
    times slower, every recorded duration divided by K."""
    tensorboard: bool = False
    """Write TensorBoard event files from the records into ``<run>/tensorboard/`` as they grow
    (:mod:`testbed.runs.reports.tensorboard`)."""
    spec: WorkloadSpec | None = None
    """workloads.train's options, typed (the grid point's included); when not given, parsed
    once from ``scheme``, ``workload_args`` and ``params`` on first use (:attr:`workload`)."""

    @property
    def workload(self) -> WorkloadSpec | None:
        """The built-in trainer's typed options (None: the user's code or another module,
        whose arguments are not ours to parse). TestbedError when they are wrong."""
        if self.code is not None or self.module != "workloads.train":
            return None
        if self.spec is None:
            self.spec = WorkloadSpec.parse(self.scheme, [*self.workload_args, *grid.argv(self.params, builtin=True)])
        return self.spec

    @property
    def args(self) -> list[str]:
        """The code's arguments: the built-in trainer's rendered from its spec (without
        --scheme); others' ``workload_args``, then the grid point's ``--KEY VALUE``."""
        spec = self.workload
        if spec is not None:
            return spec.args()
        return [*self.workload_args, *grid.argv(self.params, builtin=self.code is None)]

    @property
    def compute_backend(self) -> str:
        """The workload's torch.distributed backend (auto, gloo or nccl; auto for code not ours)."""
        spec = self.workload
        return spec.backend if spec is not None else "auto"


@dataclass
class Status:
    """What the progress display shows; refreshed about twice a second."""

    run_dir: Path
    world: int = 0
    iteration: int = 0
    total: int | None = None
    epoch: int = 0
    loss: float | None = None
    accuracy: float | None = None
    utilisation: dict[str, float] = field(default_factory=dict)
    """"link direction" -> fraction of the configured rate over the last second."""


def variant_slug(spec: str) -> str:
    """A scheme variant as a file-name part: ``pactrain:0.8:ternary`` -> ``pactrain_0.8_ternary``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", spec.replace("=", ""))


def new_run_id(out: Path, scheme: str, bw: Rate | str | None) -> str:
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{variant_slug(scheme)}-{bw if bw else 'asis'}"
    rid, n = base, 1
    while (out / rid).exists():
        n += 1
        rid = f"{base}-{n}"
    return rid
