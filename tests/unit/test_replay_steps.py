"""A replay's step records (testbed.engine.replay), without a kernel: ``late_s`` ends when
the kernel has the step (``set_links``'s ``applied``), ``state_s`` when the state file has
it; a step that could not say so counts both at its return."""

from __future__ import annotations

import pytest

from testbed.engine import replay
from testbed.model.topology import load_topology_dict
from testbed.model.trace import parse_csv
from tests.helpers import dumbbell


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class _Testbed:
    """Takes 2 ms to put a step in the kernel and 3 ms more to write the state file."""

    def __init__(self, clock: _Clock, say_applied: bool = True):
        self.clock, self.say_applied, self.calls = clock, say_applied, []

    def set_links(self, links, *, direction, changer, applied=None, **changes):
        self.calls.append(changes)
        self.clock.t += 0.002
        if applied is not None and self.say_applied:
            applied()
        self.clock.t += 0.003


class _Changer:
    class batch:  # noqa: N801 (LinkChanger.batch: the netlink part's timing)
        timing = (0.0004, 0.0011)

    def close(self):
        pass


@pytest.mark.parametrize("say_applied, late_ms", [(True, 2.0), (False, 5.0)])
def test_late_is_when_the_kernel_has_it_state_when_the_file_has_it(monkeypatch, say_applied, late_ms):
    clock = _Clock()
    monkeypatch.setattr(replay.time, "sleep", clock.sleep)
    monkeypatch.setattr(replay, "_encoded", lambda tb, links, dirs, trace: _Changer())
    tb = _Testbed(clock, say_applied)
    links = list(load_topology_dict(dumbbell("rst", rate="300mbit")).links)[2:]
    res = replay.replay(tb, links, parse_csv(["0,100mbit", "1,200mbit"], "t"), clock=clock)
    assert [str(c["rate"]) for c in tb.calls] == ["100mbit", "200mbit"]
    for s in res.steps:
        assert s["late_s"] == pytest.approx(late_ms / 1000)
        assert s["apply_s"] == pytest.approx(late_ms / 1000)
        assert s["state_s"] == pytest.approx(0.005)
        assert (s["send_s"], s["ack_s"]) == (0.0004, 0.0011)
    assert res.lateness()["median_s"] == pytest.approx(late_ms / 1000)
