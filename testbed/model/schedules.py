"""A link's ``schedule:`` (and ``loop:``): steps both directions follow from ``up`` on.

The steps themselves are parsed by :mod:`testbed.model.trace` (the format trace files
share); here each distinct step is checked against the link's shapes as ``link set``
would, and the schedule is written back in the topology file's form.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from testbed.common.errors import TopologyError
from testbed.model.shapes import Shape, check_shape
from testbed.model.trace import Step, Trace, parse_schedule


def parse_link_schedule(spec: dict, path: str, shapes: dict[str, Shape]) -> Trace | None:
    """A link's ``schedule:`` (and ``loop:``), every distinct step checked against both
    directions' shapes as ``link set`` would."""
    if "schedule" not in spec:
        if "loop" in spec:
            raise TopologyError(f"{path}.loop", "loop without a schedule", "add schedule: [{at: 0s, rate: ...}, ...]")
        return None
    trace = parse_schedule(spec["schedule"], spec.get("loop", False), f"{path}.schedule")
    seen = set()
    for st in trace.steps:
        if st.values() in seen:
            continue
        seen.add(st.values())
        changes: dict[str, Any] = {"rate": st.rate}
        if st.delay is not None:
            changes["delay"] = st.delay
        if st.loss is not None:
            changes["loss"] = st.loss
        for d, shape in shapes.items():
            check_shape(replace(shape, **changes), f"{path}.schedule (at {st.at_s:g}s, {d})")
    return trace


def schedule_to_list(trace: Trace) -> list[dict]:
    """The ``schedule:`` items; a looping schedule's period end is written as a last step
    with the first's values (what :func:`parse_schedule` reads back as the loop)."""
    items = [{"at": f"{st.at_s:g}s", **_values(st)} for st in trace.steps]
    if trace.loop:
        items.append({"at": f"{trace.period_s:g}s", **_values(trace.steps[0])})
    return items


def _values(step: Step) -> dict:
    return {k: v for k, v in step.to_dict().items() if k != "at_s"}
