"""The built-in workload's options as one typed value, from the command line to the ranks.

    WorkloadSpec.parse   the whole workload command line (testbed's typed options and what
                         followed `--`, then a sweep's grid point) read once by the
                         workload's own parser (``workloads.arguments.parse_args``), checked
                         without loading a data set or building a model, its paths made
                         absolute (ranks run in the run directory)
    spec.replace         a changed copy (a sweep's seed + k, the shared checkpoint)
    spec.argv            the ranks' command line, rendered once where it is made

Every consumer (the GPUs a run shares, the paths mounted into container workers, a sweep's
seed, the records) reads the spec's fields; nothing scans an argv again. The user's own
code (--script/-m) is not ours to parse: its arguments pass through unchanged.

``workloads`` is imported when a spec is parsed, never when this module is; neither
imports torch (the names it checks are in ``workloads.names``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.common.errors import TestbedError

PATH_OPTIONS = {"init": "file", "data_dir": "dir", "hook_path": "dir"}
"""Options naming host files: made absolute once, and their directories mounted into
container workers at the same path."""


@dataclass(frozen=True)
class WorkloadSpec:
    """``python -m workloads.train``'s parsed arguments (the scheme included, ``--out`` not)."""

    options: argparse.Namespace
    """As ``workloads.arguments.parse_args`` returns them; treat as read-only (``replace``)."""

    @classmethod
    def parse(cls, scheme: str, argv: Sequence[str]) -> WorkloadSpec:
        """``--scheme SCHEME ARGV...`` read and checked (TestbedError saying what to fix);
        a flag given twice: the last one wins, as argparse reads it."""
        try:
            from workloads.arguments import parse_args, validate
        except ImportError as e:
            raise TestbedError(f"the training workloads cannot be imported ({e})",
                               "install torch first (pip install torch==2.13.0), then pip install '.[train]'") from None
        try:
            ns = parse_args(["--scheme", scheme, *argv], raise_errors=True)
        except ValueError as e:
            raise TestbedError(f"workload: {e}", "see python -m workloads.train --help") from None
        if ns.hook and not ns.hook_path:  # --hook's module is found from here, as python -m would
            ns.hook_path = str(Path.cwd())
        for name in PATH_OPTIONS:
            if getattr(ns, name):
                setattr(ns, name, str(Path(getattr(ns, name)).resolve()))
        ns.out = None  # the run's directory, given at the end
        spec = cls(ns)
        if spec.init is not None:
            _check_checkpoint(spec.init)
        try:
            validate(ns)
        except ValueError as e:
            raise TestbedError(f"workload: {e}", "see python -m workloads.train --help") from None
        return spec

    def replace(self, **changes) -> WorkloadSpec:
        """A copy with ``changes`` (option names as parse_args' fields); paths made absolute."""
        ns = argparse.Namespace(**vars(self.options))
        for k, v in changes.items():
            if not hasattr(ns, k):
                raise AttributeError(f"no workload option {k!r}")
            setattr(ns, k, str(Path(v).resolve()) if k in PATH_OPTIONS and v is not None else v)
        return WorkloadSpec(ns)

    def argv(self, out: Path | None = None) -> list[str]:
        """The ranks' command line (after ``python -m workloads.train``), with ``--out`` when given."""
        from workloads.arguments import render

        return render(self.options) + (["--out", str(out)] if out is not None else [])

    def args(self) -> list[str]:
        """The command line without ``--scheme`` (what run.json records as ``workload_args``)."""
        return self.argv()[2:]

    @property
    def scheme(self) -> str:
        """The scheme as given (a variant such as ``topk:0.1`` stays one)."""
        return self.options.variant

    @property
    def backend(self) -> str:
        return self.options.backend

    @property
    def seed(self) -> int:
        return self.options.seed

    @property
    def init(self) -> Path | None:
        return Path(self.options.init) if self.options.init else None

    def mounts(self) -> list[Path]:
        """The host directories the ranks read (a file option's directory, a directory option itself)."""
        found = []
        for name, kind in PATH_OPTIONS.items():
            value = getattr(self.options, name)
            if value:
                found.append(Path(value).parent if kind == "file" else Path(value))
        return list(dict.fromkeys(found))


def _check_checkpoint(path: Path) -> None:
    from testbed.common.files import check_regular

    try:
        check_regular(path, "checkpoint", "--init")
    except FileNotFoundError:
        raise TestbedError(f"--init {path}: no such file", "give a checkpoint made by workloads.pretrain "
                           "or torch.save") from None
