"""`testbed run`: one training run of a scheme across an emulated network.

    run(request) -> summary
      testbed: attach to --testbed NAME (left up), or bring up the topology (torn down after)
      --bw: set on the bottleneck links for the run, previous rates restored afterwards
      --bw-trace: the bottleneck links follow a trace during the run (a background replay,
        its steps in trace.jsonl), the shapes from before restored afterwards; each
        iteration's record gets the rate in force while it ran (link_rate_bps)
      tc byte counters of the bottleneck links read at start and end (and sampled into
        links.jsonl every second): the proof that the collectives crossed the shaped links
      one rank per worker (testbed.runs.launch), records into runs/<run_id>/
      summary.json: the workload's summary plus bw, topology, wire bytes, utilisation,
        versions, status

Failures (a rank dies or hangs, Ctrl-C, SIGTERM) stop every rank, restore the shaping and
remove what the run created; the records written so far stay.

This module is the run's order of steps; each step's work lives in its own module:
request (RunRequest, Status, run ids), checks (inputs refused before anything changes),
testbeds (obtain a testbed, the run lock), interrupts (signals), rundir (run.json),
exporter (Prometheus), sampling (links.jsonl, progress), timeline (--bw-trace rates),
summary (summary.json and the tc-counter proof). Their public names are re-exported here.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from testbed.common.errors import TestbedError
from testbed.common.files import write_json
from testbed.common.outdir import own_dir
from testbed.common.writes import WriteFailed
from testbed.model.topology import DIRECTIONS
from testbed.engine.core import Testbed
from testbed.model.topology import Link, Shape
from testbed.runs import dilation
from testbed.runs.checks import check_out, check_testbed, discard_out, gpus_for, load_trace
from testbed.runs.exporter import start_run_exporter
from testbed.runs.diskfull import as_disk_failure
from testbed.runs.interrupts import RunInterrupted, ignore_interrupts, install_signals
from testbed.runs.launch import Launcher, Seat
from testbed.runs.monitoring import Every, ExporterWatch
from testbed.runs.request import RunRequest, Status, new_run_id, variant_slug
from testbed.runs.spec import WorkloadSpec
from testbed.runs.rundir import bottleneck_shapes, request_record, write_run_files
from testbed.runs.sampling import LinkSampler, Progress, TrainStart, train_start
from testbed.runs.proof import TrafficBypassed, TrafficUnproven, apply, prove, refuse
from testbed.runs.summary import mark, rank_tx_bytes, summarise
from testbed.runs.reports.tensorboard import RunEvents
from testbed.runs.testbeds import DEFAULT_TOPOLOGY, obtain_testbed, run_lock
from testbed.runs.reports.timeline import RateTimeline, annotate_rates, trace_summary
from testbed.runs.userrecords import summary_from_records, write_config

if TYPE_CHECKING:
    from collectors.training import RunExporter
    from testbed.engine.replay import Background
    from testbed.model.trace import Trace
    from testbed.runs.traffic import CrossTraffic

__all__ = [  # the names callers import from here (the CLI, sweep, benchmarks, tests)
    "DEFAULT_TOPOLOGY", "RateTimeline", "RunInterrupted", "RunRequest", "Status", "TrafficBypassed",
    "TrafficUnproven", "WorkloadSpec", "annotate_rates", "check_out", "new_run_id", "obtain_testbed", "run",
    "run_lock", "variant_slug",
]

_T = TypeVar("_T")


def run(req: RunRequest, on_status: Callable[[Status], None] | None = None,
        on_message: Callable[[str], None] | None = None) -> dict:
    """One training run (see the module's docstring); ``on_status`` gets the progress about
    twice a second, ``on_message`` one line per thing the run does."""
    gpus = gpus_for(req.compute_backend)  # the inputs, checked before anything is built
    made = check_out(req.out)
    try:
        return _run_checked(req, gpus, on_status, on_message or (lambda m: None))
    except BaseException:
        discard_out(req.out, made)  # only what stayed empty: a refused run leaves no --out behind
        raise


def _run_checked(req: RunRequest, gpus: list[int], on_status, say: Callable[[str], None]) -> dict:
    dilation.check(req)
    if req.dilation != 1:  # the ranks sleep K x the stated compute and divide what they record
        spec = _present(req.workload, "workload spec")  # dilation.check refused a dilated run without one
        req.spec = spec.replace(dilation=req.dilation)
    trace = load_trace(req)
    restore_signals = install_signals()
    r = _Run(req, trace, say)
    try:
        r.get_testbed()
        r.check_and_set_links()
        r.open_run_dir()
        r.start_alongside()
        r.launch(gpus)
        r.watch(on_status)
        r.collect()
        summary = r.write_summary()
        refuse(summary, _present(r.run_dir, "run directory"))  # the proof: a run that is not "ok" ends in its error
        return summary
    except KeyboardInterrupt:
        ignore_interrupts()  # from here on nothing interrupts the cleanup (restored at the end)
        if r.launcher:
            r.launcher.stop()
        mark(r.run_dir, "interrupted", "interrupted by a signal")
        raise RunInterrupted("interrupted: all ranks stopped, shaping restored, the testbed removed if the "
                             "run made it", f"records so far are in {r.run_dir}" if r.run_dir else None) from None
    except (TrafficBypassed, TrafficUnproven):
        raise  # its summary says "bypassed" or "unproven" already
    except TestbedError as e:  # a rank failed, a write failed, a node refused its rank
        failure = as_disk_failure(e, r.run_dir)
        try:
            mark(r.run_dir, "failed", failure.message)
        except WriteFailed:
            pass  # the disk is full: the error says what was kept
        if failure is e:
            raise
        raise failure from None
    finally:
        # cleanup runs to the end: a second Ctrl-C or SIGTERM is ignored until it is done
        ignore_interrupts()
        try:
            r.clean_up()  # ranks stopped, shapes restored, a testbed made here taken down
        finally:
            restore_signals()


def _present(value: _T | None, what: str) -> _T:
    """``value``, which an earlier step of the run made; RuntimeError naming ``what`` when
    it is missing (the steps ran out of order: a bug)."""
    if value is None:
        raise RuntimeError(f"the run has no {what} at this step")
    return value


class _Run:
    """One run's steps, in the order :func:`run` takes them, and everything they started or
    changed (None until started), which :meth:`clean_up` stops, restores or removes."""

    def __init__(self, req: RunRequest, trace: Trace | None, say: Callable[[str], None]):
        self.req, self.trace, self.say = req, trace, say
        self.tb: Testbed | None = None
        self.created = False
        """The testbed was brought up by this run (and is taken down at the end)."""
        self.lock = contextlib.ExitStack()
        self.restore: list[tuple[Link, str, Shape]] = []
        """The bottleneck shapes from before --bw / --bw-trace, put back at the end."""
        self.flows: list = []
        self.bottlenecks: list[Link] = []
        """The bottleneck links with the shapes in force (K times slower in a dilated run)."""
        self.emulated: list[Link] = []
        """The same as the emulation sees them (--bw set, before dilation): what the summary names."""
        self.run_id = ""
        self.run_dir: Path | None = None
        self.request: dict = {}
        self.shapes: dict = {}
        self.seats: list[Seat] = []
        self.argv: list[str] = []
        self.mounts: list[Path] = []
        self.exporter: RunExporter | None = None
        self.sampler: LinkSampler | None = None
        self.replayer: Background | None = None
        self.traffic: CrossTraffic | None = None
        self.launcher: Launcher | None = None
        self.monitor: ExporterWatch | None = None
        """The testbed's link exporters, watched while the ranks run."""
        self.start_counters: dict = {}
        self.end_counters: dict = {}
        self.start_all: dict = {}
        self.end_all: dict = {}
        """Counters of every link before the first rank starts and after the last one exits:
        the proof's measured bytes (and what each rank put on its own link)."""
        self.t_start, self.duration, self.t_end = 0.0, 0.0, 0.0
        self.train_start: TrainStart | None = None
        self.events: RunEvents | None = None
        """--tensorboard: the event files, brought up to date every second and at the end."""

    def get_testbed(self) -> None:
        """Attach or bring up the testbed, and hold its run lock."""
        self.tb, self.created = obtain_testbed(self.req.testbed, self.req.topology, self.say, self.req.exporter)
        self.lock.enter_context(run_lock(self.tb))

    def check_and_set_links(self) -> None:
        """The testbed can take the run; --bw set on the bottlenecks (their shapes from before
        kept for the end, also for --bw-trace)."""
        req, tb = self.req, _present(self.tb, "testbed")
        self.flows, bottlenecks = check_testbed(tb, req, self.trace)
        dilation.check_flows(self.flows, req.dilation)
        if req.dilation != 1:
            self.restore = [(l, d, l.shape(d)) for l in tb.topology.links for d in DIRECTIONS]
        elif req.bw is not None or self.trace is not None:
            for l in bottlenecks:
                for d in DIRECTIONS:
                    self.restore.append((l, d, l.shape(d)))
        if req.bw is not None:
            tb.set_links(bottlenecks, rate=req.bw)
        self.emulated = [l for l in tb.topology.links if l.bottleneck]  # as the emulation sees them
        if req.dilation != 1:
            dilation.slow_down(tb, req.dilation)
            self.say(f"time dilation {req.dilation:g}: every link {req.dilation:g} times slower, the compute "
                     f"{req.dilation:g} x --compute-time; times recorded / {req.dilation:g}")
        self.bottlenecks = [l for l in tb.topology.links if l.bottleneck]  # the shapes now in force

    def open_run_dir(self) -> None:
        """runs/<run_id>/ with run.json and topology.json, and the ranks' command, which writes there."""
        req, tb, trace = self.req, _present(self.tb, "testbed"), self.trace
        self.run_id = req.run_id or new_run_id(req.out, req.scheme, "trace" if trace is not None else req.bw)
        self.run_dir = run_dir = req.out / self.run_id
        own_dir(run_dir, fresh=True)  # private: the ranks' records are the user's
        self.shapes = bottleneck_shapes(self.emulated)
        self.request = request_record(req, tb, self.created, self.flows, trace)
        self.seats = write_run_files(run_dir, self.run_id, self.request, self.shapes, tb)
        if req.code is not None:  # the user's own code: its arguments as given, its directory reachable
            self.argv = ["workloads.userscript", *req.code.argv(), *req.args]
            self.mounts = [req.code.path]
            write_config(run_dir, req, len(tb.workers))
            return
        spec = req.workload
        if spec is None:  # another module of ours (workloads.collective): its arguments as given
            self.argv = [req.module, *req.args, "--out", str(run_dir.resolve())]
            return
        self.argv = [req.module, *spec.argv(out=run_dir.resolve())]  # the spec's one rendering
        self.mounts = spec.mounts()

    def start_alongside(self) -> None:
        """What runs beside the ranks: the metrics exporter, the link sampler, the trace
        replay and the cross-traffic flows."""
        req, tb, run_dir = self.req, _present(self.tb, "testbed"), _present(self.run_dir, "run directory")
        if req.exporter:
            self.exporter = start_run_exporter(tb, self.run_id, run_dir)
        self.sampler = LinkSampler(tb, self.bottlenecks, run_dir / "links.jsonl", live_shapes=self.trace is not None)
        if self.trace is not None:
            from testbed.engine.replay import start_background

            path, fmt, loop = req.bw_trace, req.trace_format, req.trace_loop
            if req.dilation != 1:  # its times x K, its rates / K (a Mahimahi trace's loop kept)
                path, fmt, loop = dilation.dilate_trace(self.trace, req.dilation, run_dir / "trace-dilated.csv"), \
                    "csv", self.trace.loop
            self.replayer = start_background(tb.name, path, fmt=fmt, window_s=req.trace_window,
                                             loop=loop, log=run_dir / "trace.jsonl", while_pid=os.getpid(),
                                             start_on=run_dir / "config.json")  # 0 s: when training starts
            self.say(f"the bottleneck links follow {req.bw_trace} (steps in {run_dir / 'trace.jsonl'})")
        if self.flows:
            from testbed.runs.traffic import CrossTraffic

            self.traffic = CrossTraffic(tb, self.flows, run_dir)
            self.traffic.start()
            self.say(f"cross-traffic: {'; '.join(f.label() for f in self.flows)} "
                     f"(per second in {run_dir / 'traffic.jsonl'})")

    def launch(self, gpus: list[int]) -> None:
        """The counters at the start, then one rank per worker."""
        req, tb, run_dir = self.req, _present(self.tb, "testbed"), _present(self.run_dir, "run directory")
        self.start_counters = _present(self.sampler, "link sampler").sample()
        self.start_all = tb.link_counters()
        self.t_start = time.time()
        self.train_start = train_start(tb, self.bottlenecks, run_dir, self.t_start)  # rank 0 on any host
        self.monitor = ExporterWatch(tb.name, self.t_start, self.say)
        if req.tensorboard:
            self.events = RunEvents(run_dir, run_dir / "tensorboard")
        self.launcher = Launcher(tb, self.argv, run_dir, timeout=req.timeout * req.dilation, mounts=self.mounts,
                                 seats=self.seats, gpus=gpus,
                                 code=req.code.tree(req.out) if req.code is not None else None)
        self.say(f"run {self.run_id}: {len(tb.workers)} ranks of {req.scheme} on {tb.name}; records in {run_dir}")
        self.launcher.start()

    def watch(self, on_status: Callable[[Status], None] | None) -> None:
        """Until every rank has exited 0 (RankFailed when one fails or the run times out)."""
        progress = Progress(_present(self.run_dir, "run directory"), len(_present(self.tb, "testbed").workers),
                            _present(self.sampler, "link sampler"), self.traffic, on_status)
        every = Every(1.0, _present(self.monitor, "exporter watch").check)
        events = Every(1.0, self.events.update) if self.events is not None else None

        def tick():
            progress.tick()
            every()
            if events is not None:
                events()
        _present(self.launcher, "launcher").wait(tick)

    def collect(self) -> None:
        """The counters at the end; the trace replay (shapes from before put back) and the
        cross-traffic stopped, the flows' last reports written."""
        self.end_counters = _present(self.sampler, "link sampler").sample()
        self.end_all = _present(self.tb, "testbed").link_counters()
        self.t_end = time.time()
        self.duration = self.t_end - self.t_start
        if self.train_start is not None:
            self.train_start.stop()
        if self.replayer is not None:
            self.replayer.stop()  # the shapes from before are put back
        if self.traffic is not None:
            self.traffic.stop()
            self.traffic.flush(_present(self.run_dir, "run directory") / "traffic.jsonl")
        if self.events is not None:
            self.events.update()  # every rank's last records (another host's are here by now)

    def _workload(self) -> str:
        """What the ranks run, for the proof (testbed.runs.volume.WORKLOADS)."""
        if self.req.code is not None:
            return "code"
        return "trainer" if self.req.module == "workloads.train" else "module"

    def write_summary(self) -> dict:
        """summary.json, written by testbed once (it replaces the workload's part rank 0 wrote;
        the user's code's part is made from its records in memory). With the exporter on,
        the proof is written first so that the exporter's last scrape serves it, and the
        summary once more with ``monitoring`` (whether that scrape came): the one exception.
        With a trace, each record gets its link rate."""
        run_dir, tb, trace = _present(self.run_dir, "run directory"), _present(self.tb, "testbed"), self.trace
        workload = None
        if self.req.code is not None:  # testbed makes its summary's workload part, from the records
            workload = summary_from_records(run_dir, self.req, len(tb.workers), self.t_start, self.duration,
                                            self.say)
        ts = self.train_start  # its counters and time are set together (TrainStart._watch)
        since_train = (ts.counters, self.t_end - ts.time) \
            if ts and ts.counters is not None and ts.time is not None else None
        summary = summarise(run_dir, self.run_id, self.request, self.bottlenecks, self.start_counters,
                            self.end_counters, self.duration, self.shapes, since_train,
                            workload=workload, dilation=self.req.dilation)
        summary["rank_tx_bytes"] = rank_tx_bytes(tb, self.start_all, self.end_all)
        ranks = {w.name: _present(w.rank, f"rank of worker {w.name}") for w in tb.workers}
        apply(summary, prove(run_dir, tb.topology, ranks, self.start_all, self.end_all, self._workload()))
        if trace is not None:
            rates, late = RateTimeline.from_run(run_dir, self.shapes, self.req.dilation)
            trace_file = _present(self.req.bw_trace, "--bw-trace file")  # where the trace was read from
            trace_summary(summary, run_dir, trace_file, rates, late, self.t_start, self.duration)
        if self.traffic is not None:
            summary["cross_traffic"] = self.traffic.summary(self.t_start, self.t_start + self.duration)
        final_scrape = None
        if self.exporter is not None:
            write_json(run_dir / "summary.json", summary)  # what the exporter's last scrape serves
            final_scrape = self.exporter.finish()  # Prometheus gets the final records before the exporter goes
            self.exporter.close()
            self.exporter = None
        summary["monitoring"] = _present(self.monitor, "exporter watch").summary(self.duration, final_scrape)
        write_json(run_dir / "summary.json", summary)
        if trace is not None:
            annotate_rates(run_dir, summary.get("world_size", 0), rates)
        return summary

    def clean_up(self) -> None:
        """Stop what runs, put the shapes back, release the lock, take down a testbed made here."""
        if self.launcher:
            self.launcher.stop()
        if self.train_start is not None:
            self.train_start.stop()
        if self.replayer is not None:
            self.replayer.stop()
        if self.traffic is not None:
            self.traffic.stop()
            if self.run_dir is not None:
                with contextlib.suppress(WriteFailed):  # a full disk: the run's error says so
                    self.traffic.flush(self.run_dir / "traffic.jsonl")
        if self.exporter is not None:
            self.exporter.close()
        if self.events is not None:
            self.events.close()
        if self.sampler:
            with contextlib.suppress(OSError):  # a line the full disk refused, flushed again
                self.sampler.close()
        if self.tb is not None:
            if self.restore and not self.created:
                self._restore_shapes(self.tb)
            self.lock.close()
            if self.created:
                self.tb.down()

    def _restore_shapes(self, tb: Testbed) -> None:
        for l, d, shape in self.restore:
            try:
                tb.set_links([l], rate=shape.rate, delay=shape.delay, loss=shape.loss, direction=d)
            except TestbedError:
                pass  # the testbed went away meanwhile
