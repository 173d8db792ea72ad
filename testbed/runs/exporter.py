"""The run's training metrics for Prometheus: a :class:`collectors.training.RunExporter`
announced through a file-SD target file, which is recorded in the testbed's ledger first
(`testbed down` removes it if the run's process dies)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from testbed.engine.core import Testbed
from testbed.plan.ledger import Ledger
from testbed.monitor import auth

if TYPE_CHECKING:
    from collectors.training import RunExporter


def start_run_exporter(tb: Testbed, run_id: str, run_dir: Path) -> RunExporter:
    from collectors.training import RunExporter

    from testbed.plan.actions import TargetFile
    from testbed.monitor.sd import targets_dir

    target = targets_dir() / f"run-{tb.name}-{run_id}.json"
    ledger = Ledger(tb.name)
    with ledger.lock():  # recorded first: `testbed down` removes it if this process dies
        ledger.record(TargetFile(str(target)).to_dict())
    return RunExporter(run_dir, target, token=auth.token() if auth.required() else None)
