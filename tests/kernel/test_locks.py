"""A lock per testbed (issues House II and III): a link change on one testbed never waits for
what holds the state directory's lock, `down` waits for a change or a build in flight on its
testbed, so neither writes the state of a testbed gone, and a build holds the state
directory's lock only while it reserves its name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from testbed import Testbed, load_topology_dict
from testbed.common.state import global_lock
from testbed.plan.ledger import Ledger
from tests.helpers import dumbbell

from .conftest import cli

pytestmark = pytest.mark.kernel


def test_a_link_change_goes_on_while_the_global_lock_is_held_and_down_waits_for_one_in_flight(clean_kernel):
    Testbed.up(load_topology_dict(dumbbell("lk", rate="1gbit")))
    try:
        with global_lock():  # as another testbed's `up` holds it while its VMs boot
            t0 = time.monotonic()
            r = cli("link", "set", "-t", "lk", "s0-s1", "--bw", "200mbit", "--json", timeout=60)
            assert r.returncode == 0, r.stderr
            assert time.monotonic() - t0 < 30  # it did not wait out the lock (120 s)
        shown = json.loads(cli("link", "show", "-t", "lk", "--json").stdout)
        assert {l["name"]: l["forward"]["shape"]["rate"] for l in shown["links"]}["s0-s1"] == "200mbit"

        with Ledger("lk").lock():  # a link change in flight on this testbed
            down = subprocess.Popen([sys.executable, "-m", "testbed.cli", "down", "lk"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            time.sleep(2)
            assert down.poll() is None, "down did not wait for the change in flight"
            assert Ledger("lk").exists()
        out, err = down.communicate(timeout=60)
        assert down.returncode == 0, err
        assert not Ledger("lk").exists()
        r = cli("link", "set", "-t", "lk", "s0-s1", "--bw", "100mbit")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    finally:
        cli("down", "lk")


def _stopped(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_a_second_testbed_comes_up_while_a_build_is_halfway_and_down_waits_for_it(clean_kernel, tmp_path):
    """The global lock is held only while a name is reserved (issue 57 item 3): a build stopped
    halfway (SIGSTOP at its third step, as a VM testbed's up waits for its guests to boot)
    holds its own testbed's lock, not the state directory's, so another testbed comes up
    meanwhile (before: it waited out the 120 s lock); `down` of the half-built testbed waits
    for the build, then removes it."""
    (tmp_path / "big.yaml").write_text(json.dumps(dumbbell("lkbig", rate="1gbit")))
    (tmp_path / "small.yaml").write_text(json.dumps(dumbbell("lksm", rate="1gbit")))
    env = {**os.environ, "TESTBED_FAULT_STEP": "3", "TESTBED_FAULT_SIGNAL": "SIGSTOP"}
    big = subprocess.Popen([sys.executable, "-m", "testbed.cli", "up", str(tmp_path / "big.yaml"), "--no-exporter"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    down = None
    try:
        deadline = time.monotonic() + 60
        while not _stopped(big.pid) and big.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _stopped(big.pid), big.communicate()[1] if big.poll() is not None else "the build never stopped"
        r = cli("up", str(tmp_path / "small.yaml"), "--no-exporter", timeout=60)  # TimeoutExpired before
        assert r.returncode == 0, r.stderr
        down = subprocess.Popen([sys.executable, "-m", "testbed.cli", "down", "lkbig"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        assert down.poll() is None and Ledger("lkbig").exists(), "down did not wait for the build"
        big.send_signal(signal.SIGCONT)
        _out, err = big.communicate(timeout=60)
        assert big.returncode == 0, err
        out, err = down.communicate(timeout=60)
        assert down.returncode == 0 and "removed: lkbig" in out, out + err
        assert not Ledger("lkbig").exists() and Ledger("lksm").exists()
    finally:
        if big.poll() is None:
            big.send_signal(signal.SIGCONT)
            big.wait(60)
        if down is not None and down.poll() is None:
            down.wait(60)
        cli("down", "lkbig")
        cli("down", "lksm")


def test_a_host_agents_copy_of_new_shapes_waits_for_no_other_testbeds_up(clean_kernel):
    """A remote host keeps its copy of the shapes after each change (a trace step there)
    under that testbed's lock only: another testbed's `up` holding the state directory's
    lock (as while its VMs boot) delays it not at all (before: it waited for that lock)."""
    from testbed.engine import hostagent

    tb = Testbed.up(load_topology_dict(dumbbell("lkag", rate="1gbit")))
    try:
        with global_lock():
            t0 = time.monotonic()
            hostagent._keep_copies(tb, {"2": {"forward": {"rate": "200mbit"}}})
            assert time.monotonic() - t0 < 30  # it did not wait out the lock (120 s)
        state = Ledger("lkag").read_state()
        assert state is not None and state["topology"]["links"][2]["forward"]["rate"] == "200mbit", state
    finally:
        cli("down", "lkag")
