"""``testbed sweep --slurm``: a sweep's grid as a Slurm job array.

One array element per run of the sweep (:func:`testbed.runs.sweeps.sweep.plan`'s order: element i
is run i of the local sweep). The sweep's directory, on the shared filesystem, holds::

    slurm/request.json      the request (:mod:`testbed.runs.sweeps.request`), paths absolute
    slurm/element.sh        the array's batch script: ``testbed _sweep-element DIR``
    slurm/submissions.json  every ``sbatch`` of it: job id, elements
    slurm/results/I.json    element I's entry of sweep.json, written by the element at its end
    slurm/logs/JOB_I.out    element I's output
    slurm/attempts/         an earlier attempt's run directory, moved out of report's way
    RUN_ID/                 each run's records, as in a local sweep; sweep.json from the results

Each element brings up its own testbed from the topology (named NAME-jJOB: elements sharing
a node do not share one) where Slurm placed it: on its node, in the user's rootless
namespaces (or as root); across the job's nodes when the topology places nodes on hosts
(``#SBATCH -N``, as ``up --hosts slurm``). It pre-trains its repeat's checkpoint once for the
whole sweep (a lock in ``checkpoints/``), runs its point, takes the testbed down and writes
its result. Slurm's SIGTERM (scancel, the time limit) unwinds it as Ctrl-C does a run.

Submitting the same sweep again (the same request, the same ``--out``) finds its directory
and submits only the elements without an ``ok`` result that are neither pending nor running.
A pair of repeats is repeat k of two schemes: the same seed and checkpoint whatever the
order the queue runs them in.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.common import slurmenv
from testbed.common.errors import TestbedError
from testbed.common.files import read_json, write_json
from testbed.common.outdir import own_dir
from testbed.runs.sweeps import request as sweepfile
from testbed.runs.checks import check_out, discard_out
from testbed.hosts.slurm.job import own_program
from testbed.runs.sweeps.sweep import Point, SweepRequest, index_head, new_dir, plan

SLURM_TIMEOUT_S = 60
MAX_SUBMISSIONS = 1000
ACTIVE = {"PENDING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending",
          "CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running", "SUSPENDED": "running",
          "STOPPED": "running", "SIGNALING": "running", "STAGE_OUT": "running", "RESIZING": "running"}
"""squeue's job states of an element not yet ended, as sweep --status names them."""
LIVE = {"pending", "running"}
REFUSED_SBATCH = ("--array", "--wrap", "--output", "--error", "--parsable", "--wait", "--chdir", "--job-name")
"""sbatch options testbed sets itself (or that would change where an element runs or writes);
sbatch takes any unambiguous abbreviation of a long option, so a prefix of one is refused too."""
REFUSED_SHORT = set("aoeWDJ")
SHORT_FLAGS = set("HhIkOQsVvW")
"""sbatch's short options that take no value: a bundle (``-vH``) goes on after them."""
LONG_FLAGS = ("--contiguous", "--exclusive", "--hold", "--ignore-pbs", "--no-kill", "--no-requeue", "--overcommit",
              "--oversubscribe", "--quiet", "--reboot", "--requeue", "--spread-job", "--test-only",
              "--use-min-nodes", "--verbose", "--get-user-env", "--nice", "--propagate", "--kill-on-invalid-dep")
"""sbatch's long options that take no value, or one only after ``=``: a word after one of them
would be the batch script."""


@dataclass
class Element:
    index: int
    point: Point
    state: str
    """ok, failed, unproven, bypassed, interrupted (its result); pending, running (the queue);
    lost (submitted, ended without a result: cancelled, killed); missing (never submitted)."""
    job: str | None = None
    error: str | None = None
    result: dict | None = None


@dataclass
class SweepStatus:
    dir: Path
    elements: list[Element]
    jobs: list[str] = field(default_factory=list)

    def count(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self.elements:
            counts[e.state] = counts.get(e.state, 0) + 1
        return counts

    @property
    def live(self) -> bool:
        return any(e.state in LIVE for e in self.elements)

    def to_dict(self) -> dict:
        return {"dir": str(self.dir), "total": len(self.elements), "counts": self.count(), "jobs": self.jobs,
                "elements": [{"index": e.index, "run_id": e.point.run_id, "state": e.state,
                              "job": f"{e.job}_{e.index}" if e.job else None,
                              **({"error": e.error} if e.error else {})} for e in self.elements]}


def check_sbatch(options: list[str]) -> list[str]:
    """The user's sbatch options, refusing those testbed sets (an abbreviation or a bundle
    too) and any word that is no option's value (sbatch would take it for the script)."""
    takes_value = False
    for opt in options:
        if takes_value:
            takes_value = False
            continue
        if opt.startswith("--") and len(opt) > 2:
            name = opt.split("=", 1)[0]
            if any(r.startswith(name) for r in REFUSED_SBATCH):
                raise _refused(opt)
            takes_value = "=" not in opt and not any(f.startswith(name) for f in LONG_FLAGS)
        elif opt.startswith("-") and len(opt) > 1:
            takes_value = _short_bundle(opt)
        else:
            raise TestbedError(f"--sbatch: {opt!r} is not an option (sbatch would run it as the batch script)",
                               "give sbatch's options only, each value after its option")
    return options


def _short_bundle(opt: str) -> bool:
    """Whether the short options ``-xyz`` leave the next word as a value; refused letters raise."""
    for i, c in enumerate(opt[1:], 1):
        if c in REFUSED_SHORT:
            raise _refused(opt)
        if c not in SHORT_FLAGS:
            return i == len(opt) - 1  # a value-taking option: the rest of the word, or the next word
    return False


def _refused(opt: str) -> TestbedError:
    return TestbedError(f"--sbatch: {opt!r} is set by testbed sweep --slurm itself",
                        "leave it out: the array, its name, output files and directory are the sweep's")


def job_name(d: Path) -> str:
    """The array's name: the sweep's folder and a digest of its path (what status and cancel
    look for in the queue, so that a job id Slurm reused for another job is never taken)."""
    return f"testbed-{d.name}-{hashlib.sha256(str(d).encode()).hexdigest()[:8]}"


def submit(req: SweepRequest, topology: dict, sbatch: list[str], limit: int | None,
           say: Callable[[str], None]) -> tuple[SweepStatus, str | None]:
    """Submit the sweep's missing elements as one array (at most ``limit`` at once); the
    status after it and the array's job id (None: nothing to submit). ``limit`` None: as
    many at once as Slurm starts."""
    _sbatch_exists()
    out = Path(os.path.realpath(req.out))  # the path sbatch and slurmd open again later: no link in it
    if "%" in str(out):
        raise TestbedError(f"--out {out}: a '%' in the path is a pattern to sbatch's --output",
                           "choose a directory without '%'")
    made = check_out(out)  # ours, and every folder above it ours or root's: nothing can be swapped beneath
    doc = sweepfile.to_dict(req, topology)
    try:
        d = _same_sweep(out, sweepfile.key(doc))
        new = d is None
        d = _new_sweep(out, doc) if d is None else d
    except BaseException:
        discard_out(out, made)
        raise
    say(f"sweep directory {d}" if new else f"the same sweep is in {d}: submitting what is missing")
    try:
        return _submit_missing(d, limit, sbatch, say)
    except BaseException:
        if new:  # refused (sbatch, a signal): nothing of this submission left
            shutil.rmtree(d, ignore_errors=True)
            discard_out(out, made)
        raise


def _submit_missing(d: Path, limit: int | None, sbatch: list[str],
                    say: Callable[[str], None]) -> tuple[SweepStatus, str | None]:
    st = status(d)
    todo = [e.index for e in st.elements if e.state not in LIVE and e.state != "ok"]
    if not todo:
        return st, None
    for i in todo:
        _move_attempt(d, i, st.elements[i].point.run_id)
    job = _sbatch(d, todo, limit, sbatch)
    subs = _submissions(d)
    write_json(d / "slurm" / "submissions.json", [*subs, {"job": job, "elements": todo, "time": time.time()}])
    say(f"submitted job array {job}: {len(todo)} element(s)" + (f", at most {limit} at once" if limit else ""))
    return status(d), job


def _sbatch_exists() -> None:
    from shutil import which

    if which("sbatch") is None:
        raise TestbedError("sweep --slurm: sbatch is not installed here (no Slurm)",
                           "run it on a machine of the cluster (a login node), or sweep without --slurm")


def _same_sweep(out: Path, key: str) -> Path | None:
    """The sweep in ``out`` with this request (of this user), if any."""
    if not out.is_dir():
        return None
    for request in sorted(out.glob("sweep-*/slurm/request.json")):
        d = request.parent.parent
        try:
            if d.is_symlink() or d.lstat().st_uid != os.geteuid():
                continue  # not a sweep of ours
            if sweepfile.key(read_json(request)) == key:
                return open_sweep(d)
        except (OSError, ValueError, TestbedError):
            continue
    return None


def _new_sweep(out: Path, doc: dict) -> Path:
    """A new sweep directory in ``out`` (a real path of the user's) with its request and
    batch script; nothing of it left when that fails."""
    d = new_dir(out)
    try:
        _fill(d, doc)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)  # made just now, by us, private
        raise
    return d


def _fill(d: Path, doc: dict) -> None:
    s = own_dir(d / "slurm", fresh=True)
    for sub in ("results", "logs", "attempts"):
        own_dir(s / sub, fresh=True)
    write_json(s / "request.json", doc)
    (s / "element.sh").write_text("#!/bin/sh\n# One element of a testbed sweep (testbed sweep --slurm): its "
                                  "directory is $1, its element SLURM_ARRAY_TASK_ID.\n"
                                  f"exec {shlex.quote(own_program())} _sweep-element \"$1\"\n")
    (s / "element.sh").chmod(0o700)  # (sweep.json: written by status, which the submission asks next)


def _request_of(d: Path) -> SweepRequest:
    return sweepfile.read(d / "slurm" / "request.json")[0]


def _ranges(indices: list[int]) -> str:
    """``0-3,5,7-8``: sbatch's --array list."""
    parts, start = [], None
    for i, x in enumerate(indices):
        if start is None:
            start = x
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            parts.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(parts)


def _sbatch(d: Path, todo: list[int], limit: int | None, options: list[str]) -> str:
    argv = ["sbatch", *options, "--parsable", f"--array={_ranges(todo)}" + (f"%{limit}" if limit else ""),
            f"--job-name={job_name(d)}", f"--output={d}/slurm/logs/%A_%a.out", str(d / "slurm" / "element.sh"), str(d)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"sbatch gave no answer within {SLURM_TIMEOUT_S} s", "is slurmctld up? (sinfo)") from None
    job = r.stdout.strip().split(";")[0]
    if r.returncode != 0 or not job.isdigit():
        said = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise TestbedError(f"sbatch refused the array: {said[-1] if said else f'exit {r.returncode}'}",
                           "check --sbatch's options (sbatch --help)")
    return job


def _submissions(d: Path) -> list[dict]:
    try:
        subs = read_json(d / "slurm" / "submissions.json", "json", "sweep submissions")
    except FileNotFoundError:
        return []
    except ValueError:
        raise TestbedError(f"{d}/slurm/submissions.json is not JSON", "remove it to submit the sweep afresh") from None
    ok = isinstance(subs, list) and len(subs) <= MAX_SUBMISSIONS and all(
        isinstance(s, dict) and isinstance(s.get("job"), str) and s["job"].isdigit()
        and isinstance(s.get("elements"), list) and all(isinstance(i, int) for i in s["elements"]) for s in subs)
    if not ok:
        raise TestbedError(f"{d}/slurm/submissions.json is not a list of submissions", "remove it, then submit again")
    return subs


def _move_attempt(d: Path, i: int, run_id: str) -> None:
    """An earlier attempt's run directory and result out of the way of ``report`` and of
    ``status`` (into slurm/attempts/ as RUN_ID.N and RUN_ID.N.json)."""
    attempts = d / "slurm" / "attempts"
    n = 1
    while (attempts / f"{run_id}.{n}").exists() or (attempts / f"{run_id}.{n}.json").exists():
        n += 1
    for old, new in ((d / run_id, attempts / f"{run_id}.{n}"),
                     (d / "slurm" / "results" / f"{i}.json", attempts / f"{run_id}.{n}.json")):
        if old.exists() and not old.is_symlink():
            old.rename(new)


def open_sweep(d: Path) -> Path:
    """``d`` (its real path) checked to be a Slurm sweep's directory safely this user's: their
    own, not writable by others, below folders no one else can rename in (one line otherwise)."""
    try:
        st = d.lstat()
    except OSError:
        raise TestbedError(f"{d}: no such sweep directory", "give the directory `testbed sweep --slurm` printed") \
            from None
    if st.st_uid != os.geteuid():
        raise TestbedError(f"{d} belongs to uid {st.st_uid}, not to you", "give a sweep directory of your own")
    d = own_dir(Path(os.path.realpath(d)), "sweep directory")
    if not (d / "slurm" / "request.json").is_file():
        raise TestbedError(f"{d} is not a sweep submitted with --slurm (no slurm/request.json)",
                           "a local sweep is done when its command ends: `testbed report DIR`")
    return d


def status(d: Path) -> SweepStatus:
    """What each element of the sweep in ``d`` is, from its result and the queue; sweep.json
    written from the results (what report reads is the run directories)."""
    d = open_sweep(d)
    req = _request_of(d)
    points = plan(req)
    subs = _submissions(d)
    queued = {(job, i): state for job, i, state in _queue(d)} if subs else {}
    last: dict[int, str] = {}
    for s in subs:
        for i in s["elements"]:
            last[i] = s["job"]
    elements = []
    for i, p in enumerate(points):
        result = _result(d, i, p)
        job = last.get(i)
        live = queued.get((job, i)) if job else None
        if result is not None and result.get("status") == "ok":
            state = "ok"
        elif live is not None:
            state = live
        elif result is not None:
            state = str(result.get("status"))
        else:
            state = "lost" if job else "missing"
        elements.append(Element(i, p, state, job, result.get("error") if result else None, result))
    st = SweepStatus(d, elements, [s["job"] for s in subs])
    index = index_head(req)
    index["runs"] = [e.result for e in elements if e.result is not None]
    index["slurm"] = {"jobs": st.jobs, "counts": st.count()}
    write_json(d / "sweep.json", index)
    return st


def _result(d: Path, i: int, p: Point) -> dict | None:
    try:
        r = read_json(d / "slurm" / "results" / f"{i}.json", "json", "element result")
    except (OSError, ValueError, TestbedError):
        return None
    if not isinstance(r, dict) or r.get("run_id") != p.run_id or not isinstance(r.get("status"), str):
        return None  # not this element's: ignored, so it runs again
    return r


def _queue(d: Path) -> list[tuple[str, int, str]]:
    """(array job, element, pending or running) for this sweep's elements in the queue: the
    user's jobs named :func:`job_name`; a state not known to be live is left out."""
    try:
        r = subprocess.run(["squeue", "--me", "-h", "-r", "-o", "%F %K %T %j"], capture_output=True, text=True,
                           timeout=SLURM_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise TestbedError("squeue is not installed here (no Slurm)", "ask on a machine of the cluster") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"squeue gave no answer within {SLURM_TIMEOUT_S} s", "is slurmctld up? (sinfo)") from None
    if r.returncode != 0:
        raise TestbedError(f"squeue failed: {r.stderr.strip()[-300:] or r.returncode}", "is slurmctld up? (sinfo)")
    name, found = job_name(d), []
    for line in r.stdout.splitlines():
        parts = line.split()
        if (len(parts) == 4 and parts[3] == name and parts[0].isascii() and parts[0].isdigit()
                and parts[1].isascii() and parts[1].isdigit() and parts[2] in ACTIVE):
            found.append((parts[0], int(parts[1]), ACTIVE[parts[2]]))
    return found


def wait(d: Path, on_update: Callable[[SweepStatus], None], poll: float = 2.0) -> SweepStatus:
    """Follow the sweep until none of its elements is pending or running."""
    while True:
        st = status(d)
        on_update(st)
        if not st.live:
            return st
        time.sleep(poll)


def cancel(d: Path) -> list[str]:
    """scancel the sweep's arrays still in the queue (those of this user with its name: never
    a job id Slurm has given to another job since); their job ids."""
    d = open_sweep(d)
    jobs = sorted({job for job, _i, _state in _queue(d)}, key=int)
    if jobs:
        r = subprocess.run(["scancel", *jobs], capture_output=True, text=True, timeout=SLURM_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise TestbedError(f"scancel failed: {r.stderr.strip()[-300:]}", "is slurmctld up? (sinfo)")
    return jobs


def task_id() -> int:
    """This array element's index (SLURM_ARRAY_TASK_ID), checked."""
    text = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise TestbedError("this is not an element of a Slurm job array (SLURM_ARRAY_TASK_ID)",
                           "testbed _sweep-element runs in the array `testbed sweep --slurm` submits")
    return int(text)


def job_id() -> str:
    job = slurmenv.or_none(slurmenv.job_id)
    return str(job) if job is not None else str(os.getpid())
