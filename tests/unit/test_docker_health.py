"""Why a container worker cannot take a rank: the reasons testbed.nodes.docker.health gives,
from containers as the engine reports them (faked here; tests/kernel/test_docker_faults.py
makes each fault for real)."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from testbed.nodes.docker import health


def _container(status: str, running: bool, pid: int = 4242, exit_code: int = 0,
               started: str = "2026-11-24T07:51:06.220493596Z"):
    return SimpleNamespace(name="testbed-tb.w1", labels={"testbed": "tb"}, attrs={"State": {
        "Status": status, "Running": running, "Pid": pid if running else 0, "ExitCode": exit_code,
        "StartedAt": started, "Dead": False}})


@pytest.fixture
def wired(monkeypatch):
    """The container's init is in the namespace `up` named (True) or in another (False)."""
    state = {"same": True, "engine": None}
    monkeypatch.setattr(health, "same_namespace", lambda ns, pid: state["same"])
    monkeypatch.setattr(health, "engine_started", lambda: state["engine"])
    return state


def test_a_running_container_in_its_namespace_is_fit(wired):
    assert health.reason(_container("running", True), "tb.w1") is None


def test_a_restarted_container_is_named_with_when_it_started_again(wired):
    wired["same"] = False
    why = health.reason(_container("running", True), "tb.w1")
    assert why.startswith("its container testbed-tb.w1 was restarted (started again at 2026-11-24 07:51:06 UTC")
    assert "links into the testbed are gone" in why


def test_a_removed_or_stopped_container(wired):
    assert health.reason(_container("removing", False, exit_code=137), "tb.w1") == \
        "its container testbed-tb.w1 was removed (docker rm)"
    assert health.reason(_container("exited", False, exit_code=137), "tb.w1") == \
        "its container testbed-tb.w1 is exited (exit code 137)"


def test_a_container_the_engine_stopped_when_it_restarted(wired):
    wired["engine"] = datetime(2026, 11, 24, 8, 0, 0, tzinfo=timezone.utc)  # after the container started
    why = health.reason(_container("exited", False, exit_code=143), "tb.w1")
    assert why == ("its container testbed-tb.w1 is exited (exit code 143): the Docker engine restarted at "
                   "2026-11-24 08:00:00 UTC, and containers without a restart policy stop with it")
    wired["engine"] = datetime(2026, 11, 24, 7, 0, 0, tzinfo=timezone.utc)  # before: stopped by someone
    assert "engine" not in health.reason(_container("exited", False, exit_code=143), "tb.w1")


def test_docker_times_parse():
    assert health.parse_time("2026-11-24T07:51:06.220493596Z") == datetime(2026, 11, 24, 7, 51, 6,
                                                                             tzinfo=timezone.utc)
    assert health.parse_time("0001-01-01T00:00:00Z") is None  # Docker's "never"
    assert health.parse_time("") is None and health.parse_time("garbage") is None


def test_settled_reason_waits_for_a_restart_in_progress(wired, monkeypatch):
    """`docker restart` kills the rank while the container is briefly exited: the reason given
    is the restart once it runs again, not the stop."""
    seen = iter([_container("exited", False, exit_code=143), _container("running", True)])
    monkeypatch.setattr(health, "inspect", lambda name, timeout: next(seen))
    wired["same"] = False
    assert "was restarted" in health.settled_reason("testbed-tb.w1", "tb.w1", settle=5)


def test_settled_reason_gives_up_on_a_container_that_stays_stopped(wired, monkeypatch):
    monkeypatch.setattr(health, "inspect", lambda name, timeout: _container("exited", False, exit_code=137))
    assert health.settled_reason("testbed-tb.w1", "tb.w1", settle=0.3) == \
        "its container testbed-tb.w1 is exited (exit code 137)"


def test_settled_reason_for_a_gone_container_and_an_engine_that_does_not_answer(monkeypatch):
    monkeypatch.setattr(health, "inspect", lambda name, timeout: None)
    assert health.settled_reason("testbed-tb.w1", "tb.w1") == \
        "its container testbed-tb.w1 was removed (it is no longer on the Docker engine)"

    def down(name, timeout):
        raise health.EngineDown("cannot reach the Docker engine: connection refused")

    monkeypatch.setattr(health, "inspect", down)
    assert health.settled_reason("testbed-tb.w1", "tb.w1") == health.ENGINE_DOWN
    assert "Docker engine does not answer" in health.ENGINE_DOWN


def test_the_testbed_of_a_node_namespace_and_what_to_do():
    assert health.testbed_of("tb.w1") == "tb"
    assert health.redo("tb") == "`testbed down tb` and `testbed up` again"
