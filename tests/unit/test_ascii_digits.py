"""A number read from input is ASCII digits of a bounded length (testbed.common.digits),
wherever testbed reads one: ``str.isdigit`` is true of ``'²'`` (which ``int`` refuses) and of
``'٣'`` (which ``int`` reads as 3), and ``int`` refuses more than 4300 digits. Each reader
below once passed such text from ``isdigit`` to ``int``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from testbed.common.digits import MAX_DIGITS, ascii_int
from testbed.common.errors import StateError, TestbedError
from testbed.engine.core import Testbed
from testbed.hosts.site import SshSite
from testbed.model.flows import parse_spec
from testbed.model.topology import load_topology_dict
from testbed.monitor.sd import parse_listen
from tests.helpers import dumbbell
from tests.hostile_slurm import huge_numbers, other_digits

numbers = st.one_of(st.text(max_size=25), st.text(st.one_of(other_digits, st.sampled_from("0123456789")), max_size=25),
                    huge_numbers)
HOSTILE = ["²", "٣", "７", "1²", "9" * 5000, " 1", "1_0", "+1", "-1"]


@settings(max_examples=500, deadline=None)
@given(text=numbers, digits=st.integers(1, MAX_DIGITS))
@example(text="٣", digits=1)
def test_ascii_int_takes_ascii_digits_of_the_bounded_length_only(text, digits):
    assert ascii_int(text, digits) == (int(text) if re.fullmatch(rf"[0-9]{{1,{digits}}}", text) else None)


@pytest.mark.parametrize("bad", HOSTILE)
def test_the_readers_of_numbers_refuse_what_is_no_ascii_number_by_name(bad):
    with pytest.raises(TestbedError, match="flows"):
        parse_spec(f"w0->w1,flows={bad}")  # ٣ was 3 flows, ² a ValueError
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_listen(f"127.0.0.1:{bad}")
    topo = load_topology_dict(dumbbell())
    with pytest.raises(TestbedError, match="no link"):
        Testbed.find_links(SimpleNamespace(topology=topo, name="db"), f"links[{bad}]")  # type: ignore[arg-type]
    agent = SimpleNamespace(ask=lambda op: {"counters": {f"{bad}/forward": {"bytes": 1}}})
    with pytest.raises(StateError, match="malformed counter key"):
        SshSite.counters(SimpleNamespace(agent=agent, host="h1"), [(0, "forward", None)])  # type: ignore[arg-type]


def test_the_readers_still_take_ascii_numbers():
    assert parse_spec("w0->w1,flows=3").flows == 3 and parse_listen("[::1]:9464") == ("::1", 9464)
    topo = load_topology_dict(dumbbell())
    assert Testbed.find_links(SimpleNamespace(topology=topo, name="db"), "links[2]") == [topo.links[2]]  # type: ignore
    agent = SimpleNamespace(ask=lambda op: {"counters": {"0/forward": {"bytes": 1}}})
    assert SshSite.counters(SimpleNamespace(agent=agent, host="h1"), [(0, "forward", None)]) == {(0, "forward"): {"bytes": 1}}


@pytest.mark.parametrize("columns", ["²", "9" * 5000, "99999999"])
def test_a_columns_or_lines_that_is_no_size_is_left_out(columns):
    """Rich passes what ``isdigit`` takes to ``int``: ``COLUMNS=²`` failed every command at
    import (testbed.cli.render)."""
    env = {**os.environ, "COLUMNS": columns, "LINES": columns}
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "version"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr and r.stdout.strip(), r.stderr[-2000:]
