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
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.common.version import __version__
from testbed.engine.apply import ignore_interrupts, interrupt_on
from testbed.engine.core import DIRECTIONS, Testbed, list_testbeds
from testbed.plan.ledger import Ledger, global_lock
from testbed.common.errors import TestbedError
from testbed.runs.launch import Launcher, RankFailed, host_gpus, placement
from testbed.common.files import JsonlTail, read_jsonl, write_json
from testbed.model.topology import SHIPPED_DIR, Link, Shape, load_topology
from testbed.model.units import Rate

DEFAULT_TOPOLOGY = SHIPPED_DIR / "three_switch.yaml"
MIN_WIRE_FRACTION = 0.25
"""The bottlenecks must carry at least this fraction of the bytes one rank handed to
collectives. An all-reduce or all-gather across a cut moves at least a full vector per
direction, so a real run is far above it (2x to 7x on the shipped topologies)."""


class RunInterrupted(TestbedError):
    pass


class TrafficBypassed(TestbedError):
    pass


@dataclass
class RunRequest:
    scheme: str
    workload_args: list[str]
    """Arguments for ``python -m workloads.train`` other than --scheme/--out/--iface."""
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
    exporter: bool = True
    """Serve the run's training metrics (and a testbed brought up here, its link metrics) to
    Prometheus, announced through file-SD target files."""

    @property
    def compute_backend(self) -> str:
        """The workload's ``--backend`` (auto, gloo or nccl; the last one given wins, as in argparse)."""
        value = "auto"
        for i, a in enumerate(self.workload_args):
            if a == "--backend" and i + 1 < len(self.workload_args):
                value = self.workload_args[i + 1]
            elif a.startswith("--backend="):
                value = a.partition("=")[2]
        return value


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


def _code_version() -> str:
    here = Path(__file__).resolve().parent.parent
    try:
        r = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, timeout=5)
        return r.stdout.strip() if r.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


class _LinkSampler:
    """Samples the bottleneck counters into links.jsonl and the live utilisation."""

    def __init__(self, tb: Testbed, links: list[Link], path: Path, live_shapes: bool = False):
        self.tb, self.links, self.f = tb, links, open(path, "a", buffering=1, encoding="utf-8")
        self.live_shapes = live_shapes
        """Read the shapes in force from the state file at every sample (a trace changes them)."""
        self.prev: dict | None = None
        self.prev_t = 0.0
        self.util: dict[str, float] = {}

    def _current(self) -> list[Link]:
        state = Ledger(self.tb.name).read_state() if self.live_shapes else None
        if state is None:
            return self.links
        from testbed.model.topology import load_topology_dict

        now = load_topology_dict(state["topology"], source=state.get("source")).links
        return [now[l.index] for l in self.links]

    def sample(self) -> dict:
        now = time.time()
        counters = self.tb.link_counters(self.links)
        links = self._current()
        if self.prev is not None and now > self.prev_t:
            dt = now - self.prev_t
            for l in links:
                for d in DIRECTIONS:
                    c, p = counters.get((l.index, d), {}), self.prev.get((l.index, d), {})
                    rate = l.shape(d).rate.bps
                    delta = c.get("bytes", 0) - p.get("bytes", 0)
                    util = delta * 8 / dt / rate
                    self.util[f"{l.name} {d}"] = util
                    self.f.write(json.dumps({"time": now, "link": l.name, "direction": d,
                                             "bytes": c.get("bytes", 0), "drops": c.get("drops", 0),
                                             "rate_bps": rate, "bytes_per_s": delta / dt,
                                             "utilisation": util}) + "\n")
        self.prev, self.prev_t = counters, now
        return counters

    def close(self):
        self.f.close()


def _install_signals() -> Callable[[], None]:
    """SIGTERM (and SIGHUP) behave like Ctrl-C: unwind through the cleanup. Returns what
    puts every handler back (SIGINT's too, which the cleanup ignores)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {signal.SIGINT: signal.getsignal(signal.SIGINT), **interrupt_on()}
    return lambda: [signal.signal(s, h) for s, h in old.items()]


def _ignore_interrupts() -> None:
    ignore_interrupts((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def obtain_testbed(name: str | None, topology: Path | None, say: Callable[[str], None],
                   exporter: bool = True) -> tuple[Testbed, bool]:
    """The running testbed ``name``, or a new one from ``topology``; True when made here."""
    if name:
        return Testbed.attach(name), False
    topo = load_topology(topology or DEFAULT_TOPOLOGY)
    if any(t["name"] == topo.name for t in list_testbeds()):
        raise TestbedError(f"a testbed named '{topo.name}' is already up",
                           f"use it with --testbed {topo.name}, or take it down first")
    say(f"bringing up {topo.name} ({len(topo.workers)} workers)")
    return Testbed.up(topo, exporter="127.0.0.1:0" if exporter else None), True


def check_out(out: Path) -> None:
    """``--out`` must take files before anything is built (a clear error, nothing left)."""
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".testbed-write-check-"):
            pass
    except OSError as e:
        raise TestbedError(f"--out {out}: cannot write there ({e.strerror or e})",
                           "choose a writable directory with free space") from None


@contextlib.contextmanager
def run_lock(tb: Testbed):
    """One run at a time per testbed: two would share the rendezvous port and each other's
    counters. An flock, so a run that died holds nothing."""
    import fcntl

    path = Ledger(tb.name).dir / "run.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise TestbedError(f"testbed '{tb.name}' is busy with another run (pid {other or '?'})",
                               "wait for it to finish, or use another testbed") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def run(req: RunRequest, on_status: Callable[[Status], None] | None = None,
        on_message: Callable[[str], None] | None = None) -> dict:
    say = on_message or (lambda m: None)
    gpus = _gpus_for(req.compute_backend)
    check_out(req.out)
    trace = _load_trace(req)
    restore_signals = _install_signals()
    tb: Testbed | None = None
    created = False
    restore: list[tuple[Link, str, Shape]] = []
    replayer = None
    traffic = None
    launcher: Launcher | None = None
    sampler: _LinkSampler | None = None
    run_dir: Path | None = None
    exporter = None
    lock = contextlib.ExitStack()
    try:
        tb, created = obtain_testbed(req.testbed, req.topology, say, req.exporter)
        lock.enter_context(run_lock(tb))
        if len(tb.workers) < 1:
            raise TestbedError(f"testbed '{tb.name}' has no worker nodes")
        from testbed.runs.traffic import CrossTraffic, check_flows, stop_leftovers

        flows = list(tb.topology.traffic if req.cross_traffic is None else req.cross_traffic)
        check_flows(flows, [w.name for w in tb.workers])
        stop_leftovers(tb.name)  # flows a killed run left running
        bottlenecks = [l for l in tb.topology.links if l.bottleneck]
        if not bottlenecks:
            raise TestbedError(f"testbed '{tb.name}' has no bottleneck links, so the run cannot prove "
                               f"its traffic crossed shaped links",
                               "mark the links between switches with 'bottleneck: true' in the topology")
        if req.bw is not None or trace is not None:
            from testbed.engine.replay import running_background

            if busy := running_background(tb.name):
                raise TestbedError(f"testbed '{tb.name}' has {len(busy)} trace replay(s) running in the background "
                                   f"(pid {', '.join(str(b['pid']) for b in busy)}), which would fight --bw/--bw-trace",
                                   "stop them with `testbed link replay --stop`, or run without --bw/--bw-trace")
        if trace is not None:
            from testbed.engine.replay import check as check_trace

            check_trace(bottlenecks, trace)  # refused before anything changes
        if req.bw is not None or trace is not None:
            for l in bottlenecks:
                for d in DIRECTIONS:
                    restore.append((l, d, l.shape(d)))
        if req.bw is not None:
            tb.set_links(bottlenecks, rate=req.bw)
        bottlenecks = [l for l in tb.topology.links if l.bottleneck]  # the shapes now in force

        run_id = req.run_id or new_run_id(req.out, req.scheme, "trace" if trace is not None else req.bw)
        run_dir = req.out / run_id
        run_dir.mkdir(parents=True, exist_ok=False)
        shapes = {l.name: {d: l.shape(d).to_dict() for d in DIRECTIONS} for l in bottlenecks}
        request = {"scheme": req.scheme, "workload_args": req.workload_args, "bw": str(req.bw) if req.bw else None,
                   "testbed": tb.name, "created_testbed": created, "timeout_s": req.timeout, **req.extra}
        if flows:
            request["cross_traffic"] = [f.to_dict() for f in flows]
        if trace is not None:
            request["bw_trace"] = {"file": str(req.bw_trace), "format": req.trace_format, "window_s": req.trace_window,
                                   "loop": trace.loop, "steps": len(trace.steps), "period_s": trace.period_s}
        seats = placement(tb.topology)
        write_json(run_dir / "run.json", {
            "run_id": run_id, "request": request, "bottlenecks": shapes,
            "workers": [{"rank": w.rank, "node": w.name, "address": w.address, "iface": w.iface, "gpu": w.gpu,
                         "switch": seat.switch} for w, seat in zip(tb.workers, seats)],
            "testbed_version": __version__, "code_version": _code_version()})
        write_json(run_dir / "topology.json", tb.topology.to_dict())

        scheme_arg = ["--scheme", req.scheme] if req.module == "workloads.train" else []
        wargs, mounts = host_paths(req.workload_args)
        argv = [req.module, *scheme_arg, *wargs, "--out", str(run_dir.resolve())]
        if req.exporter:
            exporter = _start_run_exporter(tb, run_id, run_dir)
        sampler = _LinkSampler(tb, bottlenecks, run_dir / "links.jsonl", live_shapes=trace is not None)
        if trace is not None:
            from testbed.engine.replay import start_background

            replayer = start_background(tb.name, req.bw_trace, fmt=req.trace_format, window_s=req.trace_window,
                                        loop=req.trace_loop, log=run_dir / "trace.jsonl", while_pid=os.getpid(),
                                        start_on=run_dir / "config.json")  # 0 s: when training starts
            say(f"the bottleneck links follow {req.bw_trace} (steps in {run_dir / 'trace.jsonl'})")
        if flows:
            traffic = CrossTraffic(tb, flows, run_dir)
            traffic.start()
            say(f"cross-traffic: {'; '.join(f.label() for f in flows)} (per second in {run_dir / 'traffic.jsonl'})")
        start_counters = sampler.sample()
        t_start = time.time()
        launcher = Launcher(tb, argv, run_dir, timeout=req.timeout, mounts=mounts, seats=seats, gpus=gpus)
        say(f"run {run_id}: {len(tb.workers)} ranks of {req.scheme} on {tb.name}; records in {run_dir}")
        launcher.start()
        status = Status(run_dir, world=len(tb.workers))
        rank0, evals = JsonlTail(run_dir / "rank0.jsonl"), JsonlTail(run_dir / "eval.jsonl")
        last_sample = [time.monotonic()]

        def tick():
            if time.monotonic() - last_sample[0] >= 1.0:
                sampler.sample()
                last_sample[0] = time.monotonic()
                status.utilisation = dict(sampler.util)
                if traffic is not None:
                    traffic.flush(run_dir / "traffic.jsonl")
            r, e = rank0.poll(), evals.poll()
            if r:
                status.iteration, status.epoch, status.loss = r["iter"], r.get("epoch", 0), r.get("loss")
            if e:
                status.accuracy = e["accuracy"]
            if status.total is None and (run_dir / "config.json").exists():
                try:
                    status.total = json.loads((run_dir / "config.json").read_text())["iterations"]
                except (ValueError, KeyError):
                    pass
            if on_status:
                on_status(status)

        launcher.wait(tick)
        end_counters = sampler.sample()
        duration = time.time() - t_start
        if replayer is not None:
            replayer.stop()  # the shapes from before are put back
        if traffic is not None:
            traffic.stop()
            traffic.flush(run_dir / "traffic.jsonl")
        summary = _summarise(run_dir, run_id, request, bottlenecks, start_counters, end_counters, duration, shapes)
        if trace is not None:
            rates, late = RateTimeline.from_run(run_dir, shapes)
            _trace_summary(summary, run_dir, req.bw_trace, rates, late, t_start, duration)
        if traffic is not None:
            summary["cross_traffic"] = traffic.summary(t_start, t_start + duration)
        write_json(run_dir / "summary.json", summary)
        if exporter is not None:
            exporter.finish()  # Prometheus gets the final records before the exporter goes
            exporter.close()
            exporter = None
        if trace is not None:
            annotate_rates(run_dir, summary.get("world_size", 0), rates)
        payload = (summary.get("mean_payload_bytes") or 0) * (summary.get("iterations") or 0)
        wire = summary["bottleneck"]["bytes"]
        if payload and wire < MIN_WIRE_FRACTION * payload:
            summary["status"] = "bypassed"
            write_json(run_dir / "summary.json", summary)
            raise TrafficBypassed(
                f"the collective traffic did not cross the bottleneck links: they carried {wire} bytes while "
                f"each rank handed {payload:.0f} bytes to collectives", "the summary in "
                f"{run_dir} says which links were counted; are the ranks on both sides of a bottleneck?")
        return summary
    except KeyboardInterrupt:
        _ignore_interrupts()  # from here on nothing interrupts the cleanup (restored at the end)
        if launcher:
            launcher.stop()
        _mark(run_dir, "interrupted", "interrupted by a signal")
        raise RunInterrupted("interrupted: all ranks stopped, shaping restored, the testbed removed if the "
                             "run made it", f"records so far are in {run_dir}" if run_dir else None) from None
    except RankFailed as e:
        _mark(run_dir, "failed", e.message)
        raise
    finally:
        # cleanup runs to the end: a second Ctrl-C or SIGTERM is ignored until it is done
        _ignore_interrupts()
        try:
            if launcher:
                launcher.stop()
            if replayer is not None:
                replayer.stop()
            if traffic is not None:
                traffic.stop()
                if run_dir is not None:
                    traffic.flush(run_dir / "traffic.jsonl")
            if exporter is not None:
                exporter.close()
            if sampler:
                sampler.close()
            if tb is not None:
                if restore and not created:
                    for l, d, shape in restore:
                        try:
                            tb.set_links([l], rate=shape.rate, delay=shape.delay, loss=shape.loss, direction=d)
                        except TestbedError:
                            pass  # the testbed went away meanwhile
                lock.close()
                if created:
                    tb.down()
        finally:
            restore_signals()


PATH_FLAGS = {"--init": "file", "--data-dir": "dir"}
"""Workload arguments that name host files: made absolute, and their directories mounted
into container workers at the same path."""


def _gpus_for(backend: str) -> list[int]:
    """The host GPUs that workers without ``gpu:`` share in this run: all of them for a
    GPU run (auto or nccl), none for gloo (CPU ranks). nccl on a host without GPUs is
    refused before anything starts."""
    if backend == "gloo":
        return []
    gpus = host_gpus()
    if backend == "nccl" and not gpus:
        raise TestbedError("--backend nccl needs NVIDIA GPUs, and this host has none (nvidia-smi lists none)",
                           "use --backend gloo (CPU ranks), or run where `testbed doctor` shows GPUs")
    return gpus


def host_paths(args: list[str]) -> tuple[list[str], list[Path]]:
    """``args`` with the paths of PATH_FLAGS made absolute, and the directories they need."""
    out, mounts = list(args), []
    for i, a in enumerate(args[:-1]):
        kind = PATH_FLAGS.get(a)
        if kind:
            p = Path(args[i + 1]).resolve()
            out[i + 1] = str(p)
            mounts.append(p.parent if kind == "file" else p)
    return out, list(dict.fromkeys(mounts))


def _start_run_exporter(tb: Testbed, run_id: str, run_dir: Path):
    from collectors.training import RunExporter

    from testbed.plan.actions import TargetFile
    from testbed.monitor.sd import targets_dir

    target = targets_dir() / f"run-{tb.name}-{run_id}.json"
    with global_lock():  # recorded first: `testbed down` removes it if this process dies
        Ledger(tb.name).record(TargetFile(str(target)).to_dict())
    return RunExporter(run_dir, target)


def _mark(run_dir: Path | None, status: str, error: str) -> None:
    if run_dir is None or not run_dir.exists():
        return
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        summary = {}
    run = json.loads((run_dir / "run.json").read_text())
    summary.update(run_id=run["run_id"], status=status, error=error, request=run["request"],
                   bw=run["request"]["bw"], scheme=run["request"]["scheme"])
    write_json(path, summary)


def _summarise(run_dir, run_id, request, links, start, end, duration, shapes) -> dict:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except FileNotFoundError:
        raise TestbedError(f"the ranks exited 0 but wrote no summary.json in {run_dir}") from None
    per = {}
    total = 0
    util = []
    for l in links:
        for d in DIRECTIONS:
            b = end.get((l.index, d), {}).get("bytes", 0) - start.get((l.index, d), {}).get("bytes", 0)
            rate = l.shape(d).rate.bps
            per[f"{l.name} {d}"] = {"bytes": b, "rate_bps": rate,
                                    "drops": end.get((l.index, d), {}).get("drops", 0)
                                    - start.get((l.index, d), {}).get("drops", 0),
                                    "utilisation": b * 8 / duration / rate if duration > 0 else None}
            total += b
            util.append(per[f"{l.name} {d}"]["utilisation"] or 0)
    iters = summary.get("iterations") or 0
    rates = sorted({s["rate"] for dirs in shapes.values() for s in dirs.values()})
    summary.update({
        "run_id": run_id, "run_dir": str(run_dir), "status": "ok", "request": request,
        "bw": request["bw"] or (rates[0] if len(rates) == 1 else ",".join(rates)),
        "topology": request["testbed"], "bottleneck_shapes": shapes,
        "bottleneck": {"bytes": total, "bytes_per_iteration": total / iters if iters else None,
                       "links": per, "max_utilisation": max(util) if util else None,
                       "mean_utilisation": sum(util) / len(util) if util else None},
        "run_s": duration, "testbed_version": __version__, "code_version": _code_version(),
    })
    # what each rank's interface put on the wire, from the records (tx counters)
    wire = []
    for r in range(summary.get("world_size", 0)):
        tx = [x["tx_bytes"] for x in read_jsonl(run_dir / f"rank{r}.jsonl") if x.get("tx_bytes") is not None]
        if len(tx) >= 2:
            wire.append((tx[-1] - tx[0]) / (len(tx) - 1))
    summary["mean_wire_tx_bytes_per_iteration"] = sum(wire) / len(wire) if wire else None
    return summary


def _load_trace(req: RunRequest):
    """The run's bandwidth trace, read and checked before anything is built (None: no trace)."""
    if req.bw_trace is None:
        return None
    if req.bw is not None:
        raise TestbedError("--bw and --bw-trace both set the bottleneck rate", "give one of them")
    from testbed.model.trace import load_trace

    trace = load_trace(req.bw_trace, req.trace_format, req.trace_window, req.trace_loop)
    if trace.needs_netem:
        from testbed.net.probe import netem_missing

        if detail := netem_missing():
            from testbed.net.tc import NETEM_MISSING_HINT

            raise TestbedError(f"--bw-trace {req.bw_trace}: its delay/loss columns need the netem qdisc, which this "
                               f"kernel lacks ({detail})", NETEM_MISSING_HINT)
    return trace


class RateTimeline:
    """The bottleneck rate over a run, from the replay's trace.jsonl: ``initial`` (the
    shape from before) until the first applied step, then each step's rate. Lookups are
    bisections, so annotating every record of a long run against a long trace stays cheap."""

    def __init__(self, steps: list[tuple[float, float]], initial: float | None):
        steps = sorted(steps)
        self.times = [t for t, _ in steps]
        self.rates = [r for _, r in steps]
        self.initial = initial

    @classmethod
    def from_run(cls, run_dir: Path, shapes: dict) -> tuple["RateTimeline", list[float]]:
        """The timeline, and each applied step's lateness (s), read from the run's trace.jsonl."""
        from testbed.model.units import Rate, UnitError

        steps, late = [], []
        for r in read_jsonl(run_dir / "trace.jsonl"):
            if r.get("event") != "step" or not isinstance(r.get("time"), (int, float)):
                continue
            try:
                steps.append((float(r["time"]), float(Rate.parse(str(r["rate"])).bps)))
            except UnitError:
                continue
            if isinstance(r.get("late_s"), (int, float)):
                late.append(r["late_s"])
        rates = {Rate.parse(s["rate"]).bps for dirs in shapes.values() for s in dirs.values()}
        return cls(steps, float(min(rates)) if rates else None), sorted(late)

    def at(self, t: float) -> float | None:
        i = bisect.bisect_right(self.times, t)
        return self.rates[i - 1] if i else self.initial

    def changes_within(self, t0: float, t1: float) -> bool:
        """A step came strictly between ``t0`` and ``t1``."""
        return bisect.bisect_left(self.times, t1) > bisect.bisect_right(self.times, t0)

    def over(self, t0: float, t1: float) -> float | None:
        """The time-weighted mean rate in force over [t0, t1]."""
        if t1 <= t0:
            t0 = t1 - 1e-9
        cuts = [t0, *self.times[bisect.bisect_right(self.times, t0):bisect.bisect_left(self.times, t1)], t1]
        total, covered = 0.0, 0.0
        for a, b in zip(cuts, cuts[1:]):
            rate = self.at(a)
            if rate is not None:
                total += rate * (b - a)
                covered += b - a
        return total / covered if covered > 0 else None


def annotate_rates(run_dir: Path, world: int, rates: RateTimeline) -> None:
    """Each iteration's record gets ``link_rate_bps``: the bottleneck rate in force while it
    ran (time-weighted over [time - iter_s, time]). The files are replaced whole."""
    for r in range(world):
        path = run_dir / f"rank{r}.jsonl"
        recs = read_jsonl(path)
        if not recs:
            continue
        for x in recs:
            t, dt = x.get("time"), x.get("iter_s")
            if isinstance(t, (int, float)) and isinstance(dt, (int, float)):
                x["link_rate_bps"] = rates.over(t - dt, t)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(x) + "\n" for x in recs))
        os.replace(tmp, path)


def _trace_summary(summary: dict, run_dir: Path, trace_file: Path, rates: RateTimeline, late: list[float],
                   t_start: float, duration: float) -> None:
    """What the trace did during the run: steps applied, their lateness, the mean capacity
    (utilisation is measured against it), and the mean iteration time at each rate (only
    iterations that ran wholly at one rate)."""
    import statistics

    by_rate: dict[float, list[float]] = {}
    for x in read_jsonl(run_dir / "rank0.jsonl"):
        t, dt = x.get("time"), x.get("iter_s")
        if isinstance(t, (int, float)) and isinstance(dt, (int, float)):
            if rates.changes_within(t - dt, t):
                continue  # a step came while it ran
            rate = rates.over(t - dt, t)
            if rate is not None:
                by_rate.setdefault(round(rate), []).append(dt)
    summary["bw"] = f"trace {trace_file.name}"
    capacity = rates.over(t_start, t_start + duration)
    b = summary["bottleneck"]
    if capacity and duration > 0:
        for v in b["links"].values():
            v["rate_bps"], v["utilisation"] = capacity, v["bytes"] * 8 / duration / capacity
        util = [v["utilisation"] for v in b["links"].values()]
        b["max_utilisation"], b["mean_utilisation"] = max(util), sum(util) / len(util)
    summary["bw_trace"] = {
        "file": str(trace_file), "steps_applied": len(late), "mean_rate_bps": capacity,
        "late_s": {"median": statistics.median(late), "max": late[-1]} if late else None,
        "iterations_by_rate": [{"rate_bps": r, "iterations": len(v), "mean_iter_s": statistics.fmean(v)}
                               for r, v in sorted(by_rate.items())]}
