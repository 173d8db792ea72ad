"""Time-to-accuracy in a GPU's regime, composed (issue 58, item 1b): the accuracy of a real
run at any speed, the time of a paper-scale run at the GPU's.

A synchronous scheme reaches the same accuracy at the same iteration whatever the links and
the compute speed (same seeds, same data order, same updates): so a real run at CPU speed
(``ACCURACY``: real forward and backward, evaluations by iteration) gives accuracy per
iteration, and a paper-scale run (``TIME``: ``--compute-time T``, dilated where the machine
needs it) gives the emulated time of an iteration. Their composition is the curve of accuracy
against emulated seconds that the GPU cluster would have drawn: each iteration i of the
accuracy run takes the time the paper-scale run took for an iteration **in the same state**,
matched by the bytes it handed to the collectives (``payload_bytes``: dense, pruned,
masked, ...), interpolated linearly between the two nearest states the paper-scale run
measured (iteration time is affine in the bytes on a bottleneck link), its first iteration
left out (start-up).

Refused in one line where the composition would be wrong: the two runs' scheme, model,
batch, world size, bucket size or scheme parameters differ; the time run is not paper-scale
or was not proven; the accuracy run measured no accuracy; an accuracy run's state lies
outside the byte range the time run measured (extrapolation). Flagged: a ``--hook`` of the
user's own (its updates may depend on timing, which the composition cannot see), and a time
run whose dilation was not validated.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import InputError, read_json, read_jsonl
from testbed.runs.reports.stats import K_SUSTAINED, sustained_tta

SAME = ("scheme", "model", "dataset", "world_size")
"""Summary fields the two runs must share."""
SAME_HYPER_SKIP = {"max_iters", "epochs", "dilation", "gpu_time_s", "init", "pretrain_dataset"}
"""``hyper`` fields that may differ: how long each ran and how its time was made."""
PAYLOAD_REL = 1e-6


@dataclass(frozen=True)
class Composed:
    points: list[dict]
    """Per evaluation of the accuracy run: iter, accuracy, emulated seconds (train_s)."""
    seconds_per_state: dict[int, float]
    """The time run's median steady iteration seconds per payload state."""
    flags: list[str]

    def tta(self, target: float) -> float | None:
        """Emulated seconds to a sustained ``target`` (stats.K_SUSTAINED evaluations in a row)."""
        return sustained_tta(self.points, target, K_SUSTAINED)


def _summary(run: Path, what: str) -> dict:
    try:
        s = read_json(run / "summary.json", "json", "summary")
    except (FileNotFoundError, InputError) as e:
        raise TestbedError(f"{what} {run}: no readable summary.json ({getattr(e, 'message', e)})",
                           "give a run directory that `testbed run` finished") from None
    if not isinstance(s, dict) or s.get("status") != "ok":
        raise TestbedError(f"{what} {run}: not a finished run (status {s.get('status') if isinstance(s, dict) else '?'})",
                           "give a run that ended ok")
    return s


def _iterations(run: Path) -> list[dict]:
    recs = [r for r in read_jsonl(run / "rank0.jsonl") if isinstance(r, dict)]
    return [r for r in recs if isinstance(r.get("iter"), int) and isinstance(r.get("iter_s"), (int, float))
            and isinstance(r.get("payload_bytes"), int)]


def _check_pair(acc: dict, tim: dict, acc_path: Path, tim_path: Path) -> list[str]:
    flags = []
    for key in SAME:
        if acc.get(key) != tim.get(key):
            raise TestbedError(f"{key} differs: {acc.get(key)!r} in {acc_path}, {tim.get(key)!r} in {tim_path}",
                               "compose runs of the same scheme, model, data set and ranks")
    ha, ht = acc.get("hyper") or {}, tim.get("hyper") or {}
    for key in sorted((set(ha) | set(ht)) - SAME_HYPER_SKIP):
        if ha.get(key) != ht.get(key):
            raise TestbedError(f"hyper-parameter {key} differs: {ha.get(key)!r} against {ht.get(key)!r} in the time run",
                               "run the paper-scale run with the accuracy run's options")
    if tim.get("compute_time_s") is None:
        raise TestbedError(f"{tim_path} is not a paper-scale run (no --compute-time)",
                           "the time comes from `testbed run ... --compute-time T` (T: the GPU's step)")
    if not acc.get("accuracy_measured", True) or acc.get("final_accuracy") is None:
        raise TestbedError(f"{acc_path} measured no accuracy", "the accuracy comes from a real run (no --compute-time)")
    if tim.get("proof") != "passed":
        raise TestbedError(f"{tim_path}: its proof did not pass ({tim.get('proof')})", "compose proven runs only")
    if tim.get("dilation", 1) != 1 and tim.get("dilation_validated") is not True:
        flags.append(f"the time run's dilation K = {tim.get('dilation'):g} was not validated (--dilation auto)")
    if acc.get("scheme") == "hook":
        flags.append("your own hook: if its updates depend on timing, the accuracy at CPU speed is not the GPU's")
    return flags


def _per_state(iters: list[dict]) -> dict[int, float]:
    """Median steady seconds per payload state (the first iteration left out)."""
    by: dict[int, list[float]] = {}
    for r in iters[1:]:
        by.setdefault(r["payload_bytes"], []).append(r["iter_s"])
    if not by:
        raise TestbedError("the time run has no steady iteration (one iteration or none)",
                           "run the paper-scale run for a few iterations (--max-iters 10)")
    return {p: statistics.median(ts) for p, ts in sorted(by.items())}


def seconds_at(states: dict[int, float], payload: int) -> float:
    """An iteration's emulated seconds at ``payload`` bytes: the time run's for that state, or
    interpolated between the two nearest it measured; outside their range, a TestbedError."""
    keys = list(states)
    if payload in states:
        return states[payload]
    i = bisect.bisect_left(keys, payload)
    if i == 0 or i == len(keys):
        raise TestbedError(f"an iteration of the accuracy run handed {payload:,} bytes to the collectives, outside "
                           f"what the time run measured ({keys[0]:,}-{keys[-1]:,}): the composition would extrapolate",
                           "run the paper-scale run long enough to pass through the same states (--max-iters)")
    lo, hi = keys[i - 1], keys[i]
    return states[lo] + (states[hi] - states[lo]) * (payload - lo) / (hi - lo)


def compose(accuracy_run: Path, time_run: Path) -> Composed:
    """The accuracy run's evaluations against emulated seconds (module docstring)."""
    acc, tim = _summary(accuracy_run, "the accuracy run"), _summary(time_run, "the time run")
    flags = _check_pair(acc, tim, accuracy_run, time_run)
    states = _per_state(_iterations(time_run))
    elapsed, at_iter = 0.0, {0: 0.0}
    for r in _iterations(accuracy_run):
        elapsed += seconds_at(states, r["payload_bytes"])
        at_iter[r["iter"]] = elapsed
    points = []
    for e in read_jsonl(accuracy_run / "eval.jsonl"):
        it, accv = e.get("iter") if isinstance(e, dict) else None, e.get("accuracy") if isinstance(e, dict) else None
        if isinstance(it, int) and isinstance(accv, (int, float)) and it in at_iter:
            points.append({"iter": it, "accuracy": float(accv), "train_s": at_iter[it]})
    if not points:
        raise TestbedError(f"{accuracy_run}: no evaluation at an iteration its records hold",
                           "evaluate during the run (--eval-every N)")
    return Composed(points, states, flags)
