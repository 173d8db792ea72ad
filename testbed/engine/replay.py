"""Drive running links through a trace (``testbed link replay``), in the foreground.

Each step is applied in place at its time, as ``link set`` does (HTB's class is changed,
queued packets stay), under the same rules: every distinct step is checked against each
link's shape before the first is applied, so a trace that would be refused half-way is
refused at the start. The state file follows every step, written right after the kernel
has it (under the same lock, before the step returns), so ``link show`` and the
exporter's capacity gauge show the shape in force.

Each applied step is one JSON line (``log``): wall time, the step's scheduled offset,
how late the change was in force (``late_s``: from its scheduled time to the return of
the last tc call), how long applying it took (``apply_s``), how late the state file had
it (``state_s``), the netlink part of applying it (``send_s`` sending the datagrams,
``ack_s`` the kernel's acknowledgements after them) and the values. On an interrupt, or with ``restore``, the shapes from
before the replay are put back.
"""

from __future__ import annotations

import contextlib
import json
import os
import math
import secrets
import signal
import statistics
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TypedDict

from testbed.common import procs
from testbed.common.signals import ignore_interrupts, interrupt_on
from testbed.common.errors import TestbedError
from testbed.common.files import open_regular, tail_text
from testbed.net.tcbatch import LinkChanger
from testbed.model.topology import DIRECTIONS, Link, check_shape
from testbed.plan.actions import StartReplay, recorded
from testbed.plan.ledger import Ledger
from testbed.model.trace import MAX_SPAN_S, Step, Trace
from testbed.model.units import Duration, Loss, Rate

DIRECTION_CHOICES = (*DIRECTIONS, "both")
"""What a change or a replay drives: one direction of each link, or both."""


@dataclass
class ReplayResult:
    steps: list[dict] = field(default_factory=list)
    interrupted: bool = False
    restored: bool = False

    def lateness(self) -> dict:
        """Distribution of ``late_s`` over the applied steps (seconds)."""
        late = sorted(s["late_s"] for s in self.steps)
        if not late:
            return {"steps": 0}
        return {"steps": len(late), "median_s": statistics.median(late),
                "p95_s": late[min(len(late) - 1, round(0.95 * (len(late) - 1)))],
                "p99_s": late[min(len(late) - 1, round(0.99 * (len(late) - 1)))], "max_s": late[-1]}

    def to_dict(self) -> dict:
        return {"steps": self.steps, "lateness": self.lateness(), "interrupted": self.interrupted,
                "restored": self.restored}


class _Changes(TypedDict, total=False):
    """A step's keyword changes to a link's shape (:meth:`dataclasses.replace`)."""

    rate: Rate
    delay: Duration
    loss: Loss


def _changes(step: Step) -> _Changes:
    d: _Changes = {"rate": step.rate}
    if step.delay is not None:
        d["delay"] = step.delay
    if step.loss is not None:
        d["loss"] = step.loss
    return d


@dataclass(frozen=True)
class Target:
    """What ``testbed link replay LINK TRACE`` drives: ``link`` (None: the links marked
    bottleneck) and ``trace_file`` (None: the link's ``schedule:`` in the topology)."""

    link: str | None
    trace_file: Path | None


def parse_target(args: Sequence[str], *, bottleneck: bool = False, from_topology: bool = False) -> Target:
    """The replay's positional arguments read: ``LINK TRACE``, ``--bottleneck TRACE`` or
    ``--from-topology LINK``; a TestbedError says which form to write."""
    if from_topology:
        if bottleneck or len(args) != 1:
            raise TestbedError("with --from-topology give only the LINK whose schedule: to follow")
        return Target(args[0], None)
    if bottleneck:
        if len(args) != 1:
            raise TestbedError("with --bottleneck give only the TRACE file")
        return Target(None, Path(args[0]))
    if len(args) != 2:
        raise TestbedError("give LINK TRACE, or --bottleneck TRACE")
    return Target(args[0], Path(args[1]))


def check_stop(args: Sequence[str], *, bottleneck: bool = False, background: bool = False) -> None:
    """``--stop`` ends the testbed's background replays and takes nothing that starts one."""
    if args or background or bottleneck:
        raise TestbedError("--stop takes no LINK, TRACE or --background", "write: testbed link replay --stop")


def check_options(*, duration_s: float | None = None, while_pid: int | None = None) -> None:
    """Refuse a duration outside (0, MAX_SPAN_S] seconds and a ``while_pid`` that is no process id."""
    if while_pid is not None and while_pid <= 0:
        raise TestbedError(f"--while-pid {while_pid}: not a process id")
    if duration_s is not None and not (math.isfinite(duration_s) and 0 < duration_s <= MAX_SPAN_S):
        raise TestbedError(f"--duration must be a number of seconds in (0, {MAX_SPAN_S:g}], got {duration_s}")


def schedule_of(link: Link) -> Trace:
    """The ``schedule:`` the topology gives ``link``; a TestbedError if it has none."""
    if link.schedule is None:
        raise TestbedError(f"link {link.name} has no schedule: in the topology",
                           "give a TRACE file instead of --from-topology")
    return link.schedule


def check(links: Sequence[Link], trace: Trace, direction: str = "both") -> None:
    """Refuse, before anything changes, a trace whose steps the links' shapes cannot take."""
    dirs = DIRECTIONS if direction == "both" else (direction,)
    seen = set()
    for s in trace.steps:
        if s.values() in seen:
            continue
        seen.add(s.values())
        for l in links:
            for d in dirs:
                try:
                    check_shape(replace(l.shape(d), **_changes(s)), f"link {l.name} ({d})")
                except TestbedError as e:
                    raise TestbedError(f"{trace.source or 'trace'} step at {s.at_s:g} s: {e.message}", e.hint) from None


def replay(tb, links: Sequence[Link], trace: Trace, *, direction: str = "both", duration_s: float | None = None,
           restore: bool = False, log: IO[str] | None = None, on_step: Callable[[dict], None] | None = None,
           stop: Callable[[], bool] | None = None, start_when: Callable[[], bool] | None = None,
           clock: Callable[[], float] = time.monotonic) -> ReplayResult:
    """Apply ``trace`` to ``links`` of the running testbed ``tb``; returns what was applied.

    Ends after the last step (a looping trace: after ``duration_s``, or on an interrupt);
    ``duration_s`` also cuts a trace short. A KeyboardInterrupt ends it early, the shapes
    from before are put back, and the interrupt is re-raised. ``stop`` (asked about five
    times a second while waiting) returning True ends it the same way, without raising.

    ``start_when``: the trace's 0 s is the moment it first returns True (asked every 10
    ms, after the steps are encoded); a run starts its trace when training starts.

    ``log`` gets a ``ready`` line once the steps are encoded, a ``start`` line (wall time of
    the trace's 0 s, links, steps), then one ``step`` line per applied step.
    """
    if duration_s is None and trace.loop:
        duration_s = float("inf")
    check(links, trace, direction)
    dirs = DIRECTIONS if direction == "both" else (direction,)
    before = [(l, d, l.shape(d)) for l in links for d in dirs]
    result = ReplayResult()
    changer = _encoded(tb, links, dirs, trace)
    timer = _Timer(clock, stop)
    _log(log, {"event": "ready", "time": time.time()})
    old_handlers = interrupt_on()  # SIGTERM/SIGHUP end a replay as Ctrl-C does (shapes put back)
    began = False  # before the trace's 0 s nothing has changed, so nothing is put back
    try:
        timer.wait_for(start_when)
        t0, wall0 = clock(), time.time()
        _log(log, {"event": "start", "time": wall0, "links": [l.name for l in links], "direction": direction,
                   "trace": trace.source, "steps": len(trace.steps), "period_s": trace.period_s})
        began = True
        until = trace.steps[-1].at_s if duration_s is None else duration_s
        for at, step in trace.events(until):
            rec = _apply_step(tb, links, direction, changer, timer, t0, wall0, at, step)
            result.steps.append(rec)
            _log(log, rec)
            if on_step:
                on_step(rec)
        if duration_s is not None:
            timer.wait_until(t0 + duration_s)
    except _Stopped:
        result.interrupted = restore = True
    except KeyboardInterrupt:
        result.interrupted = restore = True
        raise
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        changer.close()
        if restore and began:
            result.restored = _put_back(tb, before)
    return result


def _encoded(tb, links: Sequence[Link], dirs, trace: Trace) -> LinkChanger:
    """A changer with each distinct step made ready before the clock starts: its links
    derived and checked, its requests encoded and put together into one datagram per
    namespace, in the order ``set_links`` passes them (indexes, child qdiscs, sockets and
    all of this are kept between steps)."""
    changer = LinkChanger()
    changer.learn(tb.egress[(l.index, d)] for l in links for d in dirs)
    current = links
    for _ in range(2):  # the second pass from the first's results, as the steps go on
        for step in {s.values(): s for s in trace.steps}.values():
            new = changer.derived.links(current, dict(_changes(step)), dirs)
            changer.prepare([(ep, l.shape(d), "") for l in new.values() for d in dirs
                             if (ep := tb.egress[(l.index, d)]).host == tb.here])
            current = list(new.values())
    return changer


class _Timer:
    """Waits on ``clock``, asking ``stop`` (if any) five times a second; _Stopped when it says so."""

    def __init__(self, clock: Callable[[], float], stop: Callable[[], bool] | None):
        self.clock, self.stop = clock, stop
        self.poll = 0.5 if stop is None else 0.2

    def wait_until(self, due: float) -> None:
        while (left := due - self.clock()) > 0:
            if self.stop is not None and self.stop():
                raise _Stopped
            time.sleep(min(left, self.poll))

    def wait_for(self, ready: Callable[[], bool] | None) -> None:
        """Until ``ready()`` (asked every 10 ms); at once without one."""
        while ready is not None and not ready():
            if self.stop is not None and self.stop():
                raise _Stopped
            time.sleep(0.01)


def _apply_step(tb, links, direction, changer, timer: _Timer, t0: float, wall0: float, at: float, step) -> dict:
    """Wait for the step's time, apply it to every link (by index, under the lock); its record."""
    due = t0 + at
    timer.wait_until(due)
    start = timer.clock()
    in_force: list[float] = []
    tb.set_links(links, direction=direction, changer=changer, applied=lambda: in_force.append(timer.clock()),
                 **_changes(step))
    done = timer.clock()
    kernel = in_force[0] if in_force else done
    send_s, ack_s = changer.batch.timing
    return {"event": "step", "time": wall0 + (kernel - t0), "links": [l.name for l in links], **step.to_dict(),
            "at_s": at, "late_s": kernel - due, "apply_s": kernel - start, "state_s": done - due,
            "send_s": send_s, "ack_s": ack_s}


def _put_back(tb, before) -> bool:
    """The shapes from before the trace, with interrupts ignored (nothing may cut this short)."""
    old = ignore_interrupts()
    try:
        for l, d, shape in before:
            tb.set_links([l], direction=d, rate=shape.rate, delay=shape.delay, loss=shape.loss)
        return True
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _log(log: IO[str] | None, record: dict) -> None:
    if log is not None:
        log.write(json.dumps(record) + "\n")
        log.flush()


class _Stopped(Exception):
    pass


def open_log(path: Path | None) -> IO[str] | None:
    if path is None:
        return None
    try:
        # not blocking on a FIFO without a reader, not taking a terminal, not through a link
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise TestbedError(f"--log {path}: cannot write ({e.strerror or e})",
                           "give a regular file (it is appended to)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TestbedError(f"--log {path}: not a regular file", "give a regular file (it is appended to)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", encoding="utf-8")


@dataclass
class Background:
    """A replay process started by :func:`start_background`."""

    proc: subprocess.Popen
    log: Path
    output: Path
    marker: str

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM: the replay puts the shapes from before back and exits."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        try:
            return tail_text(self.output).strip()[-600:]
        except OSError:
            return ""


def start_background(name: str, trace_path: Path | None, *, link: str | None = None, fmt: str = "auto", window_s: float = 1.0,
                     loop: bool = False, duration_s: float | None = None, direction: str = "both",
                     restore: bool = False, log: Path | None = None, while_pid: int | None = None,
                     start_on: Path | None = None, ready_timeout: float = 30.0, locked: bool = False) -> Background:
    """Start ``testbed link replay`` as a background process, recorded in the testbed's
    ledger first (``down`` stops it, also after a crash); returns once it is ready (the
    ``ready`` line in its log). ``while_pid``: it ends, putting the shapes back, when that
    process is gone (a run that was killed). ``start_on``: the trace's 0 s is when this
    file appears (else at once). ``trace_path`` None: ``link``'s schedule in the topology.
    ``locked``: the caller holds the testbed's lock (``up``, building the testbed)."""

    rid = secrets.token_hex(16)
    marker = f"--replay-id={rid}"
    ledger = Ledger(name)
    log = (log or ledger.dir / f"replay-{rid[:8]}.jsonl").resolve()
    output = ledger.dir / f"replay-{rid[:8]}.out"
    argv = procs.python_argv(
        "testbed", "link", "replay", *([link] if link else ["--bottleneck"]),
        *([str(trace_path.resolve())] if trace_path is not None else ["--from-topology"]),
        "--format", fmt, "--window", repr(window_s), "--direction", direction, "--log", str(log),
        "--testbed", name, marker, *(["--loop"] if loop else []), *(["--restore"] if restore else []),
        *(["--duration", repr(duration_s)] if duration_s is not None else []),
        *(["--while-pid", str(while_pid)] if while_pid else []),
        *(["--start-on", str(start_on.resolve())] if start_on is not None else []))
    with contextlib.nullcontext() if locked else ledger.lock():
        ledger.record(StartReplay(marker, str(log)).to_dict())
    start = log.stat().st_size if log.exists() else 0
    with open(output, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd="/")  # Ctrl-C in the terminal is not its to take
    bg = Background(proc, log, output, marker)
    deadline = time.monotonic() + ready_timeout
    while not _started(log, start):
        if proc.poll() is not None or time.monotonic() > deadline:
            bg.stop(grace=5.0)
            raise TestbedError(f"the trace replay did not start: {bg.tail() or 'no output'}", f"see {output}")
        time.sleep(0.05)
    return bg


def _started(log: Path, offset: int) -> bool:
    try:
        with os.fdopen(open_regular(log, "replay log"), "rb") as f:
            f.seek(offset)
            return b'"event": "ready"' in f.read(4096)
    except (OSError, TestbedError):
        return False


def stop_background(name: str, grace: float = 30.0) -> list[int]:
    """Stop the background replays of testbed ``name`` (each puts its shapes back); their pids."""

    return [pid for a in recorded(name, StartReplay) for pid in procs.terminate(a.pids(), grace=grace)]


def running_background(name: str) -> list[dict]:
    """The background replays of testbed ``name`` still running: pid and log."""

    return [{"pid": pid, "log": a.log} for a in recorded(name, StartReplay) for pid in a.pids()]
