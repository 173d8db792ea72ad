"""What Prometheus missed of a run: the testbed's link exporter stopping during it, the
run's own final scrape not taken.

Monitoring is beside the run, never in its way: a link exporter killed mid-run does not
stop the training (links.jsonl still has every sample), but the summary's ``monitoring``
says from when Prometheus has no link samples, and the run says so as it notices.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from testbed.common import procs
from testbed.plan.ledger import Ledger

EXPORTER_ACTION = "StartExporter"
"""The ledger entry (its ``action``) that started a testbed's link exporter."""


class ExporterWatch:
    """The link exporters of testbed ``name`` (found by the marker its ledger recorded),
    checked at every :meth:`check`; ``stopped`` maps each marker to the seconds into the run
    when it was first seen gone."""

    def __init__(self, name: str, t_start: float, say: Callable[[str], None]):
        self.name, self.t_start, self.say = name, t_start, say
        self.markers = [e["marker"] for e in Ledger(name).entries()
                        if e.get("action") == EXPORTER_ACTION and isinstance(e.get("marker"), str)]
        self.alive = {m: bool(procs.with_arg(m)) for m in self.markers}
        self.stopped: dict[str, float] = {}

    def check(self) -> None:
        for m, was in self.alive.items():
            if was and m not in self.stopped and not procs.with_arg(m):
                at = time.time() - self.t_start
                self.stopped[m] = at
                self.say(f"warning: the link exporter of testbed '{self.name}' stopped {at:.1f} s into the run: "
                         "Prometheus gets no link samples from then on (links.jsonl still has them); the run goes on")

    def summary(self, duration: float, final_scrape: bool | None) -> dict:
        """The summary's ``monitoring``: each exporter's fate, and whether Prometheus took the
        run's final records (None: the run served no metrics)."""
        self.check()
        exporters = []
        for m in self.markers:
            e = {"exporter": "links", "marker": m, "running_at_start": self.alive[m]}
            if m in self.stopped:
                at = self.stopped[m]
                e.update(stopped_at_s=round(at, 1),
                         missing=f"link samples from {at:.1f} s to the end of the run ({duration:.1f} s)")
            elif not self.alive[m]:
                e["missing"] = "all link samples: the exporter was not running when the run started"
            exporters.append(e)
        out: dict = {"exporters": exporters, "final_scrape": final_scrape}
        if final_scrape is False:
            out["missing_training"] = "the final records: no scrape came after the run ended (is Prometheus up?)"
        return out


class Every:
    """Calls ``fn`` when called, at most once per ``seconds``."""

    def __init__(self, seconds: float, fn: Callable[[], object]):
        self.seconds, self.fn, self.last = seconds, fn, time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.last >= self.seconds:
            self.last = time.monotonic()
            self.fn()
