"""A lock per testbed (issue: House II): a link change on one testbed never waits for what
holds the state directory's lock (another testbed's `up` booting VMs), and `down` waits for
a change in flight on its testbed, so the change never writes the state of a testbed gone."""

from __future__ import annotations

import json
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
